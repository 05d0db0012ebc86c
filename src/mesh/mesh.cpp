// MeshDevice, MeshTensor, distribute / gather_to_host (retrace/mesh.hpp); the collective ops are
// in src/ops/collective.cpp, the collectives' meeting in src/mesh/collective.cpp.
#include "retrace/mesh.hpp"

#include "retrace/backend/collective.hpp"
#include "retrace/backend/mesh.hpp"
#include "ops/checks.hpp"
#include "retrace/backend.hpp"
#include "retrace/error.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstring>
#include <numeric>

namespace retrace {

namespace detail {

const MeshTensor* first_mesh_tensor() noexcept { return nullptr; }

void require_mesh_open(const MeshState& mesh, std::string_view what) { mesh.require_open(what); }

std::int64_t split_extent(std::string_view what, const Shape& shape, std::size_t dim,
                          std::size_t axis, std::size_t members) {
  const std::int64_t extent = shape.dims()[dim];
  const auto n = static_cast<std::int64_t>(members);
  RETRACE_CHECK(extent % n == 0, invalid_argument,
                "{}: dimension {} of {} ({}) does not split evenly over mesh axis {} ({} members)",
                what, dim, shape, extent, axis, n);
  return extent / n;
}

void check_same_mesh(const MeshTensor& first, const MeshTensor& other, std::string_view what) {
  RETRACE_CHECK(!other.is_null(), invalid_argument, "{}: a mesh tensor argument is null", what);
  RETRACE_CHECK(first.mesh() == other.mesh(), invalid_argument,
                "{}: the mesh tensors live on different meshes ({} and {})", what,
                first.to_string(), other.to_string());
}

}  // namespace detail

namespace {

using detail::MeshState;
using detail::split_extent;

std::string shape_name(const std::vector<std::size_t>& shape) {
  return fmt::format("{}", fmt::join(shape, "x"));
}

// Calls f(box_offset, full_offset, elements) for every contiguous row of the box [off, off+len)
// of a row-major tensor of extents `full` (offsets in elements, box offsets row-major in len).
template <class F>
void for_each_box_row(std::span<const std::int64_t> full, std::span<const std::int64_t> off,
                      std::span<const std::int64_t> len, F&& f) {
  const std::size_t rank = full.size();
  if (rank == 0) {
    f(0, 0, 1);
    return;
  }
  for (std::int64_t l : len) {
    if (l == 0) return;
  }
  std::vector<std::int64_t> strides(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) strides[d] = strides[d + 1] * full[d + 1];
  const std::int64_t row = len[rank - 1];
  std::vector<std::int64_t> idx(rank, 0);  // over the box's outer dims
  std::int64_t box = 0;
  for (;;) {
    std::int64_t at = off[rank - 1];
    for (std::size_t d = 0; d + 1 < rank; ++d) at += (off[d] + idx[d]) * strides[d];
    f(box, at, row);
    box += row;
    std::size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
}

// The box of the logical tensor that member `index` holds: offsets and extents per dimension.
void member_box(const MeshState& mesh, std::size_t index, const std::vector<Placement>& placements,
                const Shape& shard_shape, std::vector<std::int64_t>& off,
                std::vector<std::int64_t>& len) {
  const auto dims = shard_shape.dims();
  len.assign(dims.begin(), dims.end());
  off.assign(dims.size(), 0);
  const std::vector<std::size_t> c = mesh.coords(index);
  for (std::size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].kind != Placement::Kind::sharded) continue;
    const auto d = static_cast<std::size_t>(placements[a].dim);
    // Axes sharding the same dimension are not allowed, so the offsets do not compose.
    off[d] = static_cast<std::int64_t>(c[a]) * len[d];
  }
}

std::string placements_key(const std::vector<Placement>& placements) {
  std::string key = "[";
  for (std::size_t a = 0; a < placements.size(); ++a) {
    key += (a ? ", " : "") + placements[a].to_string();
  }
  return key + "]";
}

// Resolves negative sharded dims and checks the placements against the mesh and a shard rank.
std::vector<Placement> normalized(std::vector<Placement> placements, const MeshState& mesh,
                                  std::size_t rank, std::string_view what) {
  RETRACE_CHECK(placements.size() == mesh.shape.size(), invalid_argument,
                "{}: {} placements given for {} (one per mesh axis: {})", what, placements.size(),
                mesh.name, mesh.shape.size());
  for (std::size_t a = 0; a < placements.size(); ++a) {
    Placement& p = placements[a];
    if (p.kind != Placement::Kind::sharded) {
      p.dim = 0;
      continue;
    }
    const auto r = static_cast<std::int64_t>(rank);
    RETRACE_CHECK(p.dim >= -r && p.dim < r, invalid_argument,
                  "{}: mesh axis {} shards dimension {}, but the tensor has rank {}", what, a,
                  p.dim, rank);
    if (p.dim < 0) p.dim += r;
    for (std::size_t b = 0; b < a; ++b) {
      RETRACE_CHECK(placements[b].kind != Placement::Kind::sharded || placements[b].dim != p.dim,
                    invalid_argument, "{}: mesh axes {} and {} both shard dimension {}", what, b,
                    a, p.dim);
    }
  }
  return placements;
}

}  // namespace

