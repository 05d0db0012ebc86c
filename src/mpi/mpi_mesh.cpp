// retrace::mpi: meshes with one member per MPI rank (retrace/mpi.hpp). The collectives of a
// mesh axis run over a communicator of the ranks along it (MpiGroup); gather_to_host and the
// other whole-mesh calls over a duplicate of MPI_COMM_WORLD (MpiProcesses).
#include "retrace/mpi.hpp"

#include "retrace/backend/collective.hpp"
#include "retrace/backend/mesh.hpp"
#include "retrace/error.hpp"
#include "retrace/registry.hpp"
#include "util/cpus.hpp"
#include "util/spin.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace retrace::mpi {

namespace {

using Clock = std::chrono::steady_clock;
using retrace::CollectiveParams;
using retrace::CollectiveOp;

std::string mpi_error(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  MPI_Error_string(code, text.data(), &length);
  return std::string(text.data(), static_cast<std::size_t>(std::max(length, 0)));
}

// Throws device_error naming the MPI call when it failed.
void check_mpi(int code, std::string_view call) {
  RETRACE_CHECK(code == MPI_SUCCESS, device_error, "{} failed: {}", call, mpi_error(code));
}

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

// Waits for a request, polling (so that a rank that never arrives can be given up on): spins
// first, then yields, then sleeps, a little longer each time up to half a millisecond (a rank
// that waits long for a peer computing on the same host, as while rank 0 runs the demo's
// reference, would otherwise wake 50,000 times a second, taking CPU time from that peer). A
// yield that kept the thread off its core for long means the machine is busy (a yield then
// hands the core to another program for a time slice): it sleeps from then on.
// False at the deadline or once `stop` is set (the request stays pending).
bool wait_for(MPI_Request& request, Clock::time_point deadline, std::string_view call,
              const std::atomic<bool>* stop = nullptr) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  auto yield_until = Clock::now() + std::chrono::milliseconds(2);
  auto nap = std::chrono::microseconds(20);
  for (int i = 0;; ++i) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return true;
    if ((i & 15) != 15) continue;
    const auto now = Clock::now();
    if (now >= deadline || (stop != nullptr && stop->load())) return false;
    if (now < spin_until) continue;
    if (now < yield_until) {
      std::this_thread::yield();
      if (Clock::now() - now > util::kDescheduledTurn) yield_until = now;  // busy: sleep now
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(500));
    }
  }
}

int byte_count(std::int64_t bytes, std::string_view what) {
  RETRACE_CHECK(bytes >= 0 && bytes <= INT_MAX, unimplemented,
                "{}: {} bytes per member is more than one MPI call moves here (at most {})",
                what, bytes, INT_MAX);
  return static_cast<int>(bytes);
}

// What each member says about its part of a collective before any values move.
struct Header {
  std::int32_t ok;  // 0: the member's queue failed before the collective (reason says how)
  std::uint8_t op;
  std::uint8_t dtype;
  std::uint8_t pad[2];
  std::int64_t outer;
  std::int64_t chunk;
  char reason[232];
};
static_assert(sizeof(Header) == 256);

// This member's header: `failure` empty when its queue is fine, else why it failed.
Header header_of(const CollectiveParams& params, std::string_view failure) {
  Header h{};
  h.ok = failure.empty() ? 1 : 0;
  h.op = static_cast<std::uint8_t>(params.op);
  h.dtype = static_cast<std::uint8_t>(params.dtype);
  h.outer = params.outer;
  h.chunk = params.chunk;
  if (!failure.empty()) {  // (an empty view's data() may be null)
    std::memcpy(h.reason, failure.data(), std::min(failure.size(), sizeof(h.reason) - 1));
  }
  return h;
}

// The members along one line of a mesh axis, one per rank, over their own communicator.
class MpiGroup final : public detail::CollectiveGroup {
 public:
  MpiGroup(std::vector<std::string> members, std::string label, MPI_Comm comm,
           std::chrono::milliseconds timeout)
      : CollectiveGroup(std::move(members), std::move(label)), comm_(comm), timeout_(timeout) {}
  ~MpiGroup() override {
    if (comm_ != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm_);
  }

