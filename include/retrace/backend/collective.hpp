// CollectiveGroup: the rendezvous of one group of mesh members (a mesh axis of a MeshDevice).
// SharedMemoryGroup is the transport for the collectives they run on host-visible memory (CPU
// devices in one process); the MPI transport (retrace/mpi.hpp) is another.
//
// Each member's queue runs its part of a collective (a `collective` command, eager or replayed)
// on its own thread. The group pairs the members' calls by order: the c-th collective a member
// runs meets the c-th of every other member. A call goes through two barriers: at the first
// every member has published its buffers (and its queue's work before the collective is done);
// between them each member computes its share, reading its peers' sources; at the second every
// member has finished, so no member's next command can overwrite a source a peer still reads.
//
// A member whose queue failed before a collective still takes part (skip): it arrives without
// buffers, and every member's collective fails with an error naming it. A member that never
// arrives (its trace was replayed alone, its device hangs) makes the others fail after the
// group's timeout; the group is then broken and every later collective on it fails at once.
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/float16.hpp"
#include "retrace/device.hpp"
#include "retrace/kernels.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <memory>
#include <span>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace retrace::detail {

// Element access for sums: floats accumulate in float32 and round once; integers wrap (unsigned
// arithmetic, so overflow is defined).
template <class T>
struct CollectiveSum;
template <>
struct CollectiveSum<float> {
  using acc = float;
  static acc load(const void* p, std::int64_t i) { return static_cast<const float*>(p)[i]; }
  static void store(void* p, std::int64_t i, acc v) { static_cast<float*>(p)[i] = v; }
};
template <class H>  // bfloat16, float16: summed in float, rounded once
struct CollectiveSumHalf {
  using acc = float;
  static acc load(const void* p, std::int64_t i) { return static_cast<const H*>(p)[i].to_float(); }
  static void store(void* p, std::int64_t i, acc v) { static_cast<H*>(p)[i] = H::from_float(v); }
};
template <>
struct CollectiveSum<bfloat16> : CollectiveSumHalf<bfloat16> {};
template <>
struct CollectiveSum<float16> : CollectiveSumHalf<float16> {};
template <class U>
struct CollectiveSumUnsigned {
  using acc = std::conditional_t<sizeof(U) == 8, std::uint64_t, std::uint32_t>;  // wraps
  static acc load(const void* p, std::int64_t i) {
    U v;
    std::memcpy(&v, static_cast<const std::byte*>(p) + i * static_cast<std::int64_t>(sizeof(U)),
                sizeof(U));
    return static_cast<acc>(v);
  }
  static void store(void* p, std::int64_t i, acc v) {
    const auto u = static_cast<U>(v);
    std::memcpy(static_cast<std::byte*>(p) + i * static_cast<std::int64_t>(sizeof(U)), &u,
                sizeof(U));
  }
};
template <>
struct CollectiveSum<std::int32_t> : CollectiveSumUnsigned<std::uint32_t> {};
template <>
struct CollectiveSum<std::uint32_t> : CollectiveSumUnsigned<std::uint32_t> {};
template <>
struct CollectiveSum<std::uint8_t> : CollectiveSumUnsigned<std::uint8_t> {};
template <>
struct CollectiveSum<std::int64_t> : CollectiveSumUnsigned<std::uint64_t> {};

template <class F>
decltype(auto) with_collective_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::bfloat16: return f(bfloat16{});
    case DType::float16: return f(float16{});
    case DType::int32: return f(std::int32_t{});
    case DType::uint32: return f(std::uint32_t{});
    case DType::int64: return f(std::int64_t{});
    case DType::uint8:
    case DType::bool_: return f(std::uint8_t{});
  }
  return f(float{});
}


// Sums `n` equal-length rows in rank order: dst[dst_at + j] = srcs[0][src_at + j] + ... +
// srcs[n-1][src_at + j] for j < count (floats in float32, rounded once; integers wrap). Every
// transport sums with it, so a collective gives the same bits in one process or across many.
void sum_in_rank_order(DType dtype, const void* const* srcs, std::size_t n, std::int64_t src_at,
                       void* dst, std::int64_t dst_at, std::int64_t count);
// Why the members' collectives cannot be paired (they run different ops, dtypes or sizes), or
// "" when `mine` and `theirs` agree.
[[nodiscard]] std::string collective_disagreement(std::string_view me, const CollectiveParams& mine,
                                                  std::string_view them,
                                                  const CollectiveParams& theirs);
