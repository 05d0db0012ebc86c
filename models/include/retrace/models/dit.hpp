// The diffusion transformer (DiT) of Peebles & Xie, "Scalable Diffusion Models with
// Transformers", written with retrace ops: the architecture, tensor names and shapes of the
// reference PyTorch implementation (facebookresearch/DiT, models.py), so its checkpoints load
// once converted to .safetensors, and a deterministic DDIM sampler with classifier-free guidance.
//
//   latents [B, C_in, H, W] --patch embedding (a p x p convolution with stride p)--> tokens
//   [B, T, C], T = (H/p)(W/p), plus a fixed 2-D sin-cos position embedding; the timestep
//   (256 sinusoidal frequencies, then Linear-SiLU-Linear) plus the class label's embedding
//   (a table with one extra row, the "null" class of classifier-free guidance) make the
//   conditioning c [B, C]; N adaLN-Zero blocks (shift, scale and gate from SiLU(c) for attention
//   and for the GELU-tanh MLP); a final modulated norm and a linear layer to p*p*C_out values
//   per token; unpatchify to [B, C_out, H, W]. With learned sigma, C_out = 2 C_in: the first
//   C_in channels are the predicted noise, the others the variance interpolation.
//
// Class labels enter as one-hot rows ([B, classes + 1], see label_rows), so a traced sampler
// step takes new labels through its input slot like any other tensor.
//
//   auto weights = retrace::models::read_safetensors("DiT-XL-2-256.safetensors");
//   auto config = retrace::models::infer_dit_config(weights);   // depth, hidden, ... from shapes
//   retrace::models::DiT model(config, device, weights);         // every tensor checked
//   Tensor out = model.forward(latents, t_frequencies, labels);  // [B, 2 C_in, H, W]
#pragma once

#include <retrace/retrace.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

namespace retrace::models {

struct DiTConfig {
  std::int64_t input_size = 16;   // latent height and width (H = W)
  std::int64_t patch_size = 2;
  std::int64_t in_channels = 4;   // latent channels
  std::int64_t hidden = 128;      // token width C
  std::int64_t depth = 2;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 0;    // width of the MLP; 0: 4 * hidden (the reference's mlp_ratio)
  std::int64_t num_classes = 1000;  // class labels 0 .. num_classes-1; num_classes is "null"
  bool learn_sigma = true;        // output 2 * in_channels channels
  std::int64_t frequency_size = 256;  // sinusoidal timestep features
  DType dtype = DType::float32;
  std::uint64_t seed = 0;         // random weights (the constructor without weights)

  [[nodiscard]] std::int64_t grid() const noexcept { return input_size / patch_size; }
  [[nodiscard]] std::int64_t tokens() const noexcept { return grid() * grid(); }
  [[nodiscard]] std::int64_t out_channels() const noexcept {
    return learn_sigma ? 2 * in_channels : in_channels;
  }
  [[nodiscard]] std::int64_t mlp_width() const noexcept {
    return mlp_hidden > 0 ? mlp_hidden : 4 * hidden;
  }
};

// The sizes the benchmarks use (retrace bench, retrace_bench_cuda), all patch 2, 4 latent
// channels: S (8x8 latent = 16 tokens, hidden 64, depth 2, 2 heads: dispatch-bound),
// M (32x32 = 256 tokens, 256, 4, 4) and L (64x64 = 1024 tokens, 512, 4, 8: compute-bound).
struct NamedDiTConfig {
  std::string name;
  DiTConfig config;
};
[[nodiscard]] const std::vector<NamedDiTConfig>& benchmark_sizes();

// What a checkpoint's tensors cannot say.
struct DiTInference {
  // Attention heads. The tensors do not fix it; the reference uses heads of width 64 at every
  // size (DiT-S 6, B 12, L 16, XL 16), so that is the default when hidden is a multiple of 64.
  std::optional<std::int64_t> heads = std::nullopt;
  // Latent size, needed only when the file has no pos_embed (which fixes it).
  std::optional<std::int64_t> input_size = std::nullopt;
  DType dtype = DType::float32;
};

// The configuration of a checkpoint in the reference layout, read from its tensors' shapes:
// hidden, in_channels and patch from x_embedder.proj.weight, input size from pos_embed, depth
// from the blocks.N present (0 .. N-1, no gaps), MLP width from fc1, frequency size from
// t_embedder.mlp.0, classes from y_embedder (the last row is the null class), learned sigma from
// final_layer.linear. Errors name the tensor that is missing or does not fit.
[[nodiscard]] DiTConfig infer_dit_config(const std::map<std::string, Tensor>& weights,
                                         const DiTInference& inference = {});

enum class UnusedWeights : bool { error = false, warn = true };

class DiT : public TraceOwner {
 public:
  // Random weights from config.seed (scaled so activations stay O(1)), the fixed sin-cos
  // position embedding.
  DiT(const DiTConfig& config, Device& device);
  // Weights from named tensors (host or device; e.g. read_safetensors). Every tensor of
  // weight_shapes must be present with its shape, except pos_embed (computed when absent). A
  // tensor the model does not use is an error naming it, or a logged warning with
  // UnusedWeights::warn.
  DiT(const DiTConfig& config, Device& device, const std::map<std::string, Tensor>& weights,
      UnusedWeights unused = UnusedWeights::error);

