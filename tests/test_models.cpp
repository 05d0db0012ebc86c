// The DiT: traced sampler steps equal eager steps bit for bit (two resolutions, both dtypes),
// guidance, the DDIM schedule, reference-layout checkpoints (configuration inferred, one forward
// pass against a float64 re-implementation, bad files named), and the safetensors reader: round trip, and each malformed file rejected with a clear error.
#include "support.hpp"

#include <retrace/models/dit.hpp>
#include <retrace/models/safetensors.hpp>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <random>
#include <fstream>

namespace retrace {
namespace {

using models::DiT;
using models::DiTConfig;

// A small model of every part (patch 2, 4 latent channels, learned sigma, 10 classes).
DiTConfig small_config(DType dtype = DType::float32) {
  return DiTConfig{.input_size = 8, .hidden = 32, .depth = 2, .heads = 2, .num_classes = 10,
                   .dtype = dtype, .seed = 11};
}

Tensor upload(Device& device, const std::vector<float>& values, const Shape& shape,
              DType dtype = DType::float32) {
  return Tensor::from_vector<float>(values, shape, dtype).to_device(device);
}

class DiTTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Device> device_ = open_cpu_device(CpuDeviceOptions{.guard_bytes = 64});
};

// The demo's loop: DDIM steps with classifier-free guidance, eager and traced (StateTensors for
// the timestep and coefficients, the latents back into the input slot), at two resolutions.
TEST_P(DiTTest, TracedSamplerStepsEqualEagerAtTwoResolutions) {
  const DType dtype = GetParam();
  DiT model(small_config(dtype), *device_);
  auto step = traced_method(&DiT::sample_step, [](DiT& m) -> Device& { return m.device(); });
  const models::DdimSchedule schedule(3);
  const std::vector<std::int64_t> labels{3, 10};  // class 3, then the null class
  const Tensor label_rows = upload(*device_, model.label_rows(labels), {2, 11}, dtype);
  for (std::int64_t size : {8, 4}) {
    const std::string key = std::to_string(size);
    const Shape shape{1, 4, size, size};
    const auto start = testing::random_floats(static_cast<std::size_t>(shape.numel()), size);
    Tensor eager = upload(*device_, start, shape, dtype);
    Tensor slot = upload(*device_, start, shape, dtype);
    StateTensor t, ab;
    for (std::size_t i = 0; i < schedule.timesteps.size(); ++i) {
      const auto features = model.timestep_frequencies({&schedule.timesteps[i], 1});
      eager = model.sample_step(eager, upload(*device_, features, {1, 256}, dtype), label_rows,
                                upload(*device_, schedule.coefficients(i), {2}, dtype), 2.5);
      t.update(features, {1, 256}, Traced::yes, *device_, dtype);
      ab.update(schedule.coefficients(i), {2}, Traced::yes, *device_, dtype);
      const Tensor& next =
          step.call(CallOptions{.key = key}, model, slot, t.data(), label_rows, ab.data(), 2.5);
      ops::copy(next, slot);
    }
    EXPECT_EQ(slot.to_vector<float>(), eager.to_vector<float>()) << size << "x" << size;
    for (float v : slot.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(step.live_traces(model), 2u);
  EXPECT_EQ(step.stats().replays, 4u);
}

INSTANTIATE_TEST_SUITE_P(DTypes, DiTTest,
                         ::testing::Values(DType::float32, DType::bfloat16, DType::float16),
                         [](const auto& param_info) { return std::string(dtype_name(param_info.param)); });

// Guidance is eps_u + s (eps_c - eps_u) over the in_channels noise channels of one batch of 2B.
TEST(DiTModelTest, GuidanceCombinesTheConditionalAndNullHalves) {
  auto device = open_cpu_device();
  DiT model(small_config(), *device);
  const float t = 400.0f;
  const Tensor freq = upload(*device, model.timestep_frequencies({&t, 1}), {1, 256});
  const Tensor x = upload(*device, testing::random_floats(4 * 64, 5), {1, 4, 8, 8});
  const std::vector<std::int64_t> cond{7}, null{10}, both{7, 10};
  const Tensor out_c = model.forward(x, freq, upload(*device, model.label_rows(cond), {1, 11}));
  const Tensor out_u = model.forward(x, freq, upload(*device, model.label_rows(null), {1, 11}));
  EXPECT_EQ(out_c.shape(), Shape({1, 8, 8, 8}));  // learned sigma: 2 x 4 channels
  const auto c = out_c.to_vector<float>(), u = out_u.to_vector<float>();
  const auto guided =
      model.guided_noise(x, freq, upload(*device, model.label_rows(both), {2, 11}), 3.0)
          .to_vector<float>();
  ASSERT_EQ(guided.size(), 4u * 64);
  for (std::size_t i = 0; i < guided.size(); ++i) {  // channel-major: the first 4 x 64 values
    const double want = u[i] + 3.0 * (double(c[i]) - u[i]);
    EXPECT_NEAR(guided[i], want, 1e-5 * (1.0 + std::abs(want))) << i;
  }
  EXPECT_NE(c, u);  // the label matters
}

TEST(DiTModelTest, DdimScheduleFollowsTheReferenceSpacing) {
  const models::DdimSchedule fifty(50);
  ASSERT_EQ(fifty.timesteps.size(), 50u);
  EXPECT_EQ(fifty.timesteps.front(), 980.0f);  // stride 20 from 0, last first
  EXPECT_EQ(fifty.timesteps.back(), 0.0f);
  // The last step lands on the clean image: a = 1/sqrt(abar_0), b = -sqrt(1-abar_0)/sqrt(abar_0).
  const double abar0 = 1.0 - 1e-4;
  EXPECT_NEAR(fifty.a.back(), 1.0 / std::sqrt(abar0), 1e-6);
  EXPECT_NEAR(fifty.b.back(), -std::sqrt(1.0 - abar0) / std::sqrt(abar0), 1e-6);
  const models::DdimSchedule one(1);
  EXPECT_EQ(one.timesteps, std::vector<float>{0.0f});
  EXPECT_RETRACE_ERROR(models::DdimSchedule(0), invalid_argument, "steps must be from 1 to 1000");
  EXPECT_RETRACE_ERROR(models::DdimSchedule(1001), invalid_argument, "got 1001");
}

// The Euler samplers against k-diffusion's formulas, written out here in double.
TEST(DiTModelTest, SamplerSchedulesFollowKDiffusion) {
  using models::Sampler;
  using models::SamplerSchedule;
  std::vector<double> abar;
  double product = 1.0;
  for (int t = 0; t < 1000; ++t) abar.push_back(product *= 1.0 - (1e-4 + (0.02 - 1e-4) * t / 999.0));
  const SamplerSchedule euler(Sampler::euler, 10), ancestral(Sampler::euler_ancestral, 10);
  const models::DdimSchedule ddim(10);
  ASSERT_EQ(euler.timesteps, ddim.timesteps);
  ASSERT_EQ(ancestral.timesteps, ddim.timesteps);
  const auto sigma = [&](std::size_t i) {
    if (i >= ddim.timesteps.size()) return 0.0;
    const double a = abar[static_cast<std::size_t>(ddim.timesteps[i])];
    return std::sqrt((1 - a) / a);
  };
  double variance_check = 0;
  for (std::size_t i = 0; i < ddim.timesteps.size(); ++i) {
    const double s = sigma(i), next = sigma(i + 1);
    const std::vector<float> k = euler.coefficients(i);
    EXPECT_EQ(k[0], 1.0f);
    EXPECT_NEAR(k[1], next - s, 1e-6 * s);
    EXPECT_NEAR(k[2], 1.0 / std::sqrt(s * s + 1), 1e-7);
    EXPECT_EQ(k[3], 0.0f);
    const double up = std::sqrt(next * next * (s * s - next * next) / (s * s));
    const double down = std::sqrt(next * next - up * up);
    const std::vector<float> a = ancestral.coefficients(i);
    EXPECT_NEAR(a[1], down - s, 1e-6 * s);
    EXPECT_NEAR(a[3], up, 1e-6 * (1 + up));
    EXPECT_EQ(a[2], k[2]);
    variance_check = std::max(variance_check, std::abs(up * up + down * down - next * next));
  }
  EXPECT_LT(variance_check, 1e-6);
  // The last step reaches sigma 0: no noise is added after it.
  EXPECT_EQ(ancestral.steps.back()[3], 0.0f);
  EXPECT_NEAR(euler.initial_scale, std::sqrt(sigma(0) * sigma(0) + 1), 1e-3);
  EXPECT_EQ(SamplerSchedule(Sampler::ddim, 10).initial_scale, 1.0f);
  EXPECT_FALSE(euler.stochastic());
  EXPECT_TRUE(ancestral.stochastic());
  EXPECT_EQ(models::parse_sampler("euler-ancestral"), Sampler::euler_ancestral);
  EXPECT_EQ(models::sampler_name(Sampler::ddim), "ddim");
  EXPECT_RETRACE_ERROR((void)models::parse_sampler("heun"), invalid_argument,
                       "unknown sampler \"heun\" (ddim, euler or euler-ancestral)");
  EXPECT_RETRACE_ERROR(SamplerSchedule(Sampler::euler, 0), invalid_argument,
                       "euler: steps must be from 1 to 1000");
}

// sampler_step with DDIM's coefficients is sample_step, bit for bit; with a generator, the
// ancestral sampler traced equals eager (the same seed) and its replays draw new noise.
struct NoisySampler : TraceOwner {
  const DiT* model = nullptr;
  Generator* noise = nullptr;
  Tensor step(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& k) {
    return model->sampler_step(x, t, labels, k, 2.0, noise);
  }
};

TEST(DiTModelTest, SamplerStepsDdimAndAncestralTracedEqualEager) {
  auto device = open_cpu_device();
  DiT model(small_config(), *device);
  const std::vector<std::int64_t> labels{3, 10};
  const Tensor rows = upload(*device, model.label_rows(labels), {2, 11});
  const Tensor x = upload(*device, testing::random_floats(4 * 64, 9), {1, 4, 8, 8});
  const models::DdimSchedule ddim(4);
  const models::SamplerSchedule ddim4(models::Sampler::ddim, 4);
  const auto freq = [&](const std::vector<float>& ts, std::size_t i) {
    return upload(*device, model.timestep_frequencies({&ts[i], 1}), {1, 256});
  };
  const Tensor old_way = model.sample_step(x, freq(ddim.timesteps, 0), rows,
                                           upload(*device, ddim.coefficients(0), {2}), 2.0);
  const Tensor new_way = model.sampler_step(x, freq(ddim.timesteps, 0), rows,
                                            upload(*device, ddim4.coefficients(0), {4}), 2.0, nullptr);
  EXPECT_EQ(old_way.to_vector<float>(), new_way.to_vector<float>());

  const models::SamplerSchedule schedule(models::Sampler::euler_ancestral, 4);
  Generator eager_noise(*device, 5), traced_noise(*device, 5);
  NoisySampler sampler;
  sampler.model = &model;
  sampler.noise = &traced_noise;
  auto step = traced_method(&NoisySampler::step,
                            [](NoisySampler& s) -> Device& { return s.model->device(); });
  Tensor eager = ops::mul(x, static_cast<double>(schedule.initial_scale));
  Tensor slot = eager.clone();
  StateTensor t, k;
  for (std::size_t i = 0; i < schedule.timesteps.size(); ++i) {
    eager = model.sampler_step(eager, freq(schedule.timesteps, i), rows,
                               upload(*device, schedule.coefficients(i), {4}), 2.0, &eager_noise);
    t.update(model.timestep_frequencies({&schedule.timesteps[i], 1}), {1, 256}, Traced::yes,
             *device, DType::float32);
    k.update(schedule.coefficients(i), {4}, Traced::yes, *device, DType::float32);
    ops::copy(step(sampler, slot, t.data(), rows, k.data()), slot);
    ASSERT_EQ(slot.to_vector<float>(), eager.to_vector<float>()) << "step " << i;
  }
  EXPECT_EQ(step.stats().captures, 1u);
  EXPECT_EQ(traced_noise.offset(), 4u);
  EXPECT_EQ(eager_noise.offset(), 4u);
  // Other noise, other result: the draws reach the latents.
  Generator other(*device, 6);
  const Tensor z = model.sampler_step(x, freq(schedule.timesteps, 0), rows,
                                      upload(*device, schedule.coefficients(0), {4}), 2.0, &other);
  eager_noise.manual_seed(5);
  const Tensor z5 = model.sampler_step(x, freq(schedule.timesteps, 0), rows,
                                       upload(*device, schedule.coefficients(0), {4}), 2.0, &eager_noise);
  EXPECT_NE(z.to_vector<float>(), z5.to_vector<float>());
  EXPECT_RETRACE_ERROR((void)model.sampler_step(x, freq(schedule.timesteps, 0), rows,
                                                upload(*device, ddim.coefficients(0), {2}), 2.0,
                                                nullptr),
                       invalid_argument, "coefficients must be [4] (see SamplerSchedule), got [2]");
}

TEST(DiTModelTest, RejectsBadConfigsAndInputs) {
  auto device = open_cpu_device();
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.hidden = 36, .heads = 8}, *device), invalid_argument,
                       "hidden (36) must be divisible by heads (8)");
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.input_size = 9}, *device), invalid_argument,
                       "input_size (9) must be a multiple of patch_size (2)");
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.hidden = 6, .heads = 2}, *device), invalid_argument,
                       "hidden (6) must be a multiple of 4");
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.num_classes = 0}, *device), invalid_argument,
                       "num_classes must be from 1");
  std::map<std::string, Tensor> none;
  EXPECT_RETRACE_ERROR(DiT(small_config(), *device, none), invalid_argument,
                       "the weights have no tensor \"x_embedder.proj.weight\"");
  DiT model(small_config(), *device);
  const float t = 1.0f;
  const Tensor freq = upload(*device, model.timestep_frequencies({&t, 1}), {1, 256});
  const std::vector<std::int64_t> one{1};
  const Tensor labels = upload(*device, model.label_rows(one), {1, 11});
  EXPECT_RETRACE_ERROR((void)model.forward(ops::full({1, 4, 7, 8}, 0.0, *device), freq, labels),
                       invalid_argument,
                       "latents must be [batch, 4, H, W] with H and W positive multiples of the "
                       "patch size 2, got [1, 4, 7, 8]");
  EXPECT_RETRACE_ERROR((void)model.forward(ops::full({1, 4, 8, 8}, 0.0, *device),
                                           ops::full({1, 32}, 0.0, *device), labels),
                       invalid_argument, "timestep frequencies must be [1 or 1, 256], got [1, 32]");
  EXPECT_RETRACE_ERROR((void)model.forward(ops::full({2, 4, 8, 8}, 0.0, *device), freq, labels),
                       invalid_argument, "labels must be one-hot rows [2, 11]");
  EXPECT_RETRACE_ERROR((void)model.guided_noise(ops::full({1, 4, 8, 8}, 0.0, *device), freq,
                                                labels, 4.0),
                       invalid_argument, "with guidance, labels need 2 rows");
  const std::vector<std::int64_t> bad{3, 11};
  EXPECT_RETRACE_ERROR((void)model.label_rows(bad), invalid_argument,
                       "class label 11 (at 1) is outside [0, 10] (10 is the null class)");
}

