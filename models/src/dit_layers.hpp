// The DiT's layers as free functions over a weight lookup, shared by the single-device model
// (DiT) and the tensor-parallel one (TensorParallelDiT), which runs them on every member with
// the member's slice of the weights.
#pragma once

#include "retrace/models/dit.hpp"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace retrace::models::layers {

using WeightOf = std::function<const Tensor&(const std::string&)>;

std::string block_name(std::int64_t i, const char* rest);

// x * (1 + scale) + shift, shift and scale [B, 1, C] against x [B, T, C].
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);

// The model's inputs checked against the configuration (forward's errors); returns the batch.
std::int64_t check_inputs(const DiTConfig& c, const Shape& latents, const Shape& t_frequencies,
                          const Shape& labels);

// The patch grid of height x width latents (invalid_argument when they do not split into
// patches), for prepare_resolution.
std::pair<std::int64_t, std::int64_t> patch_grid(const DiTConfig& c, std::int64_t height,
                                                 std::int64_t width);
// The sin-cos position table [1, grid_h * grid_w, hidden] (host) of a grid the weights do not
// hold; invalid_argument when the model's positions came from a checkpoint (one grid only).
Tensor position_table(const DiTConfig& c, bool file_positions, std::int64_t grid_h,
                      std::int64_t grid_w);

// Patch embedding plus the position table: latents [B, C_in, H, W] -> tokens [B, T, C].
Tensor embed_patches(const DiTConfig& c, const WeightOf& weight, const Tensor& latents,
                     const Tensor& positions);
// SiLU(timestep MLP + label embedding) as [B, 1, C], the input of every adaLN layer.
Tensor conditioning(const DiTConfig& c, const WeightOf& weight, const Tensor& t_frequencies,
                    const Tensor& labels, std::int64_t batch);
// Block i's six modulation vectors (shift, scale, gate of attention, then of the MLP).
std::vector<Tensor> block_modulation(const WeightOf& weight, std::int64_t i, const Tensor& cond);
// Multi-head self-attention before the output projection: y [B, T, C] -> [B, T, heads * d],
// with qkv weight [3 heads d, C] and bias [3 heads d] (rows: q, k, v, each head after head).
Tensor self_attention(const Tensor& y, const Tensor& qkv_weight, const Tensor& qkv_bias,
                      std::int64_t heads, std::int64_t head_width);
// The final modulated norm, linear layer and unpatchify: [B, T, C] -> [B, C_out, H, W].
Tensor final_layer(const DiTConfig& c, const WeightOf& weight, const Tensor& x,
                   const Tensor& cond, std::int64_t grid_h, std::int64_t grid_w);

// Classifier-free guidance around a forward pass: the batch the model runs (latents twice, or
// once without guidance) and the guided noise from its output.
void check_guidance(const DiTConfig& c, const Shape& latents, const Shape& labels,
                    double cfg_scale);
Tensor guidance_batch(const Tensor& latents, double cfg_scale);
Tensor guided_from_output(const DiTConfig& c, const Tensor& output, std::int64_t batch,
                          double cfg_scale);
// One DDIM update: latents * a + eps * b, coefficients [2] = (a, b).
void check_coefficients(const Shape& coefficients);
Tensor ddim_update(const Tensor& latents, const Tensor& eps, const Tensor& coefficients);

}  // namespace retrace::models::layers