// --- Placement ----------------------------------------------------------------------------------

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::replicated: return "R";
    case Kind::sharded: return fmt::format("S({})", dim);
    case Kind::partial: return "P";
  }
  return "?";
}

// --- MeshDevice ---------------------------------------------------------------------------------

std::unique_ptr<MeshDevice> MeshDevice::open(std::string_view backend,
                                             std::vector<std::size_t> shape,
                                             std::optional<DeviceOptions> member_options,
                                             MeshOptions options, std::uint32_t first_id) {
  RETRACE_CHECK(!shape.empty() && shape.size() <= 2, invalid_argument,
                "MeshDevice::open: a mesh has 1 or 2 axes, got shape [{}]", fmt::join(shape, ", "));
  std::size_t count = 1;
  for (std::size_t e : shape) {
    RETRACE_CHECK(e >= 1 && e <= 64, invalid_argument,
                  "MeshDevice::open: mesh extents must be in [1, 64], got [{}]",
                  fmt::join(shape, ", "));
    count *= e;
  }
  std::vector<std::unique_ptr<Device>> members;
  for (std::size_t i = 0; i < count; ++i) {
    const std::string spec = fmt::format("{}:{}", backend, first_id + i);
    DeviceOptions settings = member_options ? *member_options : default_device_options(spec);
    if (!member_options) settings.kernel_threads = 1;  // members side by side, a core each
    members.push_back(open_device(spec, settings));
  }
  return std::make_unique<MeshDevice>(std::move(members), std::move(shape), options);
}

