// MeshState: what a MeshDevice, its MeshTensors and its collectives share. Internal: the mesh
// transports (shared memory here, MPI in retrace::mpi) build it through make_mesh_state.
#pragma once

#include "retrace/backend/collective.hpp"
#include "retrace/device.hpp"
#include "retrace/error.hpp"
#include "retrace/mesh.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace retrace::detail {

// The processes a mesh spans, when it spans more than this one (MPI). Every call is collective:
// every process of the mesh makes it, in the same order, from the thread that uses the mesh.
class MeshProcesses {
 public:
  virtual ~MeshProcesses() = default;
  // Every member's `bytes` bytes in member order, given this process' members' bytes (its
  // members in order, each `bytes` long).
  [[nodiscard]] virtual std::vector<std::byte> all_gather_members(std::span<const std::byte> local,
                                                                  std::size_t bytes) = 0;
  // True on every process when `value` is true on every process.
  [[nodiscard]] virtual bool all_true(bool value) = 0;
  // "process 1 of 2": how this process is named in messages.
  [[nodiscard]] virtual std::string describe() const = 0;
  virtual void close() noexcept {}
};

struct MeshState {
  std::vector<std::unique_ptr<Device>> members;  // this process' members; emptied on close
  std::vector<std::shared_ptr<DeviceLink>> links;  // this process' members
  std::vector<std::size_t> local;                  // the mesh index of each of them
  std::vector<std::string> member_names;           // every member of the mesh, in order
  std::vector<std::size_t> shape;
  std::string name;
  MeshOptions options;
  // groups[axis][g]: the members that share every coordinate but `axis`, in order along it
  // (null for a line without a member in this process).
  std::vector<std::vector<std::unique_ptr<CollectiveGroup>>> groups;
  std::unique_ptr<MeshProcesses> processes;  // null: the whole mesh is in this process
  std::atomic<bool> closed{false};

  MeshState() = default;
  MeshState(const MeshState&) = delete;
  MeshState& operator=(const MeshState&) = delete;
  ~MeshState();

  [[nodiscard]] std::size_t size() const noexcept { return member_names.size(); }
  [[nodiscard]] std::vector<std::size_t> coords(std::size_t index) const {
    std::vector<std::size_t> c(shape.size());
    for (std::size_t a = shape.size(); a-- > 0;) {
      c[a] = index % shape[a];
      index /= shape[a];
    }
    return c;
  }
  // Which line of members along `axis` a member is on (its coordinates but the axis').
  [[nodiscard]] std::size_t line_of(const std::vector<std::size_t>& c, std::size_t axis) const {
    std::size_t g = 0;
    for (std::size_t a = 0; a < shape.size(); ++a) {
      if (a != axis) g = g * shape[a] + c[a];
    }
    return g;
  }
  // The group of a member along an axis, and the member's rank in it.
  [[nodiscard]] std::pair<CollectiveGroup*, std::uint32_t> group_of(std::size_t member,
                                                                    std::size_t axis) const {
    const std::vector<std::size_t> c = coords(member);
    return {groups[axis][line_of(c, axis)].get(), static_cast<std::uint32_t>(c[axis])};
  }
  void require_open(std::string_view what) const {
    RETRACE_CHECK(!closed.load(), failed_precondition, "{}: {} was closed", what, name);
  }
};

// One line of a mesh axis (the members that share every coordinate but the axis'), as this
// process sees it.
struct MeshLine {
  std::size_t axis = 0;
  std::size_t index = 0;             // which line of the axis
  std::vector<Device*> members;      // this process' members of the line, in rank order
  std::vector<std::uint32_t> ranks;  // their ranks along the line
  std::vector<std::string> names;    // every member of the line, in rank order
  std::string label;                 // "mesh axis 0 [cpu:0, cpu:1]"
  // Across processes (MPI): copies the bytes of the process holding rank 0 of the line into
  // every process of the line; a collective call of the line's processes. Null in one process.
  std::function<void(std::span<std::byte>)> broadcast;
};

// Makes the collective group of a line with a member in this process.
using GroupFactory = std::function<std::unique_ptr<CollectiveGroup>(MeshLine line)>;

// Makes the collective group of a line whose members are devices of one backend that a host
// transport cannot reach (CUDA devices: NCCL).
using DeviceGroupFactory =
    std::function<std::unique_ptr<CollectiveGroup>(MeshLine line, const MeshOptions& options)>;
// Registers the transport of a backend's devices (its library does, from a static
// initialiser). Returns true.
bool register_collective_transport(std::string backend, DeviceGroupFactory factory);
// The transport registered for a backend's devices, or null.
[[nodiscard]] const DeviceGroupFactory* collective_transport(std::string_view backend);
// The transport of a line whose members here are all devices of one backend without
// host-visible memory, when that backend registered one; null otherwise (a host transport).
[[nodiscard]] const DeviceGroupFactory* device_transport(const std::vector<Device*>& members);

// Checks and assembles a mesh: `members` are this process' devices, at mesh indices `local`
// (ascending); `member_names` names every member of the mesh; `groups` makes the collective
// group of each line with a member here. `prefix` starts the mesh's name ("mesh", "mpi mesh").
[[nodiscard]] std::shared_ptr<MeshState> make_mesh_state(
    std::vector<std::unique_ptr<Device>> members, std::vector<std::size_t> local,
    std::vector<std::string> member_names, std::vector<std::size_t> shape, MeshOptions options,
    const GroupFactory& groups, std::unique_ptr<MeshProcesses> processes,
    std::string_view prefix = "mesh");

// The extent of dimension `dim` of `shape` on each of the `members` of mesh axis `axis`
// (invalid_argument naming `what` when it does not split evenly).
[[nodiscard]] std::int64_t split_extent(std::string_view what, const Shape& shape,
                                        std::size_t dim, std::size_t axis, std::size_t members);

}  // namespace retrace::detail