// --- checkpoints in the reference layout ---------------------------------------------------------

// Random weights for every tensor of the reference state dict, all of them O(1) in effect (no
// zeroed adaLN), so every part of the model shows in the output.
std::map<std::string, Tensor> reference_weights(const DiTConfig& config, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, shape] : DiT::weight_shapes(config)) {
    const double fan_in = static_cast<double>(shape.numel() / shape[0]);
    const bool bias = name.ends_with(".bias");
    std::normal_distribution<float> dist(0.0f, bias ? 0.1f : static_cast<float>(1.0 / std::sqrt(fan_in)));
    std::vector<float> v(static_cast<std::size_t>(shape.numel()));
    for (float& x : v) x = dist(rng);
    if (name == "pos_embed") v = models::sincos_positions(config.hidden, config.grid(), config.grid());
    weights[name] = Tensor::from_vector<float>(v, shape, DType::float32);
  }
  return weights;
}

// The reference DiT's forward pass in float64, written from its definition with plain loops (the
// patch embedding as the convolution it is, the unpatchify as an index map), for one batch.
class Float64DiT {
 public:
  Float64DiT(const DiTConfig& c, const std::map<std::string, Tensor>& weights) : c_(c) {
    for (const auto& [name, t] : weights) {
      const auto f = t.to_vector<float>();
      w_[name] = std::vector<double>(f.begin(), f.end());
    }
  }