[[nodiscard]] std::string_view collective_op_name(CollectiveOp op) noexcept;

// One group of mesh members that run collectives together (the members along one line of a
// mesh axis). The transport (shared memory in one process, MPI across processes) is the
// subclass'; the contract is the same: the c-th collective a member runs meets the c-th of
// every peer; a failure on one member fails the collective on all, naming it.
class CollectiveGroup {
 public:
  // `members` in rank order; `label` names the group in errors ("mesh axis 0 [cpu:0, cpu:1]").
  CollectiveGroup(std::vector<std::string> members, std::string label);
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;
  virtual ~CollectiveGroup() = default;

  [[nodiscard]] std::size_t size() const noexcept { return members_.size(); }
  [[nodiscard]] const std::string& label() const noexcept { return label_; }
  [[nodiscard]] const std::string& member(std::size_t rank) const { return members_[rank]; }

  // This member's part of the collective (called on the member's queue thread). Throws
  // device_error when a peer failed before it, the members disagree on the operation, or the
  // group is broken.
  virtual void run(const CollectiveParams& params) = 0;
  // Takes part without running: this member's queue failed earlier (reason says how).
  virtual void skip(const CollectiveParams& params, std::string_view reason) noexcept = 0;
  // Breaks the group: every collective waiting or still to come fails with `reason`.
  virtual void break_group(std::string reason) noexcept = 0;
  [[nodiscard]] virtual bool broken() const noexcept = 0;

  // Why this transport cannot carry collectives between buffers of `device`, or nullptr when
  // it can. Host transports (shared memory, MPI) need host-visible memory.
  [[nodiscard]] virtual const char* refuses(const Device& device) const noexcept;
  // True for a transport that moves whole buffers only (NCCL): the op rearranges an all_gather
  // or reduce_scatter along a dimension other than the first around it, so every collective it
  // sees has outer == 1.
  [[nodiscard]] virtual bool whole_buffers_only() const noexcept { return false; }
  // The op brackets one collective's enqueues on the members of this group (all from one
  // thread): a transport that must start the members' parts together (NCCL group calls) starts
  // them in end_enqueue, after every member's command was enqueued. cancel_enqueue drops what
  // was staged when an enqueue failed half-way, and says whether nothing of the collective has
  // started on any member (the group then stays usable; otherwise the op breaks it, since
  // members that started would wait for the others).
  virtual void begin_enqueue() {}
  virtual void end_enqueue() {}
  virtual bool cancel_enqueue() noexcept { return false; }

 protected:
  std::vector<std::string> members_;
  std::string label_;
};

// Members in one process, on host-visible memory (CPU devices): they meet in shared memory.
class SharedMemoryGroup final : public CollectiveGroup {
 public:
  // `whole_buffers_only` makes the op rearrange strided gathers and scatters around this group
  // as it does for NCCL (tests check that rearrangement on CPU devices with it).
  SharedMemoryGroup(std::vector<std::string> members, std::string label,
                    std::chrono::milliseconds timeout, bool whole_buffers_only = false);

  void run(const CollectiveParams& params) override;
  void skip(const CollectiveParams& params, std::string_view reason) noexcept override;
  void break_group(std::string reason) noexcept override;
  [[nodiscard]] bool broken() const noexcept override { return broken_.load(); }
  [[nodiscard]] bool whole_buffers_only() const noexcept override { return whole_buffers_; }

 private:
  struct Slot {
    const CollectiveParams* params = nullptr;  // null: the member skips
    std::string skip_reason;
  };

  // Joins the member's next collective with its slot; returns the collective's index.
  std::uint64_t publish(std::uint32_t rank, Slot slot);
  // Arrives at barrier number `target` (a multiple of size()); false if the group broke.
  bool arrive_and_wait(std::uint64_t target, std::uint32_t rank, std::string_view op);
  // Why this collective cannot run (a peer skipped, the members disagree), or "".
  [[nodiscard]] std::string check_slots(std::uint32_t rank) const;
  void compute(const CollectiveParams& params) const;
  [[noreturn]] void fail_broken() const;

  std::chrono::milliseconds timeout_;
  bool whole_buffers_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> arrivals_{0};  // every member's arrivals at every barrier
  std::vector<Slot> slots_;                  // one per rank, stable between the two barriers
  std::unique_ptr<std::atomic<std::uint64_t>[]> joined_;  // per rank: collectives joined
  std::atomic<bool> broken_{false};
  std::string broken_reason_;  // written once, under mutex_, before broken_ is set
};

}  // namespace retrace::detail