  void run(const CollectiveParams& params) override {
    std::lock_guard lock(mutex_);  // the member's queues take turns on the communicator
    if (broken_) fail_broken();
    const std::vector<Header>& all = exchange_headers(params, header_of(params, {}));
    const std::string why = check_headers(params, all);
    RETRACE_CHECK(why.empty(), device_error, "{} on {} ({}): {}",
                  detail::collective_op_name(params.op), members_[params.rank], label_, why);
    move_values(params);
  }

  void skip(const CollectiveParams& params, std::string_view reason) noexcept override {
    try {
      std::lock_guard lock(mutex_);
      if (broken_) return;
      (void)exchange_headers(params, header_of(params, reason.empty() ? "failed" : reason));
    } catch (...) {
      // The group broke (a peer never arrived): nothing more to tell the peers.
    }
  }

  void break_group(std::string reason) noexcept override {
    std::lock_guard lock(reason_mutex_);
    if (broken_) return;
    broken_reason_ = std::move(reason);
    broken_ = true;
  }
  [[nodiscard]] bool broken() const noexcept override { return broken_.load(); }

 private:
  [[noreturn]] void fail_broken() const {
    std::lock_guard lock(reason_mutex_);
    RETRACE_FAIL(device_error, "{} cannot run collectives any more: {}", label_, broken_reason_);
  }