  // x [B, C_in, H, W], t_freq [F], labels [B] -> [B, C_out, H, W].
  std::vector<double> forward(const std::vector<double>& x, const std::vector<double>& t_freq,
                              const std::vector<std::int64_t>& labels) const {
    const std::int64_t h = c_.hidden, p = c_.patch_size, g = c_.grid(), T = c_.tokens();
    const std::int64_t side = c_.input_size, cin = c_.in_channels, cout = c_.out_channels();
    std::vector<double> out;
    for (std::size_t b = 0; b < labels.size(); ++b) {
      const double* xb = x.data() + b * static_cast<std::size_t>(cin * side * side);
      std::vector<double> tok(static_cast<std::size_t>(T * h));
      const auto& conv = w("x_embedder.proj.weight");
      for (std::int64_t gi = 0; gi < g; ++gi)
        for (std::int64_t gj = 0; gj < g; ++gj)
          for (std::int64_t o = 0; o < h; ++o) {
            double sum = w("x_embedder.proj.bias")[o];
            for (std::int64_t ci = 0; ci < cin; ++ci)
              for (std::int64_t ki = 0; ki < p; ++ki)
                for (std::int64_t kj = 0; kj < p; ++kj)
                  sum += conv[((o * cin + ci) * p + ki) * p + kj] *
                         xb[(ci * side + gi * p + ki) * side + gj * p + kj];
            tok[(gi * g + gj) * h + o] = sum + w("pos_embed")[(gi * g + gj) * h + o];
          }
      std::vector<double> temb = linear(t_freq, 1, "t_embedder.mlp.0");
      for (double& v : temb) v = silu(v);
      temb = linear(temb, 1, "t_embedder.mlp.2");
      std::vector<double> cond(static_cast<std::size_t>(h));
      for (std::int64_t j = 0; j < h; ++j)
        cond[j] = silu(temb[j] + w("y_embedder.embedding_table.weight")[labels[b] * h + j]);
      for (std::int64_t blk = 0; blk < c_.depth; ++blk) block(tok, cond, blk);
      const auto mod = linear(cond, 1, "final_layer.adaLN_modulation.1");
      std::vector<double> y = modulated_norm(tok, mod, 0, 1);
      y = linear(y, T, "final_layer.linear");
      std::vector<double> img(static_cast<std::size_t>(cout * side * side));
      for (std::int64_t gi = 0; gi < g; ++gi)
        for (std::int64_t gj = 0; gj < g; ++gj)
          for (std::int64_t pi = 0; pi < p; ++pi)
            for (std::int64_t pj = 0; pj < p; ++pj)
              for (std::int64_t ch = 0; ch < cout; ++ch)
                img[(ch * side + gi * p + pi) * side + gj * p + pj] =
                    y[(gi * g + gj) * p * p * cout + (pi * p + pj) * cout + ch];
      out.insert(out.end(), img.begin(), img.end());
    }
    return out;
  }

