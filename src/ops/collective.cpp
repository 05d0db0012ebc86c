// The collective ops (retrace/mesh.hpp): all_reduce, all_gather, reduce_scatter over a mesh
// axis, checked for every member before any is enqueued, then enqueued on every member (or
// handed to the line's device transport, NCCL).
#include "retrace/mesh.hpp"

#include "ops/checks.hpp"
#include "retrace/backend.hpp"
#include "retrace/backend/collective.hpp"
#include "retrace/backend/mesh.hpp"
#include "retrace/error.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

namespace retrace {

using detail::MeshState;
using detail::split_extent;

namespace {

MeshTensor run_collective(const MeshTensor& x, std::size_t axis, CollectiveOp op,
                          std::int64_t dim, QueueId queue, const char* name) {
  RETRACE_CHECK(!x.is_null(), invalid_argument, "{}: the mesh tensor is null", name);
  const MeshState& s = *x.mesh();
  s.require_open(name);
  RETRACE_CHECK(axis < s.shape.size(), invalid_argument, "{}: mesh axis {} does not exist on {}",
                name, axis, s.name);
  const Placement in = x.placements()[axis];
  const Tensor& first = x.shard(0);
  RETRACE_CHECK(first.layout() == Layout::row_major, invalid_argument,
                "{}: the shards are in {} layout; collectives take row-major tensors", name,
                first.layout());
  const auto n = static_cast<std::int64_t>(s.shape[axis]);
  const auto dims = first.shape().dims();
  std::vector<std::int64_t> out_dims(dims.begin(), dims.end());
  std::vector<Placement> placements = x.placements();
  std::int64_t outer = 1;
  std::int64_t chunk = first.numel();
  const auto split_at = [&](std::int64_t d) {
    outer = 1;
    for (std::int64_t k = 0; k < d; ++k) outer *= dims[static_cast<std::size_t>(k)];
    chunk = outer == 0 ? 0 : first.numel() / outer;
  };
  switch (op) {
    case CollectiveOp::all_reduce:
      RETRACE_CHECK(in.kind == Placement::Kind::partial, invalid_argument,
                    "{}: {} is {} along mesh axis {}; all_reduce sums partial values (declare "
                    "them with mesh_map or with_placements; all_gather assembles shards)",
                    name, x.to_string(), in.to_string(), axis);
      placements[axis] = Placement::replicate();
      break;
    case CollectiveOp::all_gather: {
      RETRACE_CHECK(in.kind == Placement::Kind::sharded, invalid_argument,
                    "{}: {} is {} along mesh axis {}; all_gather assembles a sharded dimension",
                    name, x.to_string(), in.to_string(), axis);
      split_at(in.dim);
      out_dims[static_cast<std::size_t>(in.dim)] *= n;
      placements[axis] = Placement::replicate();
      break;
    }
    case CollectiveOp::reduce_scatter: {
      RETRACE_CHECK(in.kind == Placement::Kind::partial, invalid_argument,
                    "{}: {} is {} along mesh axis {}; reduce_scatter sums partial values", name,
                    x.to_string(), in.to_string(), axis);
      const auto rank = static_cast<std::int64_t>(dims.size());
      RETRACE_CHECK(dim >= -rank && dim < rank, invalid_argument,
                    "{}: dimension {} does not exist in shards of shape {}", name, dim,
                    first.shape());
      if (dim < 0) dim += rank;
      for (std::size_t a = 0; a < placements.size(); ++a) {
        RETRACE_CHECK(placements[a].kind != Placement::Kind::sharded || placements[a].dim != dim,
                      invalid_argument, "{}: dimension {} is already sharded along mesh axis {}",
                      name, dim, a);
      }
      out_dims[static_cast<std::size_t>(dim)] =
          split_extent(name, first.shape(), static_cast<std::size_t>(dim), axis, s.shape[axis]);
      split_at(dim);
      chunk /= n;
      placements[axis] = Placement::shard(dim);
      break;
    }
  }
  const Shape out_shape{std::span<const std::int64_t>(out_dims)};

  // Everything that can fail is checked on every member before anything is enqueued on any.
  const std::size_t count = x.shards().size();
  std::vector<Device*> devices(count);
  std::size_t capturing = 0;
  for (std::size_t i = 0; i < count; ++i) {
    Device& d = x.shard(i).require_device(name, "shard");
    const char* refused = s.group_of(s.local[i], axis).first->refuses(d);
    RETRACE_CHECK(refused == nullptr, unimplemented,
                  "{}: member {} ({} device) cannot take part in collectives on {}: {}", name,
                  d.name(), d.backend(), s.name, refused != nullptr ? refused : "");
    devices[i] = &d;
    if (d.is_capturing_on_this_thread()) ++capturing;
  }
  RETRACE_CHECK(capturing == 0 || capturing == count, failed_precondition,
                "{}: {} of the {} members of {} are capturing on this thread; a collective is "
                "captured on every member or on none",
                name, capturing, count, s.name);
  // Across processes, a device transport (NCCL) cannot compare the members' collectives when
  // they run (the host transports exchange a header then): the processes compare them here,
  // before anything is enqueued, so ranks that disagree fail together instead of hanging.
  if (s.processes && s.group_of(s.local[0], axis).first->whole_buffers_only()) {
    struct Header {
      std::int64_t outer, chunk;
      std::uint8_t op, dtype, pad[6];
    };
    const Header mine{outer, chunk, static_cast<std::uint8_t>(op),
                      static_cast<std::uint8_t>(first.dtype()), {}};
    std::vector<std::byte> local(sizeof(Header) * count);
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(local.data() + i * sizeof(Header), &mine, sizeof(Header));
    }
    const std::vector<std::byte> all = s.processes->all_gather_members(local, sizeof(Header));
    const auto params_of = [&](const Header& h) {
      return CollectiveParams{nullptr, nullptr, nullptr, h.outer, h.chunk,
                              static_cast<DType>(h.dtype), static_cast<CollectiveOp>(h.op), 0};
    };
    const std::string& me = s.member_names[s.local[0]];
    for (std::size_t m = 0; m < s.size(); ++m) {
      Header theirs{};
      std::memcpy(&theirs, all.data() + m * sizeof(Header), sizeof(Header));
      const std::string why = detail::collective_disagreement(me, params_of(mine),
                                                              s.member_names[m], params_of(theirs));
      RETRACE_CHECK(why.empty(), invalid_argument, "{} on {}: {}", name, s.name, why);
    }
  }
  std::vector<Tensor> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back(Tensor::empty(out_shape, first.dtype(), *devices[i]));
  }
  if (outer * chunk > 0) {
    const auto n_members = static_cast<std::int64_t>(s.shape[axis]);
    std::vector<Tensor> inputs;    // dense shards (a strided view is copied first)
    std::vector<Tensor> gathered;  // whole-buffer all_gather: [members, outer, chunk] first
    std::vector<CollectiveParams> params;
    inputs.reserve(count);
    gathered.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      const auto [group, rank] = s.group_of(s.local[i], axis);
      Tensor input = ops::contiguous(x.shard(i), queue);
      CollectiveParams p{group, nullptr, out[i].buffer()->data(), outer, chunk, first.dtype(),
                         op, rank};
      if (outer > 1 && group->whole_buffers_only()) {
        // The transport moves whole buffers: member k's rows of a gather land in a block of
        // their own (permuted into place after), and the blocks a reduce_scatter leaves to
        // member k are made one block first.
        if (op == CollectiveOp::all_gather) {
          out[i] = Tensor();  // made by the permutation below
          gathered[i] = Tensor::empty(Shape{n_members, outer, chunk}, first.dtype(), *devices[i]);
          p.dst = gathered[i].buffer()->data();
        } else if (op == CollectiveOp::reduce_scatter) {
          input = ops::contiguous(
              ops::permute(ops::reshape(input, {outer, n_members, chunk}), {1, 0, 2}), queue);
        }
        p.chunk = outer * chunk;
        p.outer = 1;
      }
      p.src = ops::detail::data_of(input);
      inputs.push_back(std::move(input));
      params.push_back(p);
    }
    std::vector<detail::CollectiveGroup*> groups;  // this collective's groups, each once
    for (auto& g : s.groups[axis]) {
      if (g) groups.push_back(g.get());
    }
    // A group that started nothing of the collective yet stays usable; the others break.
    const auto fail_groups = [&](const std::string& why, bool started) noexcept {
      for (detail::CollectiveGroup* g : groups) {
        if (!g->cancel_enqueue() || started) g->break_group(why);
      }
    };
    for (std::size_t begun = 0; begun < groups.size(); ++begun) {
      try {
        groups[begun]->begin_enqueue();  // a broken group refuses here, before anything ran
      } catch (const Error&) {
        for (std::size_t k = 0; k < begun; ++k) groups[k]->cancel_enqueue();
        throw;
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      Buffer* target = gathered[i].is_null() ? out[i].buffer().get() : gathered[i].buffer().get();
      Buffer* buffers[] = {inputs[i].buffer().get(), target};
      try {
        devices[i]->enqueue(queue, make_launch(name, params[i], buffers));
      } catch (const Error& e) {
        // The members enqueued before would wait for this one forever: fail their groups.
        fail_groups(fmt::format("{} could not be enqueued on {}: {}", name, devices[i]->name(),
                                e.message()),
                    false);
        throw;
      }
    }
    for (detail::CollectiveGroup* g : groups) {
      try {
        g->end_enqueue();
      } catch (const Error& e) {
        fail_groups(fmt::format("{} could not be started on {}: {}", name, g->label(),
                                e.message()),
                    true);
        throw;
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (gathered[i].is_null()) continue;
      out[i] = ops::reshape(ops::contiguous(ops::permute(gathered[i], {1, 0, 2}), queue),
                            std::span<const std::int64_t>(out_dims));
    }
  }
  return MeshTensor::from_shards(std::move(out), x.mesh(), std::move(placements));
}

}  // namespace

namespace ops {

MeshTensor all_reduce(const MeshTensor& x, std::size_t mesh_axis, QueueId queue) {
  return run_collective(x, mesh_axis, CollectiveOp::all_reduce, 0, queue, "all_reduce");
}

MeshTensor all_gather(const MeshTensor& x, std::size_t mesh_axis, QueueId queue) {
  return run_collective(x, mesh_axis, CollectiveOp::all_gather, 0, queue, "all_gather");
}

MeshTensor reduce_scatter(const MeshTensor& x, std::int64_t dim, std::size_t mesh_axis,
                          QueueId queue) {
  return run_collective(x, mesh_axis, CollectiveOp::reduce_scatter, dim, queue, "reduce_scatter");
}

}  // namespace ops

}  // namespace retrace