namespace detail {

MeshState::~MeshState() {
  // Members first (normally closed already): an NCCL group's communicators are destroyed only
  // once no CUDA graph of a member uses them. Groups before the processes: an MPI group's
  // communicator is freed first.
  members.clear();
  groups.clear();
  if (processes) processes->close();
}

std::shared_ptr<MeshState> make_mesh_state(std::vector<std::unique_ptr<Device>> members,
                                           std::vector<std::size_t> local,
                                           std::vector<std::string> member_names,
                                           std::vector<std::size_t> shape, MeshOptions options,
                                           const GroupFactory& groups,
                                           std::unique_ptr<MeshProcesses> processes,
                                           std::string_view prefix) {
  RETRACE_CHECK(!member_names.empty(), invalid_argument, "MeshDevice: a mesh needs members");
  if (shape.empty()) shape = {member_names.size()};
  RETRACE_CHECK(shape.size() <= 2, invalid_argument, "MeshDevice: a mesh has 1 or 2 axes, got {}",
                shape.size());
  std::size_t count = 1;
  for (std::size_t e : shape) count *= e;
  RETRACE_CHECK(count == member_names.size(), invalid_argument,
                "MeshDevice: shape {} holds {} members, but {} were given", shape_name(shape),
                count, member_names.size());
  RETRACE_CHECK(options.collective_timeout.count() > 0, invalid_argument,
                "MeshDevice: collective_timeout must be positive");
  RETRACE_ASSERT(local.size() == members.size(), "one mesh index per local member");
  auto state = std::make_shared<MeshState>();
  MeshState& s = *state;
  std::vector<std::uint64_t> uids;
  for (std::size_t i = 0; i < members.size(); ++i) {
    RETRACE_CHECK(members[i] != nullptr && !members[i]->is_closed(), invalid_argument,
                  "MeshDevice: member {} is {}", local[i], members[i] ? "closed" : "null");
    RETRACE_CHECK(members[i]->supports(Capability::async_queues), invalid_argument,
                  "MeshDevice: member {} ({}) runs its queues on the calling thread; mesh "
                  "members need queues of their own (CPU devices: ExecutionMode::worker)",
                  local[i], members[i]->name());
    RETRACE_CHECK(std::find(uids.begin(), uids.end(), members[i]->uid()) == uids.end(),
                  invalid_argument, "MeshDevice: {} is given twice", members[i]->name());
    uids.push_back(members[i]->uid());
    s.links.push_back(members[i]->link());
  }
  s.local = std::move(local);
  s.member_names = std::move(member_names);
  s.shape = std::move(shape);
  s.options = options;
  s.name = fmt::format("{} {} [{}]", prefix, shape_name(s.shape), fmt::join(s.member_names, ", "));
  // One collective group per line of members along each axis (lines with a member here).
  s.groups.resize(s.shape.size());
  for (std::size_t axis = 0; axis < s.shape.size(); ++axis) {
    const std::size_t lines = count / s.shape[axis];
    std::vector<std::vector<std::string>> names(lines);
    for (std::size_t i = 0; i < count; ++i) {
      names[s.line_of(s.coords(i), axis)].push_back(s.member_names[i]);  // in order along it
    }
    std::vector<MeshLine> here(lines);
    for (std::size_t k = 0; k < s.local.size(); ++k) {  // s.local ascends: in order along it
      const std::vector<std::size_t> c = s.coords(s.local[k]);
      MeshLine& line = here[s.line_of(c, axis)];
      line.members.push_back(members[k].get());
      line.ranks.push_back(static_cast<std::uint32_t>(c[axis]));
    }
    s.groups[axis].resize(lines);
    for (std::size_t g = 0; g < lines; ++g) {
      if (here[g].members.empty()) continue;
      here[g].axis = axis;
      here[g].index = g;
      here[g].label = fmt::format("mesh axis {} [{}]", axis, fmt::join(names[g], ", "));
      here[g].names = std::move(names[g]);
      s.groups[axis][g] = groups(std::move(here[g]));
    }
  }
  s.processes = std::move(processes);
  s.members = std::move(members);
  return state;
}

}  // namespace detail

namespace detail {

namespace {
struct Transports {
  std::mutex mutex;
  std::vector<std::pair<std::string, std::unique_ptr<DeviceGroupFactory>>> factories;
};
Transports& transports() {
  static Transports t;
  return t;
}
}  // namespace

bool register_collective_transport(std::string backend, DeviceGroupFactory factory) {
  Transports& t = transports();
  std::lock_guard lock(t.mutex);
  for (auto& [name, f] : t.factories) {
    if (name == backend) {
      *f = std::move(factory);
      return true;
    }
  }
  t.factories.emplace_back(std::move(backend),
                           std::make_unique<DeviceGroupFactory>(std::move(factory)));
  return true;
}

const DeviceGroupFactory* collective_transport(std::string_view backend) {
  Transports& t = transports();
  std::lock_guard lock(t.mutex);
  for (const auto& [name, f] : t.factories) {
    if (name == backend) return f.get();  // stable: entries are never removed
  }
  return nullptr;
}

const DeviceGroupFactory* device_transport(const std::vector<Device*>& members) {
  const std::string_view backend = members.front()->backend();
  const bool device_memory = std::all_of(members.begin(), members.end(), [&](const Device* d) {
    return d->backend() == backend && !d->supports(Capability::host_visible_memory);
  });
  return device_memory ? collective_transport(backend) : nullptr;
}

}  // namespace detail