 private:
  const std::vector<double>& w(const std::string& name) const { return w_.at(name); }
  static double silu(double v) { return v / (1.0 + std::exp(-v)); }
  // rows x in -> rows x out with weight [out, in] and bias [out].
  std::vector<double> linear(const std::vector<double>& x, std::int64_t rows,
                             const std::string& prefix) const {
    const auto& weight = w(prefix + ".weight");
    const auto& bias = w(prefix + ".bias");
    const auto out = static_cast<std::int64_t>(bias.size());
    const std::int64_t in = static_cast<std::int64_t>(x.size()) / rows;
    std::vector<double> y(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        double sum = bias[o];
        for (std::int64_t i = 0; i < in; ++i) sum += x[r * in + i] * weight[o * in + i];
        y[r * out + o] = sum;
      }
    return y;
  }
  // LayerNorm (no affine, eps 1e-6) then x (1 + scale) + shift, with shift and scale chunks
  // `shift` and `scale` of the modulation vector.
  std::vector<double> modulated_norm(const std::vector<double>& x, const std::vector<double>& mod,
                                     std::int64_t shift, std::int64_t scale) const {
    const std::int64_t h = c_.hidden, rows = static_cast<std::int64_t>(x.size()) / h;
    std::vector<double> y(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (std::int64_t j = 0; j < h; ++j) mean += x[r * h + j];
      mean /= static_cast<double>(h);
      for (std::int64_t j = 0; j < h; ++j) var += (x[r * h + j] - mean) * (x[r * h + j] - mean);
      const double inv = 1.0 / std::sqrt(var / static_cast<double>(h) + 1e-6);
      for (std::int64_t j = 0; j < h; ++j)
        y[r * h + j] = (x[r * h + j] - mean) * inv * (1.0 + mod[scale * h + j]) + mod[shift * h + j];
    }
    return y;
  }
  void block(std::vector<double>& x, const std::vector<double>& cond, std::int64_t blk) const {
    const std::int64_t h = c_.hidden, T = c_.tokens(), heads = c_.heads, d = h / heads;
    const std::string pre = "blocks." + std::to_string(blk) + ".";
    const auto mod = linear(cond, 1, pre + "adaLN_modulation.1");
    const auto qkv = linear(modulated_norm(x, mod, 0, 1), T, pre + "attn.qkv");
    std::vector<double> attn(static_cast<std::size_t>(T * h)), scores(static_cast<std::size_t>(T));
    for (std::int64_t hd = 0; hd < heads; ++hd)
      for (std::int64_t i = 0; i < T; ++i) {
        double top = -INFINITY, total = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += qkv[i * 3 * h + hd * d + e] * qkv[j * 3 * h + h + hd * d + e];
          scores[j] = dot / std::sqrt(static_cast<double>(d));
          top = std::max(top, scores[j]);
        }
        for (double& s : scores) total += (s = std::exp(s - top));
        for (std::int64_t e = 0; e < d; ++e) {
          double sum = 0;
          for (std::int64_t j = 0; j < T; ++j) sum += scores[j] * qkv[j * 3 * h + 2 * h + hd * d + e];
          attn[i * h + hd * d + e] = sum / total;
        }
      }
    const auto proj = linear(attn, T, pre + "attn.proj");
    for (std::int64_t i = 0; i < T * h; ++i) x[i] += mod[2 * h + i % h] * proj[i];
    auto hidden = linear(modulated_norm(x, mod, 3, 4), T, pre + "mlp.fc1");
    for (double& v : hidden)
      v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    const auto mlp = linear(hidden, T, pre + "mlp.fc2");
    for (std::int64_t i = 0; i < T * h; ++i) x[i] += mod[5 * h + i % h] * mlp[i];
  }

  DiTConfig c_;
  std::map<std::string, std::vector<double>> w_;
};

class ReferenceCheckpointTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    return (std::filesystem::path(testing::scratch_dir("retrace_dit_checkpoint_test")) / name).string();
  }
  std::unique_ptr<Device> device_ = open_cpu_device();
};

// DiT-S/2 (hidden 384, 6 heads, patch 2) at a 32x32 latent with 4 channels, learned sigma and
// 1000 classes, two blocks instead of 12 (the float64 reference is plain loops): written in the
// reference layout, read back, its configuration inferred, one forward pass of a batch of two
// (two labels, one of them the null class) against the float64 reference.
TEST_F(ReferenceCheckpointTest, DiTS2LoadsAndMatchesAFloat64Reference) {
  const DiTConfig want{.input_size = 32, .patch_size = 2, .in_channels = 4, .hidden = 384,
                       .depth = 2, .heads = 6, .num_classes = 1000};
  const auto weights = reference_weights(want, 21);
  const std::string file = path("dit_s2.safetensors");
  models::write_safetensors(file, weights);

  const auto host = models::read_safetensors(file);
  const DiTConfig c = models::infer_dit_config(host);
  EXPECT_EQ(c.input_size, 32);
  EXPECT_EQ(c.patch_size, 2);
  EXPECT_EQ(c.in_channels, 4);
  EXPECT_EQ(c.hidden, 384);
  EXPECT_EQ(c.depth, 2);
  EXPECT_EQ(c.heads, 6);  // hidden / 64, the reference's head width
  EXPECT_EQ(c.mlp_width(), 1536);
  EXPECT_EQ(c.num_classes, 1000);
  EXPECT_TRUE(c.learn_sigma);
  EXPECT_EQ(c.frequency_size, 256);
  DiT model(c, *device_, host);
  EXPECT_TRUE(model.fixed_resolution());

  const std::vector<float> x = testing::random_floats(2 * 4 * 32 * 32, 9, -2.0f, 2.0f);
  const float t = 637.0f;
  const std::vector<float> freq = model.timestep_frequencies({&t, 1});
  const std::vector<std::int64_t> labels{207, 1000};
  const Tensor out = model.forward(upload(*device_, x, {2, 4, 32, 32}),
                                   upload(*device_, freq, {1, 256}),
                                   upload(*device_, model.label_rows(labels), {2, 1001}));
  ASSERT_EQ(out.shape(), Shape({2, 8, 32, 32}));
  const std::vector<float> got = out.to_vector<float>();
  const std::vector<double> ref = Float64DiT(c, weights).forward(
      std::vector<double>(x.begin(), x.end()), std::vector<double>(freq.begin(), freq.end()),
      labels);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  std::printf("[retrace] DiT-S/2 forward vs float64: max |diff| %.3g, max |ref| %.3g\n", worst,
              scale);
  EXPECT_GT(scale, 0.1);
  // float32 rounding through two blocks of width 384 and 1536: observed ~1e-6 of the scale.
  EXPECT_LT(worst, 2e-5 * scale);
}