  // Every member's header, in rank order; breaks the group when a peer does not come in time.
  const std::vector<Header>& exchange_headers(const CollectiveParams& params, const Header& mine) {
    // The buffers outlive a request given up on (MPI may still write them): a new pair each
    // time the group breaks, which happens once.
    auto& buffers = *new_buffers_if_abandoned();
    buffers.mine = mine;
    buffers.all.assign(members_.size(), Header{});
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(&buffers.mine, sizeof(Header), MPI_BYTE, buffers.all.data(),
                             sizeof(Header), MPI_BYTE, comm_, &request),
              "MPI_Iallgather");
    if (!wait_for(request, Clock::now() + timeout_, "MPI_Test", &broken_)) {
      abandoned_ = true;  // leave the buffers to the pending request
      break_group(fmt::format(  // no-op when the group was broken (closed) meanwhile
          "{} on {} waited {} ms for the other ranks of {} to reach collective {} (was a "
          "rank's trace replayed without the others', or a rank stuck or gone?)",
          detail::collective_op_name(params.op), members_[params.rank], timeout_.count(),
          label_, collectives_));
      fail_broken();
    }
    ++collectives_;
    return buffers.all;
  }

  std::string check_headers(const CollectiveParams& params, const std::vector<Header>& all) const {
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].ok == 0) {
        const std::string_view reason(all[r].reason, strnlen(all[r].reason, sizeof(all[r].reason)));
        return fmt::format("{} did not take part: its queue failed before it ({})", members_[r],
                           reason);
      }
    }
    for (std::size_t r = 0; r < all.size(); ++r) {
      CollectiveParams theirs = params;
      theirs.op = static_cast<CollectiveOp>(all[r].op);
      theirs.dtype = static_cast<DType>(all[r].dtype);
      theirs.outer = all[r].outer;
      theirs.chunk = all[r].chunk;
      std::string why =
          detail::collective_disagreement(members_[params.rank], params, members_[r], theirs);
      if (!why.empty()) return why;
    }
    return {};
  }

  // The values: every member's contribution gathered (or its parts sent where they are
  // summed), then summed in rank order on each member.
  void move_values(const CollectiveParams& params) {
    const std::size_t n = members_.size();
    const auto elem = static_cast<std::int64_t>(dtype_size(params.dtype));
    const std::int64_t count = params.outer * params.chunk;  // elements a member contributes
    const std::string_view name = detail::collective_op_name(params.op);
    const int bytes = byte_count(count * elem, name);
    const auto* src = static_cast<const std::byte*>(params.src);
    auto* dst = static_cast<std::byte*>(params.dst);
    MPI_Request request = MPI_REQUEST_NULL;
    const auto finish = [&] {
      // The header exchange showed every member here: only a failing rank keeps this waiting,
      // and MPI ends the job then.
      (void)wait_for(request, Clock::time_point::max(), "MPI_Test");
    };
    switch (params.op) {
      case CollectiveOp::all_gather: {
        if (params.outer == 1) {
          check_mpi(MPI_Iallgather(src, bytes, MPI_BYTE, dst, bytes, MPI_BYTE, comm_, &request),
                    "MPI_Iallgather");
          finish();
          return;
        }
        scratch_.resize(n * static_cast<std::size_t>(bytes));
        check_mpi(MPI_Iallgather(src, bytes, MPI_BYTE, scratch_.data(), bytes, MPI_BYTE, comm_,
                                 &request),
                  "MPI_Iallgather");
        finish();
        const std::int64_t row = params.chunk * elem;
        for (std::int64_t o = 0; o < params.outer; ++o) {
          for (std::size_t q = 0; q < n; ++q) {
            std::memcpy(dst + (o * static_cast<std::int64_t>(n) + static_cast<std::int64_t>(q)) * row,
                        scratch_.data() + q * static_cast<std::size_t>(bytes) +
                            static_cast<std::size_t>(o * row),
                        static_cast<std::size_t>(row));
          }
        }
        return;
      }
      case CollectiveOp::all_reduce: {
        scratch_.resize(n * static_cast<std::size_t>(bytes));
        check_mpi(MPI_Iallgather(src, bytes, MPI_BYTE, scratch_.data(), bytes, MPI_BYTE, comm_,
                                 &request),
                  "MPI_Iallgather");
        finish();
        sum_parts(params.dtype, n, static_cast<std::size_t>(bytes), dst, count);
        return;
      }
      case CollectiveOp::reduce_scatter: {
        // src is [outer, n, chunk]: member q gets [outer, chunk] from each member, packed.
        const std::int64_t row = params.chunk * elem;
        send_.resize(n * static_cast<std::size_t>(bytes));
        for (std::size_t q = 0; q < n; ++q) {
          for (std::int64_t o = 0; o < params.outer; ++o) {
            std::memcpy(send_.data() + q * static_cast<std::size_t>(bytes) +
                            static_cast<std::size_t>(o * row),
                        src + (o * static_cast<std::int64_t>(n) + static_cast<std::int64_t>(q)) * row,
                        static_cast<std::size_t>(row));
          }
        }
        scratch_.resize(n * static_cast<std::size_t>(bytes));
        check_mpi(MPI_Ialltoall(send_.data(), bytes, MPI_BYTE, scratch_.data(), bytes, MPI_BYTE,
                                comm_, &request),
                  "MPI_Ialltoall");
        finish();
        sum_parts(params.dtype, n, static_cast<std::size_t>(bytes), dst, count);
        return;
      }
    }
  }

  // dst[j] = scratch[0][j] + ... + scratch[n-1][j], rows of `bytes` bytes.
  void sum_parts(DType dtype, std::size_t n, std::size_t bytes, void* dst, std::int64_t count) {
    std::vector<const void*> parts(n);
    for (std::size_t q = 0; q < n; ++q) parts[q] = scratch_.data() + q * bytes;
    detail::sum_in_rank_order(dtype, parts.data(), n, 0, dst, 0, count);
  }

  struct HeaderBuffers {
    Header mine{};
    std::vector<Header> all;
  };
  HeaderBuffers* new_buffers_if_abandoned() {
    if (abandoned_ || !headers_) {
      // A request given up on may still write the old pair: it is left to it (a leak of 256
      // bytes per member, once per broken group).
      (void)headers_.release();
      headers_ = std::make_unique<HeaderBuffers>();
      abandoned_ = false;
    }
    return headers_.get();
  }

  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::unique_ptr<HeaderBuffers> headers_;
  bool abandoned_ = false;
  std::uint64_t collectives_ = 0;
  std::vector<std::byte> scratch_, send_;
  std::atomic<bool> broken_{false};
  mutable std::mutex reason_mutex_;
  std::string broken_reason_;
};

