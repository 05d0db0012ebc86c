#include "dit_layers.hpp"

#include <fmt/format.h>

#include <cmath>

namespace retrace::models::layers {

std::string block_name(std::int64_t i, const char* rest) {
  return fmt::format("blocks.{}.{}", i, rest);
}

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return ops::add(ops::mul(x, ops::add(scale, 1.0)), shift);
}

std::int64_t check_inputs(const DiTConfig& c, const Shape& s, const Shape& t_frequencies,
                          const Shape& labels) {
  const std::int64_t p = c.patch_size;
  RETRACE_CHECK(s.rank() == 4 && s[1] == c.in_channels && s[0] > 0 && s[2] > 0 && s[3] > 0 &&
                    s[2] % p == 0 && s[3] % p == 0,
                invalid_argument,
                "DiT: latents must be [batch, {}, H, W] with H and W positive multiples of the "
                "patch size {}, got {}",
                c.in_channels, p, s);
  const std::int64_t batch = s[0];
  RETRACE_CHECK(t_frequencies.rank() == 2 && (t_frequencies[0] == 1 || t_frequencies[0] == batch) &&
                    t_frequencies[1] == c.frequency_size,
                invalid_argument, "DiT: timestep frequencies must be [1 or {}, {}], got {}", batch,
                c.frequency_size, t_frequencies);
  RETRACE_CHECK(labels == Shape({batch, c.num_classes + 1}), invalid_argument,
                "DiT: labels must be one-hot rows [{}, {}] (see label_rows), got {}", batch,
                c.num_classes + 1, labels);
  return batch;
}

std::pair<std::int64_t, std::int64_t> patch_grid(const DiTConfig& c, std::int64_t height,
                                                 std::int64_t width) {
  const std::int64_t p = c.patch_size;
  RETRACE_CHECK(height > 0 && width > 0 && height % p == 0 && width % p == 0, invalid_argument,
                "DiT: latents of {}x{} do not split into {}x{} patches", height, width, p, p);
  return {height / p, width / p};
}

Tensor position_table(const DiTConfig& c, bool file_positions, std::int64_t grid_h,
                      std::int64_t grid_w) {
  RETRACE_CHECK(!file_positions, invalid_argument,
                "DiT: the checkpoint's pos_embed is for {}x{} latents ({}x{} patches); these "
                "latents have {}x{} patches",
                c.input_size, c.input_size, c.grid(), c.grid(), grid_h, grid_w);
  return Tensor::from_vector<float>(sincos_positions(c.hidden, grid_h, grid_w),
                                    {1, grid_h * grid_w, c.hidden}, c.dtype);
}

Tensor embed_patches(const DiTConfig& c, const WeightOf& weight, const Tensor& latents,
                     const Tensor& positions) {
  const std::int64_t h = c.hidden, p = c.patch_size;
  const Shape& s = latents.shape();
  const std::int64_t batch = s[0], grid_h = s[2] / p, grid_w = s[3] / p;
  // The p x p convolution of stride p is a linear layer over each patch's C_in x p x p values,
  // in the order of the convolution's weight.
  Tensor patches = ops::permute(ops::reshape(latents, {batch, c.in_channels, grid_h, p, grid_w, p}),
                                {0, 2, 4, 1, 3, 5});
  patches = ops::reshape(patches, {batch, grid_h * grid_w, c.in_channels * p * p});
  const Tensor& proj = weight("x_embedder.proj.weight");
  const Tensor x = ops::linear(patches, ops::reshape(proj, {h, c.in_channels * p * p}),
                               weight("x_embedder.proj.bias"));
  return ops::add(x, positions);
}

Tensor conditioning(const DiTConfig& c, const WeightOf& weight, const Tensor& t_frequencies,
                    const Tensor& labels, std::int64_t batch) {
  // Timestep MLP plus the label's row of the table (one-hot rows x table).
  Tensor temb = ops::linear(t_frequencies, weight("t_embedder.mlp.0.weight"),
                            weight("t_embedder.mlp.0.bias"));
  temb = ops::linear(ops::silu(temb), weight("t_embedder.mlp.2.weight"),
                     weight("t_embedder.mlp.2.bias"));
  const Tensor yemb = ops::matmul(labels, weight("y_embedder.embedding_table.weight"));
  // Every adaLN layer starts with SiLU(c): computed once, [B, 1, C] to broadcast over tokens.
  return ops::reshape(ops::silu(ops::add(temb, yemb)), {batch, 1, c.hidden});
}

