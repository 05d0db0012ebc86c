// Mesh devices: several devices used as one, with tensors split or copied across them and
// collectives (all_reduce, all_gather, reduce_scatter) between them that run eagerly and are
// captured into each member's trace like any other op.
//
//   auto mesh = retrace::MeshDevice::open("cpu", {2});          // two CPU devices, 1-D mesh
//   auto x = retrace::distribute(host, *mesh, {retrace::Placement::shard(1)});
//   auto w = retrace::distribute(weight, *mesh, {retrace::Placement::shard(1)});
//   // each member multiplies its slice of the features: partial sums of the full product
//   auto y = retrace::mesh_map({retrace::Placement::partial()},
//                              [](const Tensor& xs, const Tensor& ws) {
//                                return retrace::ops::matmul(xs, ws, retrace::ops::Transpose::no,
//                                                            retrace::ops::Transpose::yes);
//                              }, x, w);
//   auto sum = retrace::ops::all_reduce(y);                      // replicated on every member
//   retrace::Tensor result = retrace::gather_to_host(sum);
//
// A MeshDevice owns its members (closing the mesh closes them). It is a list of devices
// wherever one is accepted: a Tracer over mesh->devices() captures one trace per member, and the
// collectives in the traced function are replayed with the rest. A MeshTensor is a tree
// (retrace/tree.hpp), so it can be a traced function's input or output.
//
// Placements, one per mesh axis: replicated (every member along the axis holds the whole
// tensor), sharded along a tensor dimension (member k holds the k-th equal slice), or partial
// (every member holds a summand: the tensor is the sum of the members' values, which
// all_reduce / reduce_scatter resolve).
//
// How members meet: a collective is enqueued on every member of its group (the members that
// share every mesh coordinate but the axis'), in one call, before anything runs; each member's
// queue runs its part on its own thread, and the parts meet inside it. The c-th collective a
// member runs on a group meets the c-th of each peer, so:
//  - Issue collectives through these ops (never enqueue the kernel yourself), all members' ops
//    on the same queue id; replay a trace with collectives on every member (a Tracer does).
//  - A replay never reads a peer's buffer before the peer wrote it, and never deadlocks when the
//    members' replays are started from different threads, or blocking one after another from
//    one thread (a blocking replay of a trace with collectives waits for its worker thread).
//  - If a member's queue failed before a collective, the collective fails on every member with
//    an error naming that member and the op that failed (a sticky device error of each queue).
//  - A member that never arrives (its trace replayed alone) makes the others fail after
//    MeshOptions::collective_timeout; the group is then broken: every later collective on it
//    fails at once, and the mesh must be opened again.
// Members must run their queues on threads of their own (CPU devices in worker mode, the
// default). CUDA members, one per GPU, meet through NCCL: the collectives become nodes of each
// member's CUDA graph; sums follow NCCL's order (replicas still agree bit for bit), and there
// is no timeout (see docs/contract.md).
//
// Across processes and machines: retrace::mpi::open_mesh (retrace/mpi.hpp, target
// retrace::mpi) opens a mesh with one member per MPI rank. Every process runs the same program
// (SPMD); everything above holds, with MeshTensor::shards() and devices() being this
// process' members, and gather_to_host / gather_shards collective across the processes.
#pragma once

#include "retrace/device.hpp"
#include "retrace/ops.hpp"
#include "retrace/tensor.hpp"
#include "retrace/tree.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace retrace {

namespace detail {
struct MeshState;
class CollectiveGroup;
}  // namespace detail

struct MeshOptions {
  // How long a member waits at a collective for its peers before the group gives up.
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(5)};
};

class MeshDevice {
 public:
  // Opens one device per mesh position of `backend` ("cpu": ids first_id, first_id + 1, ...
  // in row-major order of `shape`): shape {n} is a 1-D mesh, {rows, cols} a 2-D one.
  // `member_options` (the backend's defaults if absent) apply to every member; its id is
  // replaced by each member's.
  [[nodiscard]] static std::unique_ptr<MeshDevice> open(
      std::string_view backend, std::vector<std::size_t> shape,
      std::optional<DeviceOptions> member_options = std::nullopt, MeshOptions options = {},
      std::uint32_t first_id = 0);
  // A mesh of these devices (in row-major order of `shape`; empty shape: 1-D of all of them).
  explicit MeshDevice(std::vector<std::unique_ptr<Device>> members,
                      std::vector<std::size_t> shape = {}, MeshOptions options = {});
  // A mesh assembled by a transport (retrace::mpi::open_mesh).
  explicit MeshDevice(std::shared_ptr<detail::MeshState> state);
  MeshDevice(const MeshDevice&) = delete;
  MeshDevice& operator=(const MeshDevice&) = delete;
  ~MeshDevice();  // closes