// The ranks of a mesh as a whole, over a duplicate of MPI_COMM_WORLD.
class MpiProcesses final : public detail::MeshProcesses {
 public:
  explicit MpiProcesses(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiProcesses() override { close(); }

  std::vector<std::byte> all_gather_members(std::span<const std::byte> local,
                                            std::size_t bytes) override {
    RETRACE_CHECK(local.size() == bytes, invalid_argument,
                  "gather_shards: one member per rank expected");
    const int count = byte_count(static_cast<std::int64_t>(bytes), "gather_shards");
    std::vector<std::byte> all(bytes * static_cast<std::size_t>(size_) + 1);
    // Nonblocking, and waited for as the collectives are: a rank that waits here for a rank
    // still computing yields its CPU instead of busy-polling it (MPI's blocking calls spin).
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(local.data(), count, MPI_BYTE, all.data(), count, MPI_BYTE, comm_,
                             &request),
              "MPI_Iallgather");
    (void)wait_for(request, Clock::time_point::max(), "MPI_Test");
    all.pop_back();
    return all;
  }
  bool all_true(bool value) override {
    int mine = value ? 1 : 0, all = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm_, &request),
              "MPI_Iallreduce");
    (void)wait_for(request, Clock::time_point::max(), "MPI_Test");
    return all != 0;
  }
  [[nodiscard]] std::string describe() const override {
    return fmt::format("rank {} of {}", rank_, size_);
  }
  void close() noexcept override {
    if (comm_ != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

std::once_flag g_finalize_once;

void require_initialized(std::string_view what) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  RETRACE_CHECK(initialized != 0 && !finalized(), failed_precondition,
                "{}: MPI is not initialised (call retrace::mpi::init first)", what);
}

}  // namespace

bool launched() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                           "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

void init(int* argc, char*** argv) {
  RETRACE_CHECK(!finalized(), failed_precondition, "retrace::mpi::init: MPI was finalised");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (initialized == 0) {
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::call_once(g_finalize_once, [] {
      std::atexit([] {
        if (!finalized()) MPI_Finalize();
      });
    });
  } else {
    MPI_Query_thread(&provided);
  }
  RETRACE_CHECK(provided >= MPI_THREAD_MULTIPLE, failed_precondition,
                "retrace::mpi::init: the MPI library provides thread level {}, but meshes need "
                "MPI_THREAD_MULTIPLE ({}): the collectives run on the members' queue threads",
                provided, MPI_THREAD_MULTIPLE);
}

