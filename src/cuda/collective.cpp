// NCCL groups: the collectives of mesh lines whose members are CUDA devices (see
// cuda/collective.hpp). Built without NCCL, such lines refuse collectives with a reason.
#include "cuda/collective.hpp"

#include "retrace/backend/collective.hpp"
#include "retrace/backend/mesh.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/relaxed.hpp"
#include "retrace/backend.hpp"
#include "retrace/log.hpp"

#if RETRACE_HAVE_NCCL
#include <nccl.h>
#endif

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <span>
#include <atomic>
#include <mutex>
#include <optional>

namespace retrace::cuda {

namespace {

#if RETRACE_HAVE_NCCL

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = fmt::format("{} ({})", ncclGetErrorString(result), static_cast<int>(result));
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') {
    text += fmt::format(": {}", last);
  }
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return ncclFloat32;
    case DType::bfloat16:
      return ncclBfloat16;
    case DType::float16:
      return ncclFloat16;
    case DType::int32:
      return ncclInt32;
    case DType::uint32:
      return ncclUint32;
    case DType::int64:
      return ncclInt64;
    case DType::uint8:
    case DType::bool_:
      return ncclUint8;  // sums wrap, as on the host transports
  }
  return ncclFloat32;
}

// Restores the calling thread's current GPU (NCCL and our launches switch it).
class CurrentDevice {
 public:
  CurrentDevice() noexcept { ok_ = cudaGetDevice(&ordinal_) == cudaSuccess; }
  ~CurrentDevice() {
    if (ok_) RETRACE_CUDA_WARN(cudaSetDevice(ordinal_));
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int ordinal_ = 0;
  bool ok_ = false;
};

#endif  // RETRACE_HAVE_NCCL

// One line of CUDA members: an NCCL communicator per member (rank = position along the axis)
// held in this process; in one process every member of the line, across processes (MPI) the
// ones of this process. A line that cannot run collectives (NCCL missing from the build, two
// members on one GPU, a failed initialisation) still makes a mesh: its collectives are refused
// with the reason.
class NcclGroup final : public detail::CollectiveGroup {
 public:
  // `ranks` and `ordinals`: this process' members of the line (their rank, their GPU).
  NcclGroup(std::vector<std::string> names, std::string label, std::vector<std::uint32_t> ranks,
            const std::vector<int>& ordinals,
            const std::function<void(std::span<std::byte>)>& broadcast)
      : CollectiveGroup(std::move(names), std::move(label)),
        local_(std::move(ranks)),
        ordinals_(members_.size(), -1) {
    staged_.resize(members_.size());
    for (std::size_t i = 0; i < local_.size(); ++i) ordinals_[local_[i]] = ordinals[i];
#if RETRACE_HAVE_NCCL
    for (std::size_t i = 0; i < local_.size() && refusal_.empty(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (ordinals[i] == ordinals[j]) {
          refusal_ = fmt::format("NCCL needs a GPU per member, and {} and {} both use GPU {}",
                                 members_[local_[j]], members_[local_[i]], ordinals[i]);
          break;
        }
      }
    }
    comms_.assign(members_.size(), nullptr);
    const CurrentDevice keep;
    RelaxedCapture relaxed;
    ncclResult_t r = ncclSuccess;
    if (!broadcast) {  // the whole line is in this process
      if (!refusal_.empty()) return;
      r = ncclCommInitAll(comms_.data(), static_cast<int>(comms_.size()), ordinals.data());
    } else {
      // The process of rank 0 makes the line's NCCL id; a leading byte says whether it could.
      // Every process of the line takes part in the broadcast, even one that refuses.
      std::array<std::byte, 1 + sizeof(ncclUniqueId)> message{};
      if (std::find(local_.begin(), local_.end(), 0u) != local_.end()) {
        ncclUniqueId id{};
        if (ncclGetUniqueId(&id) == ncclSuccess) {
          message[0] = std::byte{1};
          std::memcpy(message.data() + 1, &id, sizeof id);
        }
      }
      broadcast(message);
      if (!refusal_.empty()) return;
      if (message[0] != std::byte{1}) {
        refusal_ = fmt::format("the process of {} could not make an NCCL id", members_[0]);
        return;
      }
      ncclUniqueId id{};
      std::memcpy(&id, message.data() + 1, sizeof id);
      r = ncclGroupStart();
      for (std::size_t i = 0; i < local_.size() && r == ncclSuccess; ++i) {
        if (cudaSetDevice(ordinals[i]) != cudaSuccess) {
          clear_last_error();
          r = ncclUnhandledCudaError;
          break;
        }
        r = ncclCommInitRank(&comms_[local_[i]], static_cast<int>(members_.size()), id,
                             static_cast<int>(local_[i]));
      }
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
    }
    if (r != ncclSuccess) {
      refusal_ = fmt::format("NCCL could not connect its members: {}", nccl_text(r, nullptr));
      for (ncclComm_t& comm : comms_) {
        if (comm != nullptr) (void)ncclCommDestroy(comm);
        comm = nullptr;
      }
      log(LogLevel::warning, "{}: {}", label_, refusal_);
    }
#else
    (void)ordinals;
    (void)broadcast;
    refusal_ = "this build of retrace has no NCCL (it was not found when retrace was built)";
#endif
  }