MeshDevice::MeshDevice(std::vector<std::unique_ptr<Device>> members,
                       std::vector<std::size_t> shape, MeshOptions options) {
  std::vector<std::size_t> local(members.size());
  std::iota(local.begin(), local.end(), std::size_t{0});
  std::vector<std::string> names;
  for (const auto& m : members) names.push_back(m ? m->name() : std::string("null"));
  state_ = detail::make_mesh_state(
      std::move(members), std::move(local), std::move(names), std::move(shape), options,
      [&](detail::MeshLine line) -> std::unique_ptr<detail::CollectiveGroup> {
        // Members whose memory the host cannot reach meet through their backend's transport.
        if (const auto* transport = detail::device_transport(line.members)) {
          return (*transport)(std::move(line), options);
        }
        return std::make_unique<detail::SharedMemoryGroup>(
            std::move(line.names), std::move(line.label), options.collective_timeout);
      },
      nullptr);
}

MeshDevice::MeshDevice(std::shared_ptr<detail::MeshState> state) : state_(std::move(state)) {
  RETRACE_CHECK(state_ != nullptr, invalid_argument, "MeshDevice: no mesh state");
}

MeshDevice::~MeshDevice() { close(); }

std::size_t MeshDevice::size() const noexcept { return state_->size(); }
std::size_t MeshDevice::local_size() const noexcept { return state_->links.size(); }
bool MeshDevice::spans_processes() const noexcept { return state_->processes != nullptr; }

std::size_t MeshDevice::local_index(std::size_t i) const {
  RETRACE_CHECK(i < local_size(), invalid_argument,
                "MeshDevice::local_index: {} has {} members in this process, not {}", name(),
                local_size(), i + 1);
  return state_->local[i];
}

Device& MeshDevice::local_member(std::size_t i) const {
  state_->require_open("MeshDevice::local_member");
  (void)local_index(i);  // checks i
  return *state_->members[i];
}
const std::vector<std::size_t>& MeshDevice::shape() const noexcept { return state_->shape; }
const std::string& MeshDevice::name() const noexcept { return state_->name; }
bool MeshDevice::is_closed() const noexcept { return state_->closed.load(); }

Device& MeshDevice::member(std::size_t index) const {
  state_->require_open("MeshDevice::member");
  RETRACE_CHECK(index < size(), invalid_argument, "MeshDevice::member: {} has {} members, not {}",
                name(), size(), index + 1);
  const auto at = std::find(state_->local.begin(), state_->local.end(), index);
  RETRACE_CHECK(at != state_->local.end(), invalid_argument,
                "MeshDevice::member: member {} ({}) of {} runs in another process",
                index, state_->member_names[index], name());
  return *state_->members[static_cast<std::size_t>(at - state_->local.begin())];
}

Device& MeshDevice::at(std::size_t row, std::size_t col) const {
  RETRACE_CHECK(rank() == 2, invalid_argument, "MeshDevice::at: {} is not a 2-D mesh", name());
  RETRACE_CHECK(row < shape()[0] && col < shape()[1], invalid_argument,
                "MeshDevice::at: ({}, {}) is outside {}", row, col, name());
  return member(row * shape()[1] + col);
}

std::vector<std::size_t> MeshDevice::coords(std::size_t index) const {
  RETRACE_CHECK(index < size(), invalid_argument, "MeshDevice::coords: {} has {} members, not {}",
                name(), size(), index + 1);
  return state_->coords(index);
}