  [[nodiscard]] std::size_t size() const noexcept;  // every member, in every process
  [[nodiscard]] const std::vector<std::size_t>& shape() const noexcept;
  // A mesh over several processes (retrace/mpi.hpp) has some of its members in this process:
  // the ones that devices(), local_member() and a MeshTensor's shards() are about. A mesh in
  // one process has all of them (local_index(i) == i).
  [[nodiscard]] std::size_t local_size() const noexcept;
  [[nodiscard]] std::size_t local_index(std::size_t i) const;  // mesh index of local member i
  [[nodiscard]] Device& local_member(std::size_t i) const;
  [[nodiscard]] bool spans_processes() const noexcept;
  // True when `value` is true in every process of the mesh (a collective call across
  // processes; `value` itself in one process): agree on an outcome, such as an exit status.
  [[nodiscard]] bool all_processes(bool value);
  [[nodiscard]] std::size_t rank() const noexcept { return shape().size(); }  // mesh axes
  // Member `index` of the mesh (invalid_argument if it runs in another process).
  [[nodiscard]] Device& member(std::size_t index) const;
  [[nodiscard]] Device& at(std::size_t row, std::size_t col) const;  // 2-D meshes
  // The mesh coordinates of a member (one per axis).
  [[nodiscard]] std::vector<std::size_t> coords(std::size_t index) const;
  // This process' members, in order: what Tracer and the traced wrappers take.
  [[nodiscard]] std::vector<Device*> devices() const;
  operator std::vector<Device*>() const { return devices(); }  // NOLINT: a list of devices
  // "mesh 2x2 [cpu:0, cpu:1, cpu:2, cpu:3]"
  [[nodiscard]] const std::string& name() const noexcept;

  void synchronize();  // every queue of every member
  // Fails collectives still waiting, then closes every member. Idempotent.
  void close() noexcept;
  [[nodiscard]] bool is_closed() const noexcept;

  [[nodiscard]] const std::shared_ptr<detail::MeshState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::MeshState> state_;
};

// Where a tensor's values are along one mesh axis.
struct Placement {
  enum class Kind : std::uint8_t { replicated, sharded, partial };
  Kind kind = Kind::replicated;
  std::int64_t dim = 0;  // sharded: the tensor dimension that is split (non-negative)

  [[nodiscard]] static Placement replicate() noexcept { return {}; }
  [[nodiscard]] static Placement shard(std::int64_t dim) noexcept {
    return {Kind::sharded, dim};
  }
  [[nodiscard]] static Placement partial() noexcept { return {Kind::partial, 0}; }
  [[nodiscard]] std::string to_string() const;  // "R", "S(1)", "P"
  friend bool operator==(const Placement&, const Placement&) = default;
};

// One logical tensor over a mesh: a shard on every member, and a placement per mesh axis.
// shards() are this process' shards (shard i on local_member(i): in a one-process mesh, every
// member's, shard i on member i). Copies share the shards, as Tensor copies share storage.
class MeshTensor {
 public:
  MeshTensor() = default;  // null
  // Checks that shard i lives on member i, that the shards agree in dtype, layout and shape,
  // that there is one placement per mesh axis, and that sharded dimensions exist (negative dims
  // count from the end). invalid_argument naming the shard otherwise.
  MeshTensor(std::vector<Tensor> shards, const MeshDevice& mesh,
             std::vector<Placement> placements);
  [[nodiscard]] static MeshTensor from_shards(std::vector<Tensor> shards,
                                              std::shared_ptr<detail::MeshState> mesh,
                                              std::vector<Placement> placements);

  [[nodiscard]] bool is_null() const noexcept { return shards_.empty(); }
  [[nodiscard]] const std::vector<Tensor>& shards() const noexcept { return shards_; }
  [[nodiscard]] const Tensor& shard(std::size_t member) const;
  [[nodiscard]] const std::vector<Placement>& placements() const noexcept { return placements_; }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }  // the logical shape
  [[nodiscard]] DType dtype() const;
  [[nodiscard]] const std::shared_ptr<detail::MeshState>& mesh() const noexcept { return mesh_; }
  // The same shards under other placements (no data moves): declare what a computation made.
  [[nodiscard]] MeshTensor with_placements(std::vector<Placement> placements) const;
  // "MeshTensor([4, 64], float32, [S(1)], mesh 2 [cpu:0, cpu:1])"
  [[nodiscard]] std::string to_string() const;

  // A tree: the shards and the placements (as a string leaf, so a traced call checks them).
  friend auto retrace_tie(MeshTensor& t) { return std::tie(t.shards_, t.placement_key_); }
  friend auto retrace_tie(const MeshTensor& t) { return std::tie(t.shards_, t.placement_key_); }
  friend constexpr std::string_view retrace_field_names(const MeshTensor*) noexcept {
    return "shards, placements";
  }

 private:
  std::vector<Tensor> shards_;
  std::string placement_key_;
  std::vector<Placement> placements_;
  Shape shape_;
  std::shared_ptr<detail::MeshState> mesh_;
};