TEST_F(ReferenceCheckpointTest, MissingExtraAndMisshapenTensorsAreNamed) {
  const DiTConfig c{.input_size = 8, .hidden = 64, .depth = 2, .heads = 1, .num_classes = 5};
  const auto good = reference_weights(c, 3);
  DiTConfig inferred = models::infer_dit_config(good);
  EXPECT_EQ(inferred.heads, 1);
  EXPECT_EQ(inferred.depth, 2);
  EXPECT_EQ(inferred.num_classes, 5);
  DiT ok(inferred, *device_, good);

  auto without = good;
  without.erase("blocks.1.mlp.fc2.bias");
  EXPECT_RETRACE_ERROR(DiT(inferred, *device_, without), invalid_argument,
                       "the weights have no tensor \"blocks.1.mlp.fc2.bias\" (expected shape [64])");
  auto extra = good;
  extra["blocks.0.attn.q_norm.weight"] = Tensor::from_vector<float>({1.0f}, {1}, DType::float32);
  extra["ema_decay"] = Tensor::from_vector<float>({1.0f}, {1}, DType::float32);
  EXPECT_RETRACE_ERROR(DiT(inferred, *device_, extra), invalid_argument,
                       "the weights have 2 tensors this model does not use: "
                       "\"blocks.0.attn.q_norm.weight\", \"ema_decay\"");
  DiT warned(inferred, *device_, extra, models::UnusedWeights::warn);  // a warning only
  auto misshapen = good;
  misshapen["blocks.0.attn.qkv.weight"] = Tensor::from_vector<float>(
      std::vector<float>(3 * 64 * 32), {3 * 64, 32}, DType::float32);
  EXPECT_RETRACE_ERROR(DiT(inferred, *device_, misshapen), invalid_argument,
                       "weight \"blocks.0.attn.qkv.weight\" has shape [192, 32], expected [192, 64]");
  // Configuration errors name the tensor they come from.
  auto gap = good;
  for (auto it = gap.begin(); it != gap.end();) {
    it = it->first.starts_with("blocks.0.") ? gap.erase(it) : std::next(it);
  }
  EXPECT_RETRACE_ERROR((void)models::infer_dit_config(gap), invalid_argument,
                       "the weights have blocks up to blocks.1 but no tensor of blocks.0");
  auto bad_final = good;
  bad_final["final_layer.linear.weight"] = Tensor::from_vector<float>(
      std::vector<float>(12 * 64), {12, 64}, DType::float32);
  EXPECT_RETRACE_ERROR((void)models::infer_dit_config(bad_final), invalid_argument,
                       "\"final_layer.linear.weight\" has 12 rows; expected patch^2 x channels = "
                       "16 or, with learned sigma, 32");
  auto no_embedder = good;
  no_embedder.erase("x_embedder.proj.weight");
  EXPECT_RETRACE_ERROR((void)models::infer_dit_config(no_embedder), invalid_argument,
                       "no tensor \"x_embedder.proj.weight\", so they are not a DiT checkpoint");
  // 64-wide heads cannot be assumed for hidden 96: the number must be given.
  const auto odd = reference_weights(DiTConfig{.input_size = 4, .hidden = 96, .depth = 1,
                                               .heads = 2, .num_classes = 2}, 4);
  EXPECT_RETRACE_ERROR((void)models::infer_dit_config(odd), invalid_argument,
                       "hidden (96) is not a multiple of 64");
  EXPECT_EQ(models::infer_dit_config(odd, {.heads = 3}).heads, 3);
  // No pos_embed: computed, given the latent size; the model then runs at other sizes too.
  auto no_positions = good;
  no_positions.erase("pos_embed");
  EXPECT_RETRACE_ERROR((void)models::infer_dit_config(no_positions), invalid_argument,
                       "no \"pos_embed\", so the latent size must be given");
  const DiTConfig sized = models::infer_dit_config(no_positions, {.input_size = 8});
  DiT computed(sized, *device_, no_positions);
  EXPECT_FALSE(computed.fixed_resolution());
  EXPECT_EQ(computed.weight("pos_embed").to_vector<float>(), good.at("pos_embed").to_vector<float>());
  // A file's pos_embed fixes the resolution.
  const float t = 10.0f;
  const std::vector<std::int64_t> label{1};
  EXPECT_RETRACE_ERROR(
      (void)ok.forward(ops::full({1, 4, 4, 4}, 0.0, *device_),
                       upload(*device_, ok.timestep_frequencies({&t, 1}), {1, 256}),
                       upload(*device_, ok.label_rows(label), {1, 6})),
      invalid_argument, "the checkpoint's pos_embed is for 8x8 latents (4x4 patches); these "
                        "latents have 2x2 patches");
}