std::vector<Device*> MeshDevice::devices() const {
  state_->require_open("MeshDevice::devices");
  std::vector<Device*> out;
  for (const auto& m : state_->members) out.push_back(m.get());
  return out;
}

void MeshDevice::synchronize() {
  state_->require_open("MeshDevice::synchronize");
  for (const auto& m : state_->members) m->synchronize();
}

bool MeshDevice::all_processes(bool value) {
  state_->require_open("MeshDevice::all_processes");
  return state_->processes ? state_->processes->all_true(value) : value;
}

void MeshDevice::close() noexcept {
  if (state_->closed.exchange(true)) return;
  // Collectives still waiting for a peer would keep a member's close waiting: fail them.
  for (auto& axis : state_->groups) {
    for (auto& group : axis) {
      if (group) group->break_group(fmt::format("{} was closed", state_->name));
    }
  }
  for (auto& m : state_->members) m->close();
  state_->members.clear();
}

// --- MeshTensor ---------------------------------------------------------------------------------

MeshTensor::MeshTensor(std::vector<Tensor> shards, const MeshDevice& mesh,
                       std::vector<Placement> placements)
    : MeshTensor(from_shards(std::move(shards), mesh.state(), std::move(placements))) {}

MeshTensor MeshTensor::from_shards(std::vector<Tensor> shards,
                                   std::shared_ptr<detail::MeshState> mesh,
                                   std::vector<Placement> placements) {
  RETRACE_CHECK(mesh != nullptr, invalid_argument, "MeshTensor: no mesh");
  mesh->require_open("MeshTensor");
  RETRACE_CHECK(shards.size() == mesh->links.size(), invalid_argument,
                "MeshTensor: {} shards for {} ({} members{})", shards.size(), mesh->name,
                mesh->links.size(), mesh->processes ? " in this process" : "");
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const Tensor& t = shards[i];
    RETRACE_CHECK(t.on_device(), invalid_argument, "MeshTensor: shard {} is {}", i,
                  t.is_null() ? "a null tensor" : "a host tensor");
    RETRACE_CHECK(t.buffer()->link().uid == mesh->links[i]->uid, invalid_argument,
                  "MeshTensor: shard {} is on {}, but member {} of {} is {}", i,
                  t.buffer()->link().name, mesh->local[i], mesh->name,
                  mesh->member_names[mesh->local[i]]);
    RETRACE_CHECK(t.shape() == shards[0].shape() && t.dtype() == shards[0].dtype() &&
                      t.layout() == shards[0].layout(),
                  invalid_argument, "MeshTensor: shard {} is {} {} {}, but shard 0 is {} {} {}", i,
                  t.shape(), t.dtype(), t.layout(), shards[0].shape(), shards[0].dtype(),
                  shards[0].layout());
  }
  MeshTensor out;
  out.placements_ = normalized(std::move(placements), *mesh, shards[0].shape().rank(), "MeshTensor");
  std::vector<std::int64_t> dims(shards[0].shape().dims().begin(), shards[0].shape().dims().end());
  for (std::size_t a = 0; a < out.placements_.size(); ++a) {
    if (out.placements_[a].kind != Placement::Kind::sharded) continue;
    auto& d = dims[static_cast<std::size_t>(out.placements_[a].dim)];
    const auto extent = static_cast<std::int64_t>(mesh->shape[a]);
    RETRACE_CHECK(d <= INT64_MAX / extent, invalid_argument,
                  "MeshTensor: the logical shape overflows");
    d *= extent;
  }
  out.shape_ = Shape(std::span<const std::int64_t>(dims));
  out.placement_key_ = placements_key(out.placements_);
  out.shards_ = std::move(shards);
  out.mesh_ = std::move(mesh);
  return out;
}

const Tensor& MeshTensor::shard(std::size_t member) const {
  RETRACE_CHECK(member < shards_.size(), invalid_argument,
                "MeshTensor::shard: {} has {} shards, not {}", to_string(), shards_.size(),
                member + 1);
  return shards_[member];
}