  [[nodiscard]] const DiTConfig& config() const noexcept { return config_; }
  [[nodiscard]] Device& device() const noexcept { return *device_; }
  // Every tensor of the reference state dict with its shape, in a fixed order.
  [[nodiscard]] static std::vector<std::pair<std::string, Shape>> weight_shapes(
      const DiTConfig& config);
  [[nodiscard]] const Tensor& weight(const std::string& name) const;
  // The weights by name (pos_embed included), e.g. for write_safetensors.
  [[nodiscard]] const std::map<std::string, Tensor>& weights() const noexcept { return weights_; }

  // Host values of the model's inputs.
  // Sinusoidal features of timesteps t (in [0, 1000), DDPM's scale): [t.size(), frequency_size],
  // cosines then sines, as the reference's TimestepEmbedder.
  [[nodiscard]] std::vector<float> timestep_frequencies(std::span<const float> t) const;
  // One-hot rows [labels.size(), num_classes + 1]; a label equal to num_classes is the null
  // class (unconditional), anything outside [0, num_classes] an invalid_argument.
  [[nodiscard]] std::vector<float> label_rows(std::span<const std::int64_t> labels) const;

  // The model: latents [B, in_channels, H, W] (H and W multiples of the patch size; the
  // configured size when the position embedding came from a file), t_frequencies [1 or B,
  // frequency_size], labels [B, num_classes + 1] -> [B, out_channels, H, W].
  [[nodiscard]] Tensor forward(const Tensor& latents, const Tensor& t_frequencies,
                               const Tensor& labels) const;
  // The predicted noise with classifier-free guidance: latents [B, ...] run twice in one batch
  // of 2B, labels [2B, classes + 1] (the conditional rows, then as many null rows);
  // eps = eps_uncond + scale (eps_cond - eps_uncond) on all in_channels channels ([B, C_in, H, W]).
  // With scale 1 (no guidance) labels are [B, ...] and the model runs once.
  [[nodiscard]] Tensor guided_noise(const Tensor& latents, const Tensor& t_frequencies,
                                    const Tensor& labels, double cfg_scale) const;
  // One deterministic DDIM step: coefficients [2] = (a, b) from DdimSchedule;
  // latents * a + guided_noise(...) * b.
  [[nodiscard]] Tensor sample_step(const Tensor& latents, const Tensor& t_frequencies,
                                   const Tensor& labels, const Tensor& coefficients,
                                   double cfg_scale) const;

  // One step of a first-order sampler (DDIM, Euler, Euler ancestral: SamplerSchedule):
  // coefficients [4] = (a, b, c, s); x_next = a x + b eps(c x) + s z with eps the guided noise
  // prediction for the input c x and z ~ N(0, 1) from one draw of `noise` (null: no noise
  // term, s ignored). With a generator, traced steps draw new noise on every replay.
  [[nodiscard]] Tensor sampler_step(const Tensor& latents, const Tensor& t_frequencies,
                                    const Tensor& labels, const Tensor& coefficients,
                                    double cfg_scale, Generator* noise) const;

