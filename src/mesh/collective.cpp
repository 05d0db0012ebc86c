#include "retrace/backend/collective.hpp"

#include "retrace/backend.hpp"
#include "retrace/bfloat16.hpp"
#include "retrace/error.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RETRACE_COLLECTIVE_RELAX() _mm_pause()
#else
#define RETRACE_COLLECTIVE_RELAX() ((void)0)
#endif

namespace retrace::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string_view op_name(CollectiveOp op) noexcept { return collective_op_name(op); }

}  // namespace

std::string_view collective_op_name(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
  }
  return "collective";
}

std::string collective_disagreement(std::string_view me, const CollectiveParams& mine,
                                    std::string_view them, const CollectiveParams& theirs) {
  if (theirs.op == mine.op && theirs.dtype == mine.dtype && theirs.outer == mine.outer &&
      theirs.chunk == mine.chunk) {
    return {};
  }
  return fmt::format(
      "the members disagree: {} runs {} of {}x{} {} elements, {} runs {} of {}x{} {} "
      "elements (every member must run the same collectives in the same order)",
      me, op_name(mine.op), mine.outer, mine.chunk, mine.dtype, them, op_name(theirs.op),
      theirs.outer, theirs.chunk, theirs.dtype);
}

void sum_in_rank_order(DType dtype, const void* const* srcs, std::size_t n, std::int64_t src_at,
                       void* dst, std::int64_t dst_at, std::int64_t count) {
  with_collective_dtype(dtype, [&]<class T>(T) {
    using S = CollectiveSum<T>;
    constexpr std::int64_t kBlock = 256;
    typename S::acc acc[kBlock];
    for (std::int64_t b = 0; b < count; b += kBlock) {
      const std::int64_t len = std::min(kBlock, count - b);
      for (std::int64_t j = 0; j < len; ++j) acc[j] = S::load(srcs[0], src_at + b + j);
      for (std::size_t q = 1; q < n; ++q) {
        for (std::int64_t j = 0; j < len; ++j) acc[j] += S::load(srcs[q], src_at + b + j);
      }
      for (std::int64_t j = 0; j < len; ++j) S::store(dst, dst_at + b + j, acc[j]);
    }
  });
}

CollectiveGroup::CollectiveGroup(std::vector<std::string> members, std::string label)
    : members_(std::move(members)), label_(std::move(label)) {
  RETRACE_ASSERT(!members_.empty(), "a collective group has members");
}

const char* CollectiveGroup::refuses(const Device& device) const noexcept {
  return device.supports(Capability::host_visible_memory)
             ? nullptr
             : "its memory is not host-visible, and this mesh moves collectives through host "
               "memory";
}

SharedMemoryGroup::SharedMemoryGroup(std::vector<std::string> members, std::string label,
                                     std::chrono::milliseconds timeout,
                                     bool whole_buffers_only)
    : CollectiveGroup(std::move(members), std::move(label)),
      timeout_(timeout),
      whole_buffers_(whole_buffers_only),
      slots_(members_.size()),
      joined_(std::make_unique<std::atomic<std::uint64_t>[]>(members_.size())) {}

std::uint64_t SharedMemoryGroup::publish(std::uint32_t rank, Slot slot) {
  const std::uint64_t index = joined_[rank].fetch_add(1);
  std::lock_guard lock(mutex_);
  slots_[rank] = std::move(slot);
  return index;
}

void SharedMemoryGroup::break_group(std::string reason) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (broken_.load()) return;
    broken_reason_ = std::move(reason);
    broken_.store(true);
  }
  cv_.notify_all();
}

void SharedMemoryGroup::fail_broken() const {
  RETRACE_FAIL(device_error, "{} cannot run collectives any more: {}", label_, broken_reason_);
}

bool SharedMemoryGroup::arrive_and_wait(std::uint64_t target, std::uint32_t rank,
                                      std::string_view op) {
  if (arrivals_.fetch_add(1) + 1 == target) {
    std::lock_guard lock(mutex_);  // pairs with the waiters' check under the lock
    cv_.notify_all();
    return true;
  }
  // Peers usually arrive within microseconds of each other in a replay: spin briefly first.
  const auto spin_until = Clock::now() + std::chrono::microseconds(30);
  for (int i = 0;; ++i) {
    if (arrivals_.load() >= target) return true;
    if (broken_.load()) return false;
    RETRACE_COLLECTIVE_RELAX();
    if ((i & 63) == 63 && Clock::now() >= spin_until) break;
  }
  const auto deadline = Clock::now() + timeout_;
  std::unique_lock lock(mutex_);
  while (arrivals_.load() < target && !broken_.load()) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        arrivals_.load() < target && !broken_.load()) {
      // Name the members that did not arrive: their count of joined collectives is behind.
      const std::uint64_t mine = joined_[rank].load();
      std::string missing;
      for (std::size_t r = 0; r < members_.size(); ++r) {
        if (joined_[r].load() < mine) missing += (missing.empty() ? "" : ", ") + members_[r];
      }
      if (missing.empty()) missing = "a member";
      broken_reason_ = fmt::format(
          "{} on {} waited {} ms for {} to reach collective {} (was a member's trace replayed "
          "without the others', or a member's work stuck?)",
          op, members_[rank], timeout_.count(), missing, mine);
      broken_.store(true);
      cv_.notify_all();
      return false;
    }
  }
  return !broken_.load() || arrivals_.load() >= target;
}