DType MeshTensor::dtype() const {
  RETRACE_CHECK(!is_null(), invalid_argument, "MeshTensor::dtype: the mesh tensor is null");
  return shards_[0].dtype();
}

MeshTensor MeshTensor::with_placements(std::vector<Placement> placements) const {
  RETRACE_CHECK(!is_null(), invalid_argument, "with_placements: the mesh tensor is null");
  return from_shards(shards_, mesh_, std::move(placements));
}

std::string MeshTensor::to_string() const {
  if (is_null()) return "MeshTensor(null)";
  return fmt::format("MeshTensor({}, {}, {}, {})", shape_, shards_[0].dtype(), placement_key_,
                     mesh_->name);
}

// --- distribute / gather_to_host ----------------------------------------------------------------

MeshTensor distribute(const Tensor& tensor, const MeshDevice& mesh,
                      std::vector<Placement> placements, QueueId queue) {
  tensor.check_not_null("distribute", "tensor");
  const MeshState& s = *mesh.state();
  s.require_open("distribute");
  placements = normalized(std::move(placements), s, tensor.shape().rank(), "distribute");
  RETRACE_CHECK(tensor.layout() == Layout::row_major, invalid_argument,
                "distribute: the tensor is in {} layout; distribute row-major tensors",
                tensor.layout());
  std::vector<std::int64_t> shard_dims(tensor.shape().dims().begin(), tensor.shape().dims().end());
  for (std::size_t a = 0; a < placements.size(); ++a) {
    RETRACE_CHECK(placements[a].kind != Placement::Kind::partial, invalid_argument,
                  "distribute: mesh axis {} is partial; a value is distributed replicated or "
                  "sharded (partial placements come from mesh_map)",
                  a);
    if (placements[a].kind != Placement::Kind::sharded) continue;
    const auto d = static_cast<std::size_t>(placements[a].dim);
    shard_dims[d] = split_extent("distribute", tensor.shape(), d, a, s.shape[a]);
  }
  const Tensor host = tensor.on_host() ? tensor : tensor.to_host(queue);
  const Shape shard_shape{std::span<const std::int64_t>(shard_dims)};
  const auto elem = static_cast<std::int64_t>(dtype_size(tensor.dtype()));
  const auto full = tensor.shape().dims();
  std::vector<Tensor> shards;
  std::vector<std::int64_t> off, len;
  for (std::size_t i = 0; i < s.local.size(); ++i) {
    Tensor part = Tensor::empty_host(shard_shape, tensor.dtype());
    member_box(s, s.local[i], placements, shard_shape, off, len);
    const std::byte* src = host.host_bytes().data();
    std::byte* dst = part.host_bytes_mutable().data();
    for_each_box_row(full, off, len, [&](std::int64_t box, std::int64_t at, std::int64_t n) {
      std::memcpy(dst + box * elem, src + at * elem, static_cast<std::size_t>(n * elem));
    });
    shards.push_back(part.to_device(mesh.local_member(i), queue));
  }
  return MeshTensor::from_shards(std::move(shards), mesh.state(), std::move(placements));
}

namespace {

// Every member's shard on the host, in member order. In one process only the members `wanted`
// names are read back (the others stay null); across processes every rank's shard is exchanged
// (a collective call).
template <class Wanted>
std::vector<Tensor> host_shards(const MeshTensor& tensor, QueueId queue, Wanted&& wanted) {
  const MeshState& s = *tensor.mesh();
  std::vector<Tensor> local;
  for (std::size_t i = 0; i < tensor.shards().size(); ++i) {
    local.push_back(s.processes || wanted(s.local[i]) ? tensor.shards()[i].to_host(queue)
                                                      : Tensor());
  }
  if (!s.processes) return local;
  // Across processes: every member's bytes, in member order.
  const Shape& shape = local.front().shape();
  const DType dtype = local.front().dtype();
  const std::size_t bytes = local.front().host_bytes().size();
  std::vector<std::byte> mine;
  mine.reserve(bytes * local.size());
  for (const Tensor& t : local) {
    const auto b = t.host_bytes();
    mine.insert(mine.end(), b.begin(), b.end());
  }
  const std::vector<std::byte> all = s.processes->all_gather_members(mine, bytes);
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    Tensor part = Tensor::empty_host(shape, dtype);
    if (bytes > 0) std::memcpy(part.host_bytes_mutable().data(), all.data() + i * bytes, bytes);
    out.push_back(std::move(part));
  }
  return out;
}

}  // namespace

