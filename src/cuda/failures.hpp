// Failure records of the CUDA backend: a device-side record per queue and per trace (a failing
// kernel, assert_finite, fills it and sets a host-mapped flag), and the table of "sites" that
// turns a record back into a message naming the op, the queue and the command.
#pragma once

#include "cuda/launch.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace retrace::cuda {

// One failure record (device memory) with its host-mapped flag.
struct Domain {
  FailureRecord* record = nullptr;  // device
  unsigned int* flag = nullptr;     // host view of the mapped flag
  unsigned int* flag_device = nullptr;

  [[nodiscard]] bool failed() const noexcept {
    return *reinterpret_cast<volatile const unsigned int*>(flag) != 0u;
  }
};

// Domains handed out from slabs of records and flags; thread-safe.
class DomainPool {
 public:
  DomainPool() = default;
  DomainPool(const DomainPool&) = delete;
  DomainPool& operator=(const DomainPool&) = delete;
  ~DomainPool();

  [[nodiscard]] Domain take();
  // The record must already be clear (fresh, or cleared after a reported failure).
  void give_back(const Domain& domain) noexcept;

 private:
  static constexpr std::size_t kSlab = 256;
  void grow();

  std::mutex mutex_;
  std::vector<void*> record_slabs_;
  std::vector<void*> flag_slabs_;
  std::vector<Domain> free_;
};

// Where a command that can fail was enqueued.
struct Site {
  const char* op;
  std::int64_t count;
  std::uint64_t trace;  // 0: eager
  std::size_t command;
  std::size_t trace_commands;  // commands of the trace, once known (0 while capturing)
  std::int64_t index_limit = 0;  // a gather's indexed size (its record holds an int32 index)
  // A collective's group and its members in rank order (its record holds the rank of the
  // member that failed before it).
  std::string group_label{};
  std::vector<std::string> members{};
};

class SiteTable {
 public:
  // The id kernels report (1-based); equal sites share an id.
  [[nodiscard]] unsigned int add(const Site& site);
  void set_trace_commands(std::uint64_t trace, std::size_t commands);
  [[nodiscard]] Site find(unsigned int id) const;

 private:
  mutable std::mutex mutex_;
  std::vector<Site> sites_;
  std::map<std::tuple<const char*, std::int64_t, std::uint64_t, std::size_t>, unsigned int> ids_;
};

// "op 'assert_finite' failed on queue 0 of cuda:0 (eager): element 1 of 3 is nan", or for a
// gather "... index element 4 is 12, outside [0, 10) ...". Reads the
// record with a synchronous copy (the queue has drained).
[[nodiscard]] std::string describe_failure(const std::string& queue_label, const Domain& domain,
                                           const SiteTable& sites);

}  // namespace retrace::cuda
