#include "retrace/models/tensor_parallel_dit.hpp"

#include "dit_layers.hpp"

#include <fmt/format.h>

namespace retrace::models {

namespace {

using layers::block_name;

const std::vector<Placement> kReplicated{Placement::replicate()};
const std::vector<Placement> kPartial{Placement::partial()};

// How a weight of the reference layout is split: along a dimension of a view of it (each
// member's piece then reshaped back to the weight's rank), or not at all.
struct Split {
  bool split = false;
  Shape view;          // the weight seen as this shape (empty: its own) ...
  std::int64_t dim = 0;  // ... sharded along this dimension
};

Split split_of(const std::string& name, const DiTConfig& c) {
  const std::int64_t h = c.hidden;
  auto ends = [&](const char* suffix) {
    return name.starts_with("blocks.") && name.ends_with(suffix);
  };
  // qkv rows are (q, k, v) x heads x head width: each member takes its heads of all three.
  if (ends(".attn.qkv.weight")) return {true, Shape{3, h, h}, 1};
  if (ends(".attn.qkv.bias")) return {true, Shape{3, h}, 1};
  if (ends(".attn.proj.weight")) return {true, {}, 1};  // its heads' input columns
  if (ends(".mlp.fc1.weight") || ends(".mlp.fc1.bias")) return {true, {}, 0};
  if (ends(".mlp.fc2.weight")) return {true, {}, 1};
  return {};  // the projections' biases are added once, after the all-reduce
}

}  // namespace

TensorParallelDiT::TensorParallelDiT(const DiT& model, const MeshDevice& mesh)
    : config_(model.config()),
      mesh_(&mesh),
      state_(mesh.state()),
      members_(mesh.size()),
      local_(mesh.local_size()),
      mesh_name_(mesh.name()),
      file_positions_(model.fixed_resolution()) {
  const std::size_t n = mesh.size();
  const auto members = static_cast<std::int64_t>(n);
  RETRACE_CHECK(!mesh.is_closed(), failed_precondition, "TensorParallelDiT: {} was closed",
                mesh.name());
  RETRACE_CHECK(mesh.rank() == 1, invalid_argument,
                "TensorParallelDiT: needs a 1-D mesh, got {}", mesh.name());
  RETRACE_CHECK(config_.heads % members == 0, invalid_argument,
                "TensorParallelDiT: {} attention heads do not split evenly over the {} members "
                "of {}",
                config_.heads, n, mesh.name());
  RETRACE_CHECK(config_.mlp_width() % members == 0, invalid_argument,
                "TensorParallelDiT: the MLP width {} does not split evenly over the {} members "
                "of {}",
                config_.mlp_width(), n, mesh.name());
  for (const auto& [name, tensor] : model.weights()) {
    const Split s = split_of(name, config_);
    if (!s.split) {
      weights_[name] = distribute(tensor, mesh, kReplicated).shards();
      continue;
    }
    const Tensor whole = s.view.rank() == 0 ? tensor : ops::reshape(tensor, s.view.dims());
    std::vector<Tensor> shards = distribute(whole, mesh, {Placement::shard(s.dim)}).shards();
    if (s.view.rank() != 0) {
      // Back to the weight's rank: [3, h / n, h] -> [3 h / n, h], [3, h / n] -> [3 h / n].
      for (Tensor& shard : shards) {
        std::vector<std::int64_t> dims{shard.shape()[0] * shard.shape()[1]};
        for (std::size_t i = 2; i < shard.shape().rank(); ++i) dims.push_back(shard.shape()[i]);
        shard = ops::reshape(shard, dims);
      }
    }
    weights_[name] = std::move(shards);
  }
  positions_.emplace(std::pair{config_.grid(), config_.grid()},
                     MeshTensor::from_shards(weights_.at("pos_embed"), mesh.state(), kReplicated));
}

const Tensor& TensorParallelDiT::weight(const std::string& name, std::size_t member) const {
  auto it = weights_.find(name);
  RETRACE_CHECK(it != weights_.end(), invalid_argument,
                "TensorParallelDiT: no weight named \"{}\"", name);
  RETRACE_CHECK(member < it->second.size(), invalid_argument,
                "TensorParallelDiT: member {} is outside the {} members in this process", member,
                it->second.size());
  return it->second[member];
}

void TensorParallelDiT::require_open() const {
  detail::require_mesh_open(*state_, "TensorParallelDiT");
}

void TensorParallelDiT::check_replicated(const MeshTensor& t, const char* what) const {
  RETRACE_CHECK(!t.is_null(), invalid_argument, "TensorParallelDiT: {} is a null mesh tensor",
                what);
  RETRACE_CHECK(t.mesh() == state_, invalid_argument,
                "TensorParallelDiT: {} ({}) is not on the model's mesh ({})", what, t.to_string(),
                mesh_name_);
  RETRACE_CHECK(t.placements() == kReplicated, invalid_argument,
                "TensorParallelDiT: {} must be replicated on every member, got {}", what,
                t.to_string());
}

void TensorParallelDiT::prepare_resolution(std::int64_t height, std::int64_t width) const {
  require_open();
  const auto [grid_h, grid_w] = layers::patch_grid(config_, height, width);
  (void)positions(grid_h, grid_w);
}

const MeshTensor& TensorParallelDiT::positions(std::int64_t grid_h, std::int64_t grid_w) const {
  const std::lock_guard lock(positions_mutex_);
  auto it = positions_.find({grid_h, grid_w});
  if (it != positions_.end()) return it->second;
  const Tensor table = layers::position_table(config_, file_positions_, grid_h, grid_w);
  return positions_.emplace(std::pair{grid_h, grid_w}, distribute(table, *mesh_, kReplicated))
      .first->second;
}

namespace {

// One tensor per member from fn(member), as a mesh tensor with these placements.
template <class Fn>
MeshTensor on_each(const std::shared_ptr<detail::MeshState>& mesh, std::size_t members,
                   const std::vector<Placement>& placements, Fn&& fn) {
  std::vector<Tensor> shards;
  shards.reserve(members);
  for (std::size_t k = 0; k < members; ++k) shards.push_back(fn(k));
  return MeshTensor::from_shards(std::move(shards), mesh, placements);
}

}  // namespace

MeshTensor TensorParallelDiT::block(const MeshTensor& x, const MeshTensor& cond,
                                    std::int64_t i) const {
  const std::size_t n = members_;
  const std::int64_t heads = config_.heads / static_cast<std::int64_t>(n);
  const std::int64_t d = config_.hidden / config_.heads;
  auto w = [&](const char* rest, std::size_t k) -> const Tensor& {
    return weight(block_name(i, rest), k);
  };
  std::vector<std::vector<Tensor>> mod(local_);
  // Attention over the member's heads, projected by its columns: partial sums.
  const MeshTensor attn = ops::all_reduce(on_each(state_, local_, kPartial, [&](std::size_t k) {
    mod[k] = layers::block_modulation(
        [&](const std::string& name) -> const Tensor& { return weight(name, k); }, i,
        cond.shard(k));
    const Tensor y = layers::modulate(ops::layer_norm(x.shard(k), {}, {}, 1e-6), mod[k][0],
                                      mod[k][1]);
    const Tensor a = layers::self_attention(y, w("attn.qkv.weight", k), w("attn.qkv.bias", k),
                                            heads, d);
    return ops::linear(a, w("attn.proj.weight", k));
  }));
  std::vector<Tensor> out(local_);
  // The MLP over the member's slice of the hidden width: partial sums again.
  const MeshTensor mlp = ops::all_reduce(on_each(state_, local_, kPartial, [&](std::size_t k) {
    const Tensor a = ops::add(attn.shard(k), w("attn.proj.bias", k));
    out[k] = ops::add(x.shard(k), ops::mul(a, mod[k][2]));
    Tensor y = layers::modulate(ops::layer_norm(out[k], {}, {}, 1e-6), mod[k][3], mod[k][4]);
    y = ops::gelu_tanh(ops::linear(y, w("mlp.fc1.weight", k), w("mlp.fc1.bias", k)));
    return ops::linear(y, w("mlp.fc2.weight", k));
  }));
  return on_each(state_, local_, kReplicated, [&](std::size_t k) {
    const Tensor m = ops::add(mlp.shard(k), w("mlp.fc2.bias", k));
    return ops::add(out[k], ops::mul(m, mod[k][5]));
  });
}

MeshTensor TensorParallelDiT::forward(const MeshTensor& latents, const MeshTensor& t_frequencies,
                                      const MeshTensor& labels) const {
  require_open();
  check_replicated(latents, "latents");
  check_replicated(t_frequencies, "t_frequencies");
  check_replicated(labels, "labels");
  const DiTConfig& c = config_;
  const std::int64_t batch =
      layers::check_inputs(c, latents.shape(), t_frequencies.shape(), labels.shape());
  const std::int64_t grid_h = latents.shape()[2] / c.patch_size;
  const std::int64_t grid_w = latents.shape()[3] / c.patch_size;
  const MeshTensor& table = positions(grid_h, grid_w);
  auto weights_of = [this](std::size_t k) {
    return layers::WeightOf(
        [this, k](const std::string& name) -> const Tensor& { return weight(name, k); });
  };
  MeshTensor x = on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::embed_patches(c, weights_of(k), latents.shard(k), table.shard(k));
  });
  const MeshTensor cond = on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::conditioning(c, weights_of(k), t_frequencies.shard(k), labels.shard(k), batch);
  });
  for (std::int64_t i = 0; i < c.depth; ++i) x = block(x, cond, i);
  return on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::final_layer(c, weights_of(k), x.shard(k), cond.shard(k), grid_h, grid_w);
  });
}

MeshTensor TensorParallelDiT::guided_noise(const MeshTensor& latents,
                                           const MeshTensor& t_frequencies,
                                           const MeshTensor& labels, double cfg_scale) const {
  require_open();
  check_replicated(latents, "latents");
  layers::check_guidance(config_, latents.shape(), labels.shape(), cfg_scale);
  const MeshTensor batch = on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::guidance_batch(latents.shard(k), cfg_scale);
  });
  const MeshTensor out = forward(batch, t_frequencies, labels);
  return on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::guided_from_output(config_, out.shard(k), latents.shape()[0], cfg_scale);
  });
}

MeshTensor TensorParallelDiT::sample_step(const MeshTensor& latents,
                                          const MeshTensor& t_frequencies,
                                          const MeshTensor& labels,
                                          const MeshTensor& coefficients, double cfg_scale) const {
  require_open();
  check_replicated(coefficients, "coefficients");
  layers::check_coefficients(coefficients.shape());
  const MeshTensor eps = guided_noise(latents, t_frequencies, labels, cfg_scale);
  return on_each(state_, local_, kReplicated, [&](std::size_t k) {
    return layers::ddim_update(latents.shard(k), eps.shard(k), coefficients.shard(k));
  });
}

}  // namespace retrace::models