  ~NcclGroup() override {
#if RETRACE_HAVE_NCCL
    // The members were closed first: their queues drained and their traces released. NCCL
    // waits in ncclCommDestroy until no CUDA graph uses the communicator, so the order matters.
    const CurrentDevice keep;
    for (ncclComm_t comm : comms_) {
      if (comm == nullptr) continue;
      if (const ncclResult_t r = ncclCommDestroy(comm); r != ncclSuccess) {
        log(LogLevel::warning, "{}: destroying an NCCL communicator: {}", label_,
            nccl_text(r, nullptr));
      }
    }
#endif
  }

  void run(const CollectiveParams&) override {
    RETRACE_FAIL(unimplemented, "{}: CUDA members run collectives through NCCL, not on the host",
                 label_);
  }
  void skip(const CollectiveParams&, std::string_view) noexcept override {}
  void break_group(std::string reason) noexcept override {
    std::lock_guard lock(broken_mutex_);
    if (broken_.load()) return;
    broken_reason_ = std::move(reason);
    broken_.store(true);
  }
  [[nodiscard]] bool broken() const noexcept override {
    return broken_.load();
  }

  [[nodiscard]] const char* refuses(const Device& device) const noexcept override {
    (void)device;  // a CUDA member: NCCL groups are made for lines of CUDA devices only
    return refusal_.empty() ? nullptr : refusal_.c_str();
  }
  [[nodiscard]] bool whole_buffers_only() const noexcept override {
    return true;
  }

  void begin_enqueue() override {
    std::unique_lock lock(enqueue_mutex_);
    if (broken_.load()) {
      std::lock_guard broken_lock(broken_mutex_);
      RETRACE_FAIL(device_error, "{} cannot run collectives any more: {}", label_, broken_reason_);
    }
    std::fill(staged_.begin(), staged_.end(), std::nullopt);
    enqueue_lock_ = std::move(lock);
    staging_.store(true);
  }

  // Nothing starts before end_enqueue: a cancelled collective leaves the group usable.
  bool cancel_enqueue() noexcept override {
    if (!enqueue_lock_.owns_lock()) return true;
    std::fill(staged_.begin(), staged_.end(), std::nullopt);
    staging_.store(false);
    enqueue_lock_.unlock();
    return true;
  }

  void end_enqueue() override {
    RETRACE_ASSERT(enqueue_lock_.owns_lock(), "end_enqueue follows begin_enqueue");
    const std::size_t missing = static_cast<std::size_t>(std::count_if(
        local_.begin(), local_.end(), [&](std::uint32_t r) { return !staged_[r]; }));
    RETRACE_CHECK(missing == 0, failed_precondition,
                  "{}: {} of this process' {} members did not enqueue their part of the "
                  "collective",
                  label_, missing, local_.size());
#if RETRACE_HAVE_NCCL
    start();
#endif
    (void)cancel_enqueue();  // clears and unlocks
  }

  [[nodiscard]] const char* unsupported_reason(const CollectiveParams& p) const noexcept {
    if (!refusal_.empty()) return "collectives on this mesh line (see the mesh's refusal)";
    if (p.rank >= staged_.size() || ordinals_[p.rank] < 0) {
      return "a collective rank outside this process' part of its group";
    }
    if (!staging_.load()) {
      return "collectives enqueued outside ops::all_reduce, all_gather and reduce_scatter";
    }
    if (p.op != CollectiveOp::all_reduce && p.outer != 1) {
      return "gathers and scatters of strided blocks (NCCL moves whole buffers)";
    }
    return nullptr;
  }

  cudaError_t stage(const CollectiveParams& p, const LaunchContext& ctx) {
    auto* word = static_cast<unsigned int*>(ctx.scratch);
    if (const cudaError_t e = launch_failure_word(ctx, word, p.rank + 1u); e != cudaSuccess) {
      return e;
    }
    staged_[p.rank] = Part{p, ctx, word};
    return cudaSuccess;
  }

 private:
  struct Part {
    CollectiveParams params;
    LaunchContext ctx;
    unsigned int* word;
  };

#if RETRACE_HAVE_NCCL
  void nccl_check(ncclResult_t r, std::size_t rank, std::string_view what) const {
    if (r == ncclSuccess) return;
    RETRACE_FAIL(device_error, "{} on {} (NCCL rank {} of {}): {}", what, members_[rank], rank,
                 label_, nccl_text(r, comms_[rank]));
  }