// Splits or copies a tensor over the mesh (host tensors, or device tensors, read first). Sharded
// dimensions must divide evenly by the axis' size; partial is not a placement of a value. On a
// mesh over several processes each process passes the same whole tensor and keeps its
// members' pieces.
[[nodiscard]] MeshTensor distribute(const Tensor& tensor, const MeshDevice& mesh,
                                    std::vector<Placement> placements,
                                    QueueId queue = kDefaultQueue);
// The logical tensor on the host: shards concatenated, replicas taken from the first member,
// partial values summed in member order (floats in float32, rounded once). On a mesh over
// several processes, every process calls it (it gathers the other processes' shards) and gets
// the whole tensor.
[[nodiscard]] Tensor gather_to_host(const MeshTensor& tensor, QueueId queue = kDefaultQueue);
// Every member's shard on the host, in member order (collective across processes, as above):
// to compare replicas, or to look at what each member holds.
[[nodiscard]] std::vector<Tensor> gather_shards(const MeshTensor& tensor,
                                                QueueId queue = kDefaultQueue);

namespace detail {
template <class T>
inline constexpr bool is_mesh_tensor_v = std::is_same_v<std::remove_cvref_t<T>, MeshTensor>;

const MeshTensor* first_mesh_tensor() noexcept;
template <class A, class... Rest>
const MeshTensor* first_mesh_tensor(const A& a, const Rest&... rest) noexcept {
  if constexpr (is_mesh_tensor_v<A>) {
    return &a;
  } else {
    return first_mesh_tensor(rest...);
  }
}
template <class A>
decltype(auto) shard_of(const A& a, std::size_t member) {
  if constexpr (is_mesh_tensor_v<A>) {
    return a.shard(member);
  } else {
    return (a);
  }
}
// failed_precondition naming `what` once the mesh was closed (or its MeshDevice destroyed).
void require_mesh_open(const MeshState& mesh, std::string_view what);
// Checks that every MeshTensor argument lives on `mesh` (invalid_argument naming `what`).
void check_same_mesh(const MeshTensor& first, const MeshTensor& other, std::string_view what);
}  // namespace detail

// Runs `fn` on every member (in this process): MeshTensor arguments are replaced by the
// member's shard, others are passed as they are; fn returns the member's Tensor. The result has
// `placements`.
template <class Fn, class... Args>
[[nodiscard]] MeshTensor mesh_map(std::vector<Placement> placements, Fn&& fn,
                                  const Args&... args) {
  const MeshTensor* first = detail::first_mesh_tensor(args...);
  RETRACE_CHECK(first != nullptr && !first->is_null(), invalid_argument,
                "mesh_map: no mesh tensor among the arguments");
  (
      [&] {
        if constexpr (detail::is_mesh_tensor_v<Args>) {
          detail::check_same_mesh(*first, args, "mesh_map");
        }
      }(),
      ...);
  std::vector<Tensor> out;
  out.reserve(first->shards().size());
  for (std::size_t i = 0; i < first->shards().size(); ++i) {
    out.push_back(fn(detail::shard_of(args, i)...));
  }
  return MeshTensor::from_shards(std::move(out), first->mesh(), std::move(placements));
}
// The same, keeping the placements of the first MeshTensor argument (elementwise ops).
template <class Fn, class... Args>
[[nodiscard]] MeshTensor mesh_map(Fn&& fn, const Args&... args) {
  const MeshTensor* first = detail::first_mesh_tensor(args...);
  RETRACE_CHECK(first != nullptr && !first->is_null(), invalid_argument,
                "mesh_map: no mesh tensor among the arguments");
  return mesh_map(first->placements(), std::forward<Fn>(fn), args...);
}

namespace ops {
// Sums the partial values along a mesh axis; the result is replicated along it.
[[nodiscard]] MeshTensor all_reduce(const MeshTensor& x, std::size_t mesh_axis = 0,
                                    QueueId queue = kDefaultQueue);
// Concatenates the shards along their sharded dimension; the result is replicated along it.
[[nodiscard]] MeshTensor all_gather(const MeshTensor& x, std::size_t mesh_axis = 0,
                                    QueueId queue = kDefaultQueue);
// Sums the partial values along a mesh axis and leaves member k the k-th slice of dimension
// `dim` (which must divide evenly): sharded along `dim`.
[[nodiscard]] MeshTensor reduce_scatter(const MeshTensor& x, std::int64_t dim,
                                        std::size_t mesh_axis = 0,
                                        QueueId queue = kDefaultQueue);
}  // namespace ops

}  // namespace retrace