// Writes a reference-layout checkpoint to $RETRACE_DIT_CHECKPOINT (for the CLI tests of
// `retrace demo --weights`), with a NaN in a bias when $RETRACE_DIT_CHECKPOINT_NAN is set (the
// demo must still find traced == eager: NaN equals itself bit for bit).
TEST(DiTWeightsTest, WritesACheckpointForTheCli) {
  const char* out = std::getenv("RETRACE_DIT_CHECKPOINT");
  if (out == nullptr) GTEST_SKIP() << "RETRACE_DIT_CHECKPOINT is not set (set by CTest)";
  const DiTConfig config{.input_size = 8, .hidden = 64, .depth = 1, .heads = 1, .num_classes = 16};
  auto weights = reference_weights(config, 3);
  if (std::getenv("RETRACE_DIT_CHECKPOINT_NAN") != nullptr) {
    std::vector<float> bias = weights["final_layer.linear.bias"].to_vector<float>();
    bias[3] = std::numeric_limits<float>::quiet_NaN();
    weights["final_layer.linear.bias"] =
        Tensor::from_vector<float>(bias, {static_cast<std::int64_t>(bias.size())}, DType::float32);
  }
  models::write_safetensors(out, weights);
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    return (std::filesystem::path(testing::scratch_dir("retrace_safetensors_test")) / name).string();
  }
  // Writes an 8-byte length, the header text and the data bytes.
  std::string raw_file(const std::string& name, const std::string& header, std::size_t data_bytes,
                       std::optional<std::uint64_t> claimed = std::nullopt) {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t size = claimed.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << std::string(data_bytes, '\0');
    return p;
  }
};

