// FloorDiT, compiled once per CPU kernel variant (bench/dit/CMakeLists.txt); the entry gives
// its factory to make_floor (floor_select.cpp).
#include "floor_dit.hpp"

#include "cpu/elementwise.hpp"

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace retrace::bench {

namespace {

float silu(float x) { return x / (1.0f + cpu::vector_exp(-x)); }

class FloorDiT final : public FloorStep {
 public:
  FloorDiT(const models::DiT& model, Sgemm sgemm);
  void step(float* x, const float* t_frequencies, std::int64_t label, float a,
            float b) override;

 private:
  const std::vector<float>& w(const std::string& name) const { return weights_.at(name); }
  void linear(const float* x, std::int64_t rows, const std::string& prefix, std::int64_t out,
              std::int64_t in, float* y) const;
  void modulated_norm(const float* x, const float* shift, const float* scale, float* y) const;
  void attention(const float* qkv, float* out);

  // C = alpha op(A) op(B) + beta C through the variant's sgemm, its automatic choice.
  void gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) const {
    sgemm_(false, trans_b, m, n, k, alpha, a, b, beta, c, cpu::GemmLibrary::automatic, nullptr);
  }

  Sgemm sgemm_;
  models::DiTConfig config_;
  std::int64_t tokens_;
  std::map<std::string, std::vector<float>> weights_;
  std::vector<float> temb_, hidden_, c_, mod_, y_, qkv_, attn_, proj_, mlp_, v_, patches_, out_;
  std::vector<float> q_, k_, vh_, scores_, head_out_;
};

FloorDiT::FloorDiT(const models::DiT& model, Sgemm sgemm)
    : sgemm_(sgemm), config_(model.config()), tokens_(model.config().tokens()) {
  const std::int64_t h = config_.hidden, t = tokens_, p = config_.patch_size;
  for (const auto& [name, shape] : models::DiT::weight_shapes(config_)) {
    weights_[name] = model.weight(name).to_vector<float>();
  }
  temb_.resize(h);
  hidden_.resize(h);
  c_.resize(h);
  mod_.resize(6 * h);
  y_.resize(t * h);
  qkv_.resize(t * 3 * h);
  attn_.resize(t * h);
  proj_.resize(t * h);
  mlp_.resize(t * config_.mlp_width());
  patches_.resize(t * config_.in_channels * p * p);
  out_.resize(t * p * p * config_.out_channels());
  v_.resize(t * h);
  const std::int64_t d = h / config_.heads;
  q_.resize(t * d);
  k_.resize(t * d);
  vh_.resize(t * d);
  scores_.resize(t * t);
  head_out_.resize(t * d);
}

void FloorDiT::linear(const float* x, std::int64_t rows, const std::string& prefix,
                      std::int64_t out, std::int64_t in, float* y) const {
  const std::vector<float>& bias = w(prefix + ".bias");
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < out; ++j) y[r * out + j] = bias[j];
  }
  gemm(true, rows, out, in, 1.0f, x, w(prefix + ".weight").data(), 1.0f, y);
}

void FloorDiT::modulated_norm(const float* x, const float* shift, const float* scale,
                              float* y) const {
  const std::int64_t h = config_.hidden;
  for (std::int64_t r = 0; r < tokens_; ++r) {
    const float* row = x + r * h;
    float mean = 0.0f, var = 0.0f;
    for (std::int64_t j = 0; j < h; ++j) mean += row[j];
    mean /= static_cast<float>(h);
    for (std::int64_t j = 0; j < h; ++j) var += (row[j] - mean) * (row[j] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(h) + 1e-6f);
    for (std::int64_t j = 0; j < h; ++j) {
      y[r * h + j] = (row[j] - mean) * inv * (scale[j] + 1.0f) + shift[j];
    }
  }
}

void FloorDiT::attention(const float* qkv, float* out) {
  const std::int64_t h = config_.hidden, heads = config_.heads, d = h / heads, t = tokens_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t head = 0; head < heads; ++head) {
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t e = 0; e < d; ++e) {
        q_[i * d + e] = qkv[i * 3 * h + head * d + e];
        k_[i * d + e] = qkv[i * 3 * h + h + head * d + e];
        vh_[i * d + e] = qkv[i * 3 * h + 2 * h + head * d + e];
      }
    }
    gemm(true, t, t, d, scale, q_.data(), k_.data(), 0.0f, scores_.data());
    for (std::int64_t i = 0; i < t; ++i) cpu::softmax_row(&scores_[i * t], &scores_[i * t], t);
    gemm(false, t, d, t, 1.0f, scores_.data(), vh_.data(), 0.0f, head_out_.data());
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t e = 0; e < d; ++e) out[i * h + head * d + e] = head_out_[i * d + e];
    }
  }
}