std::vector<Tensor> block_modulation(const WeightOf& weight, std::int64_t i, const Tensor& cond) {
  return ops::chunk(ops::linear(cond, weight(block_name(i, "adaLN_modulation.1.weight")),
                                weight(block_name(i, "adaLN_modulation.1.bias"))),
                    6, -1);
}

Tensor self_attention(const Tensor& y, const Tensor& qkv_weight, const Tensor& qkv_bias,
                      std::int64_t heads, std::int64_t d) {
  const std::int64_t batch = y.shape()[0], tokens = y.shape()[1];
  Tensor qkv = ops::linear(y, qkv_weight, qkv_bias);
  qkv = ops::permute(ops::reshape(qkv, {batch, tokens, 3, heads, d}), {2, 0, 3, 1, 4});
  const std::vector<Tensor> parts = ops::chunk(qkv, 3, 0);
  auto head_view = [&](const Tensor& t) { return ops::reshape(t, {batch, heads, tokens, d}); };
  const Tensor attn = ops::scaled_dot_product_attention(head_view(parts[0]), head_view(parts[1]),
                                                        head_view(parts[2]));
  return ops::reshape(ops::permute(attn, {0, 2, 1, 3}), {batch, tokens, heads * d});
}

Tensor final_layer(const DiTConfig& c, const WeightOf& weight, const Tensor& x,
                   const Tensor& cond, std::int64_t grid_h, std::int64_t grid_w) {
  const std::int64_t p = c.patch_size, batch = x.shape()[0];
  const std::vector<Tensor> mod =
      ops::chunk(ops::linear(cond, weight("final_layer.adaLN_modulation.1.weight"),
                             weight("final_layer.adaLN_modulation.1.bias")),
                 2, -1);
  Tensor y = modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  y = ops::linear(y, weight("final_layer.linear.weight"), weight("final_layer.linear.bias"));
  // Unpatchify: [B, gh, gw, p, p, C_out] -> [B, C_out, gh, p, gw, p].
  const std::int64_t out = c.out_channels();
  y = ops::permute(ops::reshape(y, {batch, grid_h, grid_w, p, p, out}), {0, 5, 1, 3, 2, 4});
  return ops::reshape(y, {batch, out, grid_h * p, grid_w * p});
}

void check_guidance(const DiTConfig& c, const Shape& latents, const Shape& labels,
                    double cfg_scale) {
  RETRACE_CHECK(std::isfinite(cfg_scale), invalid_argument,
                "DiT: the guidance scale must be finite, got {}", cfg_scale);
  if (cfg_scale == 1.0) return;
  RETRACE_CHECK(latents.rank() == 4, invalid_argument,
                "DiT: latents must be [batch, {}, H, W], got {}", c.in_channels, latents);
  const std::int64_t batch = latents[0];
  RETRACE_CHECK(labels.rank() == 2 && labels[0] == 2 * batch, invalid_argument,
                "DiT: with guidance, labels need {} rows (the conditional labels, then as many "
                "null ones) for {} latents, got {}",
                2 * batch, batch, labels);
}

Tensor guidance_batch(const Tensor& latents, double cfg_scale) {
  if (cfg_scale == 1.0) return latents;
  const std::vector<Tensor> twice{latents, latents};
  return ops::concat(twice, 0);
}

Tensor guided_from_output(const DiTConfig& c, const Tensor& output, std::int64_t batch,
                          double cfg_scale) {
  const Tensor eps = ops::slice(output, 1, 0, c.in_channels);
  if (cfg_scale == 1.0) return eps;
  const Tensor cond = ops::slice(eps, 0, 0, batch);
  const Tensor uncond = ops::slice(eps, 0, batch, 2 * batch);
  return ops::add(uncond, ops::mul(ops::sub(cond, uncond), cfg_scale));
}

void check_coefficients(const Shape& coefficients) {
  RETRACE_CHECK(coefficients == Shape({2}), invalid_argument,
                "DiT: the step's coefficients must be [2] (see DdimSchedule), got {}",
                coefficients);
}

Tensor ddim_update(const Tensor& latents, const Tensor& eps, const Tensor& coefficients) {
  const std::vector<Tensor> ab = ops::chunk(coefficients, 2, 0);
  return ops::add(ops::mul(latents, ab[0]), ops::mul(eps, ab[1]));
}

}  // namespace retrace::models::layers