std::vector<Tensor> gather_shards(const MeshTensor& tensor, QueueId queue) {
  RETRACE_CHECK(!tensor.is_null(), invalid_argument, "gather_shards: the mesh tensor is null");
  tensor.mesh()->require_open("gather_shards");
  return host_shards(tensor, queue, [](std::size_t) { return true; });
}

Tensor gather_to_host(const MeshTensor& tensor, QueueId queue) {
  RETRACE_CHECK(!tensor.is_null(), invalid_argument, "gather_to_host: the mesh tensor is null");
  const MeshState& s = *tensor.mesh();
  s.require_open("gather_to_host");
  const auto& placements = tensor.placements();
  const Tensor& first = tensor.shard(0);
  RETRACE_CHECK(first.layout() == Layout::row_major, invalid_argument,
                "gather_to_host: the shards are in {} layout", first.layout());
  const DType dtype = first.dtype();
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  Tensor out = Tensor::empty_host(tensor.shape(), dtype);
  // The members that hold values: the first along every replicated axis, all along the others.
  const auto holds = [&](std::size_t member) {
    const std::vector<std::size_t> c = s.coords(member);
    for (std::size_t a = 0; a < placements.size(); ++a) {
      if (placements[a].kind == Placement::Kind::replicated && c[a] != 0) return false;
    }
    return true;
  };
  const std::vector<Tensor> parts = host_shards(tensor, queue, holds);
  const auto full = tensor.shape().dims();
  std::vector<std::int64_t> off, len;
  const auto each_holder = [&](auto&& f) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!holds(i)) continue;
      member_box(s, i, placements, parts[i].shape(), off, len);
      f(parts[i].host_bytes().data());
    }
  };
  const bool partial = std::any_of(placements.begin(), placements.end(), [](const Placement& p) {
    return p.kind == Placement::Kind::partial;
  });
  if (!partial) {
    std::byte* dst = out.host_bytes_mutable().data();
    each_holder([&](const std::byte* src) {
      for_each_box_row(full, off, len, [&](std::int64_t box, std::int64_t at, std::int64_t n) {
        std::memcpy(dst + at * elem, src + box * elem, static_cast<std::size_t>(n * elem));
      });
    });
    return out;
  }
  // Partial values accumulate (floats in float32) in member order and are rounded once.
  detail::with_collective_dtype(dtype, [&]<class T>(T) {
    using S = detail::CollectiveSum<T>;
    const auto count = static_cast<std::size_t>(out.numel());
    std::vector<typename S::acc> acc(count);
    std::vector<char> seen(count, 0);  // per element: has a summand
    each_holder([&](const std::byte* src) {
      for_each_box_row(full, off, len, [&](std::int64_t box, std::int64_t at, std::int64_t n) {
        for (std::int64_t j = 0; j < n; ++j) {
          const auto e = static_cast<std::size_t>(at + j);
          const auto v = S::load(src, box + j);
          acc[e] = seen[e] ? acc[e] + v : v;
          seen[e] = 1;
        }
      });
    });
    void* dst = out.host_bytes_mutable().data();
    for (std::size_t e = 0; e < count; ++e) S::store(dst, static_cast<std::int64_t>(e), acc[e]);
  });
  return out;
}

}  // namespace retrace