void FloorDiT::step(float* x, const float* t_frequencies, std::int64_t label, float a,
                    float b) {
  const std::int64_t h = config_.hidden, t = tokens_, m = config_.mlp_width();
  const std::int64_t p = config_.patch_size, cin = config_.in_channels, g = config_.grid();
  const std::int64_t side = config_.input_size, cout = config_.out_channels();
  // Patch embedding: each patch's C_in x p x p values, then the projection and positions.
  for (std::int64_t gi = 0; gi < g; ++gi) {
    for (std::int64_t gj = 0; gj < g; ++gj) {
      float* dst = &patches_[(gi * g + gj) * cin * p * p];
      for (std::int64_t ch = 0; ch < cin; ++ch) {
        for (std::int64_t pi = 0; pi < p; ++pi) {
          for (std::int64_t pj = 0; pj < p; ++pj) {
            *dst++ = x[(ch * side + gi * p + pi) * side + gj * p + pj];
          }
        }
      }
    }
  }
  // The blocks work on their own state; x is only updated by the sampler step at the end.
  std::vector<float>& state = proj_;
  linear(patches_.data(), t, "x_embedder.proj", h, cin * p * p, state.data());
  const std::vector<float>& pos = w("pos_embed");
  for (std::int64_t i = 0; i < t * h; ++i) state[i] += pos[i];
  linear(t_frequencies, 1, "t_embedder.mlp.0", h, config_.frequency_size, temb_.data());
  for (float& v : temb_) v = silu(v);
  linear(temb_.data(), 1, "t_embedder.mlp.2", h, h, hidden_.data());
  const float* label_row = &w("y_embedder.embedding_table.weight")[label * h];
  for (std::int64_t j = 0; j < h; ++j) c_[j] = silu(hidden_[j] + label_row[j]);
  for (std::int64_t blk = 0; blk < config_.depth; ++blk) {
    const std::string pre = fmt::format("blocks.{}.", blk);
    linear(c_.data(), 1, pre + "adaLN_modulation.1", 6 * h, h, mod_.data());
    const float* mo = mod_.data();
    modulated_norm(state.data(), mo, mo + h, y_.data());
    linear(y_.data(), t, pre + "attn.qkv", 3 * h, h, qkv_.data());
    attention(qkv_.data(), attn_.data());
    linear(attn_.data(), t, pre + "attn.proj", h, h, v_.data());
    for (std::int64_t i = 0; i < t * h; ++i) state[i] += v_[i] * mo[2 * h + i % h];
    modulated_norm(state.data(), mo + 3 * h, mo + 4 * h, y_.data());
    linear(y_.data(), t, pre + "mlp.fc1", m, h, mlp_.data());
    for (float& v : mlp_) {
      const float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      v = v / (1.0f + cpu::vector_exp(-2.0f * inner));
    }
    linear(mlp_.data(), t, pre + "mlp.fc2", h, m, v_.data());
    for (std::int64_t i = 0; i < t * h; ++i) state[i] += v_[i] * mo[5 * h + i % h];
  }
  linear(c_.data(), 1, "final_layer.adaLN_modulation.1", 2 * h, h, mod_.data());
  modulated_norm(state.data(), mod_.data(), mod_.data() + h, y_.data());
  linear(y_.data(), t, "final_layer.linear", p * p * cout, h, out_.data());
  // Unpatchify the noise channels into the DDIM update.
  for (std::int64_t gi = 0; gi < g; ++gi) {
    for (std::int64_t gj = 0; gj < g; ++gj) {
      const float* tok = &out_[(gi * g + gj) * p * p * cout];
      for (std::int64_t pi = 0; pi < p; ++pi) {
        for (std::int64_t pj = 0; pj < p; ++pj) {
          for (std::int64_t ch = 0; ch < cin; ++ch) {
            float& dst = x[(ch * side + gi * p + pi) * side + gj * p + pj];
            dst = dst * a + tok[(pi * p + pj) * cout + ch] * b;
          }
        }
      }
    }
  }
}

std::unique_ptr<FloorStep> make(const models::DiT& model, Sgemm sgemm) {
  return std::make_unique<FloorDiT>(model, sgemm);
}

}  // namespace
}  // namespace retrace::bench

extern "C" retrace::bench::MakeFloor RETRACE_CPU_VARIANT_ENTRY() noexcept;
extern "C" retrace::bench::MakeFloor RETRACE_CPU_VARIANT_ENTRY() noexcept {
  return &retrace::bench::make;
}