TEST_F(SafetensorsTest, RoundTripGivesTheSameModel) {
  auto device = open_cpu_device();
  const DiTConfig config = small_config();
  DiT seeded(config, *device);
  std::map<std::string, Tensor> weights = seeded.weights();
  weights["extra.u8"] = Tensor::from_vector<float>({1.0f, 2.0f}, {2}, DType::uint8);
  const std::string file = path("model.safetensors");
  models::write_safetensors(file, weights);
  auto loaded = models::read_safetensors(file);
  EXPECT_EQ(loaded.size(), weights.size());
  EXPECT_EQ(loaded.at("extra.u8").to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  loaded.erase("extra.u8");
  DiT reloaded(models::infer_dit_config(loaded, {.heads = 2}), *device, loaded);
  Tensor x = ops::full({1, 4, 8, 8}, 0.3, *device);
  const float time = 700.0f;
  const std::vector<std::int64_t> label{4};
  Tensor t = upload(*device, seeded.timestep_frequencies({&time, 1}), {1, 256});
  Tensor y = upload(*device, seeded.label_rows(label), {1, 11});
  EXPECT_EQ(reloaded.forward(x, t, y).to_vector<float>(), seeded.forward(x, t, y).to_vector<float>());
}

TEST_F(SafetensorsTest, ReadsHalfAndBFloat16) {
  // F16 1.0 = 0x3c00, -2.0 = 0xc000; BF16 1.5 = 0x3fc0.
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"__metadata__":{"format":"pt"}})";
  const std::string p = path("half.safetensors");
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t size = header.size();
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << header;
  const unsigned char data[] = {0x00, 0x3c, 0x00, 0xc0, 0xc0, 0x3f};
  out.write(reinterpret_cast<const char*>(data), sizeof data);
  out.close();
  const auto t = models::read_safetensors(p);
  EXPECT_EQ(t.at("h").dtype(), DType::float16);
  EXPECT_EQ(t.at("h").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(t.at("b").dtype(), DType::bfloat16);
  EXPECT_EQ(t.at("b").to_vector<float>(), (std::vector<float>{1.5f}));
}

TEST_F(SafetensorsTest, MalformedFilesAreClearErrors) {
  const std::string tiny = path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(tiny), invalid_argument,
                       "is truncated: 3 bytes, not even the 8-byte header length");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(raw_file("long.safetensors", "{}", 0, 100)),
                       invalid_argument, "is truncated: the header claims 100 bytes");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(raw_file("json.safetensors", "{not json", 0)),
                       invalid_argument, "the header is not valid JSON");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file("fields.safetensors", R"({"w":{"dtype":"F32"}})", 0)),
      invalid_argument, "tensor \"w\" needs dtype, shape and data_offsets");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "dtype.safetensors", R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\" has dtype F64; supported: F32, BF16, F16, I32, U32, U8");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)),
      invalid_argument, "tensor \"w\" has data_offsets outside the 8 bytes of data");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\" has 8 bytes of data but shape [3] of F32 needs 12");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "types.safetensors", R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\": shape must be an array");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(path("missing.safetensors")),
                       invalid_argument, "cannot open");
}

}  // namespace
}  // namespace retrace