  // Issues every member's part: the failure words' maximum, the adoption of a peer's failure,
  // then the collective.
  void start() {
    const CurrentDevice keep;
    RelaxedCapture relaxed;
    const std::uint32_t first = local_.front();
    nccl_check(ncclGroupStart(), first, "starting an NCCL group");
    for (const std::uint32_t r : local_) {
      const Part& part = *staged_[r];
      const ncclResult_t e =
          ncclAllReduce(part.word, part.word, 1, ncclUint32, ncclMax, comms_[r], part.ctx.stream);
      if (e != ncclSuccess) {
        (void)ncclGroupEnd();
        nccl_check(e, r, "exchanging failure states");
      }
    }
    nccl_check(ncclGroupEnd(), first, "exchanging failure states");
    for (const std::uint32_t r : local_) {
      const Part& part = *staged_[r];
      RETRACE_CUDA_CHECK(cudaSetDevice(ordinals_[r]), "{}: selecting GPU {}", label_, ordinals_[r]);
      RETRACE_CUDA_CHECK(launch_adopt_peer_failure(part.ctx, part.word),
                         "{}: launching the failure exchange on {}", label_, members_[r]);
    }
    nccl_check(ncclGroupStart(), first, "starting an NCCL group");
    for (const std::uint32_t r : local_) {
      const Part& part = *staged_[r];
      const CollectiveParams& p = part.params;
      const ncclDataType_t type = nccl_type(p.dtype);
      const auto count = static_cast<std::size_t>(p.outer * p.chunk);
      ncclResult_t e = ncclSuccess;
      switch (p.op) {
        case CollectiveOp::all_reduce:
          e = ncclAllReduce(p.src, p.dst, count, type, ncclSum, comms_[r], part.ctx.stream);
          break;
        case CollectiveOp::all_gather:
          e = ncclAllGather(p.src, p.dst, count, type, comms_[r], part.ctx.stream);
          break;
        case CollectiveOp::reduce_scatter:
          e = ncclReduceScatter(p.src, p.dst, count, type, ncclSum, comms_[r], part.ctx.stream);
          break;
      }
      if (e != ncclSuccess) {
        (void)ncclGroupEnd();
        nccl_check(e, r, detail::collective_op_name(p.op));
      }
    }
    nccl_check(ncclGroupEnd(), first, detail::collective_op_name(staged_[first]->params.op));
  }

  std::vector<ncclComm_t> comms_;
#endif

  std::vector<std::uint32_t> local_;  // the ranks of this process' members
  std::vector<int> ordinals_;         // per rank: its GPU, -1 in another process
  std::string refusal_;       // why this line cannot run collectives; "" when it can
  std::mutex enqueue_mutex_;  // one collective enqueued at a time
  std::unique_lock<std::mutex> enqueue_lock_;
  std::atomic<bool> staging_{false};
  std::vector<std::optional<Part>> staged_;  // per rank, between begin and end_enqueue
  std::mutex broken_mutex_;
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
};

const NcclGroup* nccl_group(const CollectiveParams& p) noexcept {
  return dynamic_cast<const NcclGroup*>(static_cast<const detail::CollectiveGroup*>(p.group));
}

}  // namespace

const char* collective_unsupported_reason(const CollectiveParams& p) noexcept {
  const NcclGroup* group = nccl_group(p);
  if (group == nullptr) return "collectives through host memory (CUDA members meet through NCCL)";
  return group->unsupported_reason(p);
}

cudaError_t stage_collective(const CollectiveParams& p, const LaunchContext& ctx) {
  // unsupported_reason let it through: the group is an NcclGroup, staging, rank in range.
  return const_cast<NcclGroup*>(nccl_group(p))->stage(p, ctx);
}

CollectiveSiteInfo collective_site_info(const CollectiveParams& p) {
  const auto* group = static_cast<const detail::CollectiveGroup*>(p.group);
  CollectiveSiteInfo info{group->label(), {}};
  for (std::size_t r = 0; r < group->size(); ++r) info.members.push_back(group->member(r));
  return info;
}

void register_nccl_transport() {
  detail::register_collective_transport(
      "cuda",
      [](detail::MeshLine line,
         const MeshOptions&) -> std::unique_ptr<detail::CollectiveGroup> {
        std::vector<int> ordinals;
        for (Device* d : line.members) {
          auto* backend = backend_of<CudaBackend>(*d);
          RETRACE_CHECK(backend != nullptr, invalid_argument,
                        "MeshDevice: {} is not a CUDA device", d->name());
          ordinals.push_back(backend->ordinal());
        }
        return std::make_unique<NcclGroup>(std::move(line.names), std::move(line.label),
                                           std::move(line.ranks), ordinals, line.broadcast);
      });
}

}  // namespace retrace::cuda
