#include "cuda/failures.hpp"

#include "cuda/check.hpp"
#include "cuda/relaxed.hpp"

#include <bit>
#include <cstring>

namespace retrace::cuda {

DomainPool::~DomainPool() {
  for (void* slab : record_slabs_) RETRACE_CUDA_WARN(cudaFree(slab));
  for (void* slab : flag_slabs_) RETRACE_CUDA_WARN(cudaFreeHost(slab));
}

Domain DomainPool::take() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) grow();
  Domain domain = free_.back();
  free_.pop_back();
  return domain;
}

void DomainPool::give_back(const Domain& domain) noexcept {
  std::lock_guard lock(mutex_);
  free_.push_back(domain);
}

void DomainPool::grow() {
  RelaxedCapture relaxed;
  void* records = nullptr;
  RETRACE_CUDA_CHECK(cudaMalloc(&records, kSlab * sizeof(FailureRecord)),
                     "allocating failure records");
  void* flags = nullptr;
  if (const cudaError_t e = cudaHostAlloc(&flags, kSlab * sizeof(unsigned int),
                                          cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess) {
    RETRACE_CUDA_WARN(cudaFree(records));
    RETRACE_CUDA_CHECK(e, "allocating mapped failure flags");
  }
  void* flags_device = nullptr;
  const std::vector<FailureRecord> clear(kSlab, FailureRecord{0u, 0u, ~0ULL});
  cudaError_t e = cudaHostGetDevicePointer(&flags_device, flags, 0);
  if (e == cudaSuccess) {
    e = cudaMemcpy(records, clear.data(), kSlab * sizeof(FailureRecord), cudaMemcpyHostToDevice);
  }
  if (e != cudaSuccess) {
    RETRACE_CUDA_WARN(cudaFree(records));
    RETRACE_CUDA_WARN(cudaFreeHost(flags));
    RETRACE_CUDA_CHECK(e, "preparing failure records");
  }
  std::memset(flags, 0, kSlab * sizeof(unsigned int));
  record_slabs_.push_back(records);
  flag_slabs_.push_back(flags);
  for (std::size_t i = 0; i < kSlab; ++i) {
    free_.push_back(Domain{static_cast<FailureRecord*>(records) + i,
                           static_cast<unsigned int*>(flags) + i,
                           static_cast<unsigned int*>(flags_device) + i});
  }
}

unsigned int SiteTable::add(const Site& site) {
  std::lock_guard lock(mutex_);
  const auto key = std::make_tuple(site.op, site.count, site.trace, site.command);
  auto [it, inserted] = ids_.try_emplace(key, 0u);
  if (inserted) {
    sites_.push_back(site);
    it->second = static_cast<unsigned int>(sites_.size());
  }
  return it->second;
}

void SiteTable::set_trace_commands(std::uint64_t trace, std::size_t commands) {
  std::lock_guard lock(mutex_);
  for (Site& site : sites_) {
    if (site.trace == trace) site.trace_commands = commands;
  }
}

Site SiteTable::find(unsigned int id) const {
  std::lock_guard lock(mutex_);
  if (id >= 1 && id <= sites_.size()) return sites_[id - 1];
  return Site{"assert_finite", 0, 0, 0, 0};
}

std::string describe_failure(const std::string& queue_label, const Domain& domain,
                             const SiteTable& sites) {
  FailureRecord record{};
  if (const cudaError_t e = cudaMemcpy(&record, domain.record, sizeof record,
                                       cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    clear_last_error();
    return fmt::format("a command failed on {} (its failure record could not be read: {})",
                       queue_label, describe(e));
  }
  const Site site = sites.find(record.site != 0 ? record.site : *domain.flag);
  const std::string where =
      site.trace == 0 ? std::string("eager")
                      : fmt::format("command {} of {} in trace {}", site.command,
                                    site.trace_commands, site.trace);
  const auto index = static_cast<std::int64_t>(record.element >> 32);
  if (!site.members.empty()) {
    const auto rank = static_cast<std::size_t>(index);
    const std::string who = rank < site.members.size() ? site.members[rank]
                                                       : fmt::format("rank {}", rank);
    return fmt::format("op '{}' failed on {} ({}): member {} of {} failed before it (its own "
                       "error is reported by that member)",
                       site.op, queue_label, where, who, site.group_label);
  }
  if (site.index_limit > 0) {
    const auto bad = std::bit_cast<std::int32_t>(static_cast<std::uint32_t>(record.element));
    return fmt::format("op '{}' failed on {} ({}): index element {} is {}, outside [0, {}) (the "
                       "size of the indexed dimension)",
                       site.op, queue_label, where, index, bad, site.index_limit);
  }
  const float value = std::bit_cast<float>(static_cast<std::uint32_t>(record.element));
  return fmt::format("op '{}' failed on {} ({}): element {} of {} is {}", site.op, queue_label,
                     where, index, site.count, value);
}

}  // namespace retrace::cuda