int world_rank() {
  require_initialized("retrace::mpi::world_rank");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  require_initialized("retrace::mpi::world_size");
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::unique_ptr<MeshDevice> open_mesh(std::string_view backend, std::vector<std::size_t> shape,
                                      std::optional<DeviceOptions> member_options,
                                      MeshOptions options, std::uint32_t first_id) {
  init();
  const auto ranks = static_cast<std::size_t>(world_size());
  const auto rank = static_cast<std::size_t>(world_rank());
  if (shape.empty()) shape = {ranks};
  std::size_t count = 1;
  for (std::size_t e : shape) count *= e;
  RETRACE_CHECK(!shape.empty() && shape.size() <= 2 && count == ranks, invalid_argument,
                "retrace::mpi::open_mesh: a mesh of shape [{}] needs {} ranks (one member per "
                "rank), but MPI_COMM_WORLD has {}",
                fmt::join(shape, ", "), count, ranks);
  RETRACE_CHECK(options.collective_timeout.count() > 0, invalid_argument,
                "retrace::mpi::open_mesh: collective_timeout must be positive");

  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  auto processes = std::make_unique<MpiProcesses>(world);

  // This rank's member, opened here; every rank learns whether every rank managed.
  std::unique_ptr<Device> device;
  std::string failure;
  // The ranks on this host, and this rank's place among them.
  int on_node = 1, node_rank = 0;
  {
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, static_cast<int>(rank),
                                  MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    MPI_Comm_size(node, &on_node);
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_free(&node);
  }
  try {
    // A GPU backend's device number is the GPU: the k-th rank on a host takes its k-th GPU.
    const bool per_host = backend == "cuda";
    const std::uint32_t n = first_id + static_cast<std::uint32_t>(
                                           per_host ? static_cast<std::size_t>(node_rank) : rank);
    const std::string spec = fmt::format("{}:{}", backend, n);
    DeviceOptions settings = member_options ? *member_options : default_device_options(spec);
    if (!member_options) {
      // The host's CPUs shared among the ranks on it, and no more than this rank may run on
      // (mpirun binds each rank to a core by default for up to 2 ranks).
      const unsigned share = util::host_cpus() / static_cast<unsigned>(std::max(on_node, 1));
      settings.kernel_threads = std::max(1u, std::min(share, util::usable_cpus()));
    }
    settings.id = DeviceId{n};
    device = open_device(spec, settings);
  } catch (const Error& e) {
    failure = e.what();
  }
  if (!processes->all_true(failure.empty())) {
    RETRACE_CHECK(failure.empty(), failed_precondition,
                  "retrace::mpi::open_mesh: rank {} could not open its member: {}", rank, failure);
    RETRACE_FAIL(failed_precondition,
                 "retrace::mpi::open_mesh: another rank could not open its member (its error "
                 "says why)");
  }

  // Every member's name, "cpu:1@rank1".
  constexpr std::size_t kName = 64;
  std::array<char, kName> mine{};
  const std::string my_name = fmt::format("{}@rank{}", device->name(), rank);
  std::memcpy(mine.data(), my_name.data(), std::min(my_name.size(), kName - 1));
  const std::vector<std::byte> names_bytes = processes->all_gather_members(
      std::as_bytes(std::span<const char>(mine.data(), kName)), kName);
  std::vector<std::string> names;
  for (std::size_t r = 0; r < ranks; ++r) {
    const char* at = reinterpret_cast<const char*>(names_bytes.data()) + r * kName;
    names.emplace_back(at, strnlen(at, kName));
  }

  // One communicator per axis: the ranks along this rank's line of it, ordered along it. Every
  // rank makes the same calls in the same (axis) order.
  std::vector<std::unique_ptr<Device>> members;
  members.push_back(std::move(device));
  const auto timeout = options.collective_timeout;
  auto state = detail::make_mesh_state(
      std::move(members), {rank}, std::move(names), std::move(shape), options,
      [&](detail::MeshLine line) -> std::unique_ptr<detail::CollectiveGroup> {
        // Ordered by this rank's coordinate along the axis.
        MPI_Comm comm = MPI_COMM_NULL;
        check_mpi(MPI_Comm_split(world, static_cast<int>(line.index),
                                 static_cast<int>(line.ranks.front()), &comm),
                  "MPI_Comm_split");
        // A member whose memory the host cannot reach meets its peers through its backend's
        // transport (CUDA: NCCL, its id sent over the line's communicator), if it has one.
        if (const auto* transport = detail::device_transport(line.members)) {
          line.broadcast = [comm](std::span<std::byte> bytes) {
            check_mpi(MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, comm),
                      "MPI_Bcast");
          };
          std::unique_ptr<detail::CollectiveGroup> group;
          try {
            group = (*transport)(std::move(line), options);
          } catch (...) {
            MPI_Comm_free(&comm);
            throw;
          }
          MPI_Comm_free(&comm);
          return group;
        }
        return std::make_unique<MpiGroup>(std::move(line.names), std::move(line.label), comm,
                                          timeout);
      },
      std::move(processes), "mpi mesh");
  return std::make_unique<MeshDevice>(std::move(state));
}

}  // namespace retrace::mpi