std::string SharedMemoryGroup::check_slots(std::uint32_t rank) const {
  for (std::size_t r = 0; r < slots_.size(); ++r) {
    if (slots_[r].params == nullptr) {
      return fmt::format("{} did not take part: its queue failed before it ({})", members_[r],
                         slots_[r].skip_reason);
    }
  }
  const CollectiveParams& mine = *slots_[rank].params;
  for (std::size_t r = 0; r < slots_.size(); ++r) {
    std::string why = collective_disagreement(members_[rank], mine, members_[r], *slots_[r].params);
    if (!why.empty()) return why;
  }
  return {};
}

void SharedMemoryGroup::run(const CollectiveParams& params) {
  const std::uint32_t rank = params.rank;
  RETRACE_ASSERT(rank < members_.size(), "collective rank in the group");
  if (broken_.load()) fail_broken();
  const std::uint64_t index = publish(rank, Slot{&params, {}});
  const std::uint64_t n = members_.size();
  if (!arrive_and_wait((2 * index + 1) * n, rank, op_name(params.op))) fail_broken();
  const std::string why = check_slots(rank);  // the slots are stable between the barriers
  if (why.empty()) compute(params);
  if (!arrive_and_wait((2 * index + 2) * n, rank, op_name(params.op))) fail_broken();
  RETRACE_CHECK(why.empty(), device_error, "{} on {} ({}): {}", op_name(params.op),
                members_[rank], label_, why);
}

void SharedMemoryGroup::skip(const CollectiveParams& params, std::string_view reason) noexcept {
  const std::uint32_t rank = params.rank;
  if (rank >= members_.size() || broken_.load()) return;
  try {
    const std::uint64_t index = publish(rank, Slot{nullptr, std::string(reason)});
    const std::uint64_t n = members_.size();
    if (!arrive_and_wait((2 * index + 1) * n, rank, op_name(params.op))) return;
    (void)arrive_and_wait((2 * index + 2) * n, rank, op_name(params.op));
  } catch (...) {
    break_group("a member could not record that it skips a collective");
  }
}

void SharedMemoryGroup::compute(const CollectiveParams& params) const {
  const std::int64_t n = static_cast<std::int64_t>(members_.size());
  const std::int64_t rank = params.rank;
  // Every peer published its slot before its arrival at the first barrier, which this member
  // has seen: the reads need no lock, and the slots stay put until the second barrier.
  const auto peer = [this](std::int64_t q) { return slots_[static_cast<std::size_t>(q)].params; };
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(params.dtype));
  switch (params.op) {
    case CollectiveOp::all_gather: {
      // Pull every member's rows into this member's output.
      auto* dst = static_cast<std::byte*>(params.dst);
      const std::int64_t row = params.chunk * elem;
      for (std::int64_t o = 0; o < params.outer; ++o) {
        for (std::int64_t q = 0; q < n; ++q) {
          const auto* src = static_cast<const std::byte*>(peer(q)->src);
          std::memcpy(dst + (o * n + q) * row, src + o * row, static_cast<std::size_t>(row));
        }
      }
      return;
    }
    case CollectiveOp::reduce_scatter: {
      std::vector<const void*> srcs(static_cast<std::size_t>(n));
      for (std::int64_t q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = peer(q)->src;
      for (std::int64_t o = 0; o < params.outer; ++o) {
        sum_in_rank_order(params.dtype, srcs.data(), srcs.size(),
                          o * n * params.chunk + rank * params.chunk, params.dst,
                          o * params.chunk, params.chunk);
      }
      return;
    }
    case CollectiveOp::all_reduce: {
      // Each member sums its share of the elements into its own output, then copies the share
      // to every peer's output.
      const std::int64_t count = params.outer * params.chunk;
      const std::int64_t lo = count / n * rank + std::min(rank, count % n);
      const std::int64_t hi = lo + count / n + (rank < count % n ? 1 : 0);
      std::vector<const void*> srcs(static_cast<std::size_t>(n));
      for (std::int64_t q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = peer(q)->src;
      sum_in_rank_order(params.dtype, srcs.data(), srcs.size(), lo, params.dst, lo, hi - lo);
      const auto* mine = static_cast<const std::byte*>(params.dst) + lo * elem;
      for (std::int64_t q = 0; q < n; ++q) {
        if (q == rank) continue;
        std::memcpy(static_cast<std::byte*>(peer(q)->dst) + lo * elem, mine,
                    static_cast<std::size_t>((hi - lo) * elem));
      }
      return;
    }
  }
}

void run_host_collective(const CollectiveParams& params) {
  static_cast<CollectiveGroup*>(const_cast<void*>(params.group))->run(params);
}

void skip_host_collective(const CollectiveParams& params, std::string_view reason) noexcept {
  static_cast<CollectiveGroup*>(const_cast<void*>(params.group))->skip(params, reason);
}

}  // namespace retrace::detail