  // Builds the position embedding for latents of height x width (a host upload) so forward
  // needs none; forward does this itself when it runs eagerly, but a capture cannot upload, so
  // call this before capturing a new resolution without a prep run.
  void prepare_resolution(std::int64_t height, std::int64_t width) const;
  // True when the position embedding came from the weights: only the configured latent size.
  [[nodiscard]] bool fixed_resolution() const noexcept { return file_positions_; }

 private:
  void check_config() const;
  Tensor positions(std::int64_t grid_h, std::int64_t grid_w) const;
  Tensor block(const Tensor& x, const Tensor& c, std::int64_t index) const;

  DiTConfig config_;
  Device* device_;
  std::map<std::string, Tensor> weights_;
  bool file_positions_ = false;  // pos_embed came from the weights: one resolution only
  mutable std::mutex positions_mutex_;
  mutable std::map<std::pair<std::int64_t, std::int64_t>, Tensor> positions_;
};

// The fixed 2-D sin-cos position embedding of the reference ([grid_h * grid_w, hidden], host
// values, float64 then rounded): per token (row i, column j), the first hidden/2 values encode j
// and the others i, each as sines then cosines of hidden/4 frequencies 10000^(-k/(hidden/4)).
[[nodiscard]] std::vector<float> sincos_positions(std::int64_t hidden, std::int64_t grid_h,
                                                  std::int64_t grid_w);

// The deterministic DDIM sampler (eta = 0) over the reference's diffusion: 1000 training steps,
// betas linear from 1e-4 to 0.02. `steps` timesteps evenly spaced over [0, 1000), last first.
// Step i moves from timestep[i] to timestep[i+1] (or to the clean image after the last):
// x_next = a_i x + b_i eps with a_i = sqrt(abar_next / abar), b_i = sqrt(1 - abar_next)
// - sqrt(abar_next (1 - abar) / abar).
struct DdimSchedule {
  std::vector<float> timesteps;
  std::vector<float> a, b;
  explicit DdimSchedule(std::int64_t steps);
  [[nodiscard]] std::vector<float> coefficients(std::size_t i) const { return {a[i], b[i]}; }
};

// The samplers of DiT::sampler_step, on DDIM's timesteps (the same spacing) and the
// reference's noise levels sigma_t = sqrt((1 - abar_t) / abar_t) (k-diffusion's discrete
// epsilon-prediction wrapper), the last step going to sigma 0:
//  - ddim:            (a, b, 1, 0) from DdimSchedule (deterministic)
//  - euler:           x in sigma space, c = 1 / sqrt(sigma^2 + 1) scales the model input,
//                     x_next = x + (sigma_next - sigma) eps: (1, sigma_next - sigma, c, 0)
//  - euler_ancestral: Euler to sigma_down, then fresh noise of sigma_up (eta 1):
//                     (1, sigma_down - sigma, c, sigma_up), sigma_up = sigma_next
//                     sqrt(1 - sigma_next^2 / sigma^2), sigma_down = sqrt(sigma_next^2 - sigma_up^2)
// The starting latents are N(0, 1) times initial_scale (1 for DDIM, sqrt(sigma_0^2 + 1) for
// the Euler samplers).
enum class Sampler : std::uint8_t { ddim, euler, euler_ancestral };
[[nodiscard]] std::string_view sampler_name(Sampler sampler) noexcept;  // "euler-ancestral"
// From a name ("ddim", "euler", "euler-ancestral"); invalid_argument listing them otherwise.
[[nodiscard]] Sampler parse_sampler(std::string_view name);
struct SamplerSchedule {
  Sampler sampler;
  std::vector<float> timesteps;
  std::vector<std::array<float, 4>> steps;  // (a, b, c, s) of each step
  float initial_scale = 1.0f;
  SamplerSchedule(Sampler sampler, std::int64_t steps);
  [[nodiscard]] bool stochastic() const noexcept { return sampler == Sampler::euler_ancestral; }
  [[nodiscard]] std::vector<float> coefficients(std::size_t i) const {
    return {steps[i][0], steps[i][1], steps[i][2], steps[i][3]};
  }
};

}  // namespace retrace::models
