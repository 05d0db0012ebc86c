// retrace demo: class-conditional sampling with the DiT (random weights, or a checkpoint in the
// reference layout) on the chosen device: sampler steps (DDIM, Euler, or Euler ancestral with
// noise drawn on the device) with classifier-free guidance, eager and
// traced, at each resolution the model allows (a trace key each), with StateTensors for the
// timestep and the step's coefficients and the tracer's input slot for the latents, as the ttnn
// pipelines do. With --vae, decodes the final latents with the Stable Diffusion VAE (traced, a
// trace key per resolution) and writes the image; otherwise writes the latents as a PNG preview
// when asked (or given --weights). --noise starts from given latents, --save-latents writes the
// final ones (.npy). Exits 1 if traced and eager final latents, or decoded images, differ in any
// bit.
#include "demo_common.hpp"
#include "model_options.hpp"

#include <fmt/ranges.h>
#include <retrace/models/npy.hpp>
#include <retrace/models/preview.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>
#include "util/timing.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <random>

namespace retrace::cli {

namespace {

using timing::Clock;
using timing::median;

struct Result {
  std::string key;
  double eager_ms, traced_ms, capture_ms;
  std::size_t commands, trace_bytes;
  bool identical;
  // With --vae: the decode's times and whether the traced image equals the eager one.
  double decode_eager_ms = 0, decode_traced_ms = 0, decode_capture_ms = 0;
  bool decode_identical = true;
};

// The latents one run of the sampler starts from: a batch of B at H x W.
struct Start {
  std::int64_t batch, height, width;
  std::vector<float> values;
};

// The starting latents of each resolution: --noise's (its batch and size only), else random ones
// at each of the model's demo sizes. Both are scaled by the sampler's initial sigma.
std::vector<Start> starting_latents(const models::DiT& model, const DemoOptions& d,
                                    float initial_scale) {
  const models::DiTConfig& c = model.config();
  std::vector<Start> starts;
  if (!d.noise.empty()) {
    const Tensor noise = models::read_npy(d.noise);
    const Shape& s = noise.shape();
    RETRACE_CHECK(s.rank() == 4 && s[0] >= 1 && s[1] == c.in_channels && s[2] >= 1 && s[3] >= 1,
                  invalid_argument,
                  "demo: --noise {}: latents must be [batch, {}, H, W] with every size positive, "
                  "got {}",
                  d.noise, c.in_channels, s);
    starts.push_back({s[0], s[2], s[3], noise.to_vector<float>()});
  } else {
    for (std::int64_t size : demo_sizes(model)) {
      const auto count = static_cast<std::size_t>(c.in_channels * size * size);
      starts.push_back({1, size, size, initial_latents(count, c.seed, size)});
    }
  }
  for (Start& start : starts) {
    for (float& v : start.values) v *= initial_scale;
  }
  return starts;
}

// --vae: its tensors (memory-mapped) and, before the device opens, the memory its decodes need
// added to the device's default size and trace region: the largest resolution's decode, eager and
// traced (the other resolution's trace is a quarter of it).
std::map<std::string, Tensor> read_vae(ModelOptions& o, const DemoOptions& d) {
  if (d.vae.empty()) return {};
  auto weights = models::read_safetensors(d.vae);
  const models::VaeDecoderConfig config =
      models::infer_vae_decoder_config(weights, models::VaeInference{.dtype = dtype_named(o.dtype)});
  Shape latents{1, config.latent_channels, o.config.input_size, o.config.input_size};
  if (!d.noise.empty()) {
    latents = models::read_npy(d.noise).shape();
  } else if (!o.weights.empty()) {
    try {  // the checkpoint's latent size (a bad file is reported when the model loads)
      const auto c = models::infer_dit_config(models::read_safetensors(o.weights));
      latents = Shape{1, config.latent_channels, c.input_size, c.input_size};
    } catch (const Error&) {
    }
  }
  const std::size_t decode = models::VaeDecoder::decode_bytes(config, latents);
  o.extra_bytes += 3 * decode;
  o.trace_bytes = (std::size_t{256} << 20) + decode + decode / 2;
  return weights;
}

// --vae: the decoder from a diffusers AutoencoderKL file, in the DiT's dtype; its latent channels
// must be the DiT's.
std::unique_ptr<models::VaeDecoder> load_vae(const DemoOptions& d,
                                             const std::map<std::string, Tensor>& weights,
                                             const models::DiTConfig& c, Device& device) {
  if (d.vae.empty()) return nullptr;
  const models::VaeDecoderConfig config =
      models::infer_vae_decoder_config(weights, models::VaeInference{.dtype = c.dtype});
  RETRACE_CHECK(config.latent_channels == c.in_channels, invalid_argument,
                "demo: --vae {} decodes {}-channel latents; the DiT makes {}-channel ones",
                d.vae, config.latent_channels, c.in_channels);
  return std::make_unique<models::VaeDecoder>(config, device, weights);
}

// The traced object: the model and, for a stochastic sampler, the generator of its noise (null
// otherwise). Its traces are its own and bake in both.
struct DemoSampler : TraceOwner {
  const models::DiT* model = nullptr;
  Generator* noise = nullptr;
  Tensor step(const Tensor& latents, const Tensor& t_frequencies, const Tensor& labels,
              const Tensor& coefficients, double cfg_scale) {
    return model->sampler_step(latents, t_frequencies, labels, coefficients, cfg_scale, noise);
  }
};

}  // namespace

void check_demo_fits(const models::DiTConfig& config, std::int64_t batch, const Device& device,
                     const std::string& dtype) {
  const std::size_t activation_bytes = storage_bytes(
      Shape{batch, config.tokens(), config.mlp_width()}, config.dtype, Layout::row_major);
  const std::size_t capacity = device.stats().capacity_bytes;
  RETRACE_CHECK(activation_bytes <= capacity / 4, out_of_memory,
                "demo: the activations ({} tokens x {}, {}, batch {}) need {} and the demo "
                "about 4x that, but {} has {} of memory; lower --input-size or --hidden",
                config.tokens(), config.mlp_width(), dtype, batch,
                human_bytes(activation_bytes), device.name(), human_bytes(capacity));
}

DemoModel load_demo_model(ModelOptions& o, const DemoOptions& d) {
  DemoModel m;
  m.device = open_device(o);
  m.batch = d.cfg_scale != 1.0 ? 2 : 1;
  if (o.weights.empty()) check_demo_fits(o.config, m.batch, *m.device, o.dtype);
  m.model = make_model(o, *m.device);
  const models::DiTConfig& c = m.model->config();
  check_demo_fits(c, m.batch, *m.device, o.dtype);
  m.label = d.label >= 0 ? d.label : (c.num_classes > 207 ? 207 : 0);
  RETRACE_CHECK(m.label < c.num_classes, invalid_argument,
                "demo: --class {}: the model has {} classes (0 to {})", m.label, c.num_classes,
                c.num_classes - 1);
  return m;
}

std::string docs_page(const std::string& page) {
  namespace fs = std::filesystem;
  const std::string file = page.substr(0, page.find('#'));
  std::error_code error;
  const fs::path docs(RETRACE_DOCS_DIR);
  if (!fs::exists(docs / file, error)) return "docs/" + page + " in retrace's sources";
  const fs::path relative = fs::relative(docs, fs::current_path(error), error);
  const fs::path shown = error || relative.empty() ? docs : relative;
  return (shown / page).string();
}

void print_demo_header(const ModelOptions& o, const DemoOptions& d, const models::DiTConfig& c,
                       std::int64_t label, const std::string& where) {
  std::printf(
      "retrace demo: DiT (%lldx%lldx%lld latents, patch %lld, hidden %lld, depth %lld, heads "
      "%lld, %lld classes, %s, %s weights) on %s\n"
      "  %lld %s steps%s, class %lld, %s\n",
      static_cast<long long>(c.in_channels), static_cast<long long>(c.input_size),
      static_cast<long long>(c.input_size), static_cast<long long>(c.patch_size),
      static_cast<long long>(c.hidden), static_cast<long long>(c.depth),
      static_cast<long long>(c.heads), static_cast<long long>(c.num_classes), o.dtype.c_str(),
      o.weights.empty() ? "random" : o.weights.c_str(), where.c_str(),
      static_cast<long long>(o.steps),
      d.sampler == "ddim" ? "DDIM" : d.sampler == "euler" ? "Euler" : "Euler ancestral",
      d.sampler == "euler-ancestral"
          ? fmt::format(" (noise drawn on the device: Philox, seed {})", c.seed).c_str()
          : "",
      static_cast<long long>(label),
      d.cfg_scale != 1.0
          ? fmt::format("classifier-free guidance scale {:g} (batch of 2)", d.cfg_scale).c_str()
          : "no guidance");
}

std::vector<std::int64_t> demo_sizes(const models::DiT& model) {
  // The configured size, and half of it when the position embedding is the computed one.
  const models::DiTConfig& c = model.config();
  std::vector<std::int64_t> sizes{c.input_size};
  const std::int64_t half = c.input_size / 2;
  if (!model.fixed_resolution() && half >= c.patch_size && half % c.patch_size == 0) {
    sizes.push_back(half);
  }
  return sizes;
}

int run_demo(ModelOptions& o, const DemoOptions& d) {
  if (d.mesh > 0) return run_demo_mesh(o, d);
  const std::map<std::string, Tensor> vae_weights = read_vae(o, d);
  auto [device, model, guided_batch, label] = load_demo_model(o, d);
  const models::DiTConfig& c = model->config();
  const bool guided = d.cfg_scale != 1.0;
  const std::string preview =
      d.preview.empty() && !o.weights.empty() && d.vae.empty() ? std::string("dit_sample.png")
                                                                : d.preview;
  const std::string image_out = d.out.empty() ? std::string("dit_sample.png") : d.out;
  const models::SamplerSchedule schedule(models::parse_sampler(d.sampler), o.steps);
  const std::vector<Start> starts = starting_latents(*model, d, schedule.initial_scale);
  for (const Start& start : starts) {
    check_demo_fits(c, start.batch * guided_batch, *device, o.dtype);
  }
  std::unique_ptr<models::VaeDecoder> vae = load_vae(d, vae_weights, c, *device);
  auto decode = traced_method(
      &models::VaeDecoder::decode,
      [](models::VaeDecoder& v) -> Device& { return v.device(); },
      TraceOptions{.name = "VAE decode"});
  // Noise of the ancestral sampler: one generator for the eager run, one in the traced object,
  // both from the model's seed (reseeded at each resolution).
  Generator eager_noise(*device, c.seed), traced_noise(*device, c.seed);
  DemoSampler sampler;
  sampler.model = model.get();
  sampler.noise = schedule.stochastic() ? &traced_noise : nullptr;
  auto step = traced_method(
      &DemoSampler::step, [](DemoSampler& s) -> Device& { return s.model->device(); },
      TraceOptions{.name = "DiT sampler step"});
  print_demo_header(o, d, c, label, device->name());
  if (vae) {
    const models::VaeDecoderConfig& v = vae->config();
    std::printf("  VAE decoder %s (blocks [%s], %lld layers per block, %s): %lldx upscale\n",
                d.vae.c_str(), fmt::format("{}", fmt::join(v.block_out_channels, ", ")).c_str(),
                static_cast<long long>(v.layers_per_block), o.dtype.c_str(),
                static_cast<long long>(v.upscale()));
  }
  if (!d.noise.empty()) {
    std::printf("  starting latents from %s\n", d.noise.c_str());
  }
  auto upload = [&](const std::vector<float>& values, const Shape& shape) {
    return Tensor::from_vector<float>(values, shape, c.dtype).to_device(*device);
  };
  auto frequencies = [&](std::size_t i) {
    return model->timestep_frequencies({&schedule.timesteps[i], 1});
  };
  const Shape freq_shape{1, c.frequency_size};
  std::vector<Result> results;
  for (const Start& run : starts) {
    const bool primary = &run == &starts.front();
    const std::string key = run.batch == 1
                                ? fmt::format("{}x{}", run.height, run.width)
                                : fmt::format("{}x{}x{}", run.batch, run.height, run.width);
    std::printf("%s latents, %lld tokens (trace key \"%s\"):\n", key.c_str(),
                static_cast<long long>((run.height / c.patch_size) * (run.width / c.patch_size)),
                key.c_str());
    model->prepare_resolution(run.height, run.width);
    const Shape shape{run.batch, c.in_channels, run.height, run.width};
    const std::vector<float>& start = run.values;
    // The class for each latent, then (with guidance) as many null-class rows.
    std::vector<std::int64_t> label_list(static_cast<std::size_t>(run.batch), label);
    if (guided) label_list.insert(label_list.end(), static_cast<std::size_t>(run.batch), c.num_classes);
    const Tensor labels = upload(model->label_rows(label_list),
                                 {static_cast<std::int64_t>(label_list.size()), c.num_classes + 1});
    eager_noise.manual_seed(c.seed);
    traced_noise.manual_seed(c.seed);

    // Eager: every op dispatched, one step after the other.
    Progress eager_bar("eager", o.steps);
    std::vector<double> eager_ms;
    Tensor x = upload(start, shape);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const auto n = static_cast<std::size_t>(i);
      x = model->sampler_step(x, upload(frequencies(n), freq_shape), labels,
                              upload(schedule.coefficients(n), {4}), d.cfg_scale,
                              schedule.stochastic() ? &eager_noise : nullptr);
      device->synchronize();
      eager_ms.push_back(timing::milliseconds_since(t0));
      eager_bar.tick(i + 1);
    }
    const std::vector<float> eager_final = x.to_vector<float>();
    eager_bar.finish(fmt::format("median {:.2f} ms/step", median(eager_ms)));

    // Traced: the first step captures, the others replay. The timestep and the step's
    // coefficients live in StateTensors (same buffers every step); the latents go back into the
    // trace's input slot.
    Progress traced_bar("traced", o.steps);
    std::vector<double> traced_ms;
    double capture_ms = 0.0;
    StateTensor timestep, coefficients;
    const Tensor x0 = upload(start, shape);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const auto n = static_cast<std::size_t>(i);
      timestep.update(frequencies(n), freq_shape, Traced::yes, *device, c.dtype);
      coefficients.update(schedule.coefficients(n), {4}, Traced::yes, *device, c.dtype);
      const bool first = !step.tracer(sampler, key);
      const Tensor& latents = first ? x0 : std::get<0>(step.inputs(sampler, key));
      const Tensor& next = step.call(CallOptions{.key = key}, sampler, latents, timestep.data(),
                                     labels, coefficients.data(), d.cfg_scale);
      ops::copy(next, std::get<0>(step.inputs(sampler, key)));
      device->synchronize();
      (first ? capture_ms : traced_ms.emplace_back()) = timing::milliseconds_since(t0);
      traced_bar.tick(i + 1);
    }
    const Tensor& traced_x = std::get<0>(step.inputs(sampler, key));
    const std::vector<float> traced_final = traced_x.to_vector<float>();
    const TraceId trace = step.tracer(sampler, key)->trace_ids().front();
    const TraceInfo info = device->trace_info(trace);
    const double traced_median = traced_ms.empty() ? capture_ms : median(traced_ms);
    traced_bar.finish(fmt::format("median {:.2f} ms/step (first step, with capture: {:.1f} ms)",
                                  traced_median, capture_ms));
    const bool identical = same_bits(traced_final, eager_final);
    std::printf("  trace %llu: %zu commands, %s of private trace memory, %zu outside buffers\n",
                static_cast<unsigned long long>(trace.value), info.commands,
                human_bytes(info.bytes).c_str(), info.external_buffers);
    std::printf("  final latents (%zu values): traced %s eager %s\n", traced_final.size(),
                identical ? "==" : "!=", identical ? "bit for bit" : "-- MISMATCH");
    if (primary && !d.save_latents.empty()) {
      models::write_npy(d.save_latents, traced_x);
      std::printf("  wrote %s (the final latents, float32 %s)\n", d.save_latents.c_str(),
                  shape.to_string().c_str());
    }
    if (primary && !preview.empty()) {
      const models::RgbImage image =
          models::latent_preview(run.batch == 1 ? traced_x : ops::slice(traced_x, 0, 0, 1), 8);
      models::write_png(preview, image);
      std::printf("  wrote %s (%lldx%lld preview of the latents, no VAE)\n", preview.c_str(),
                  static_cast<long long>(image.width), static_cast<long long>(image.height));
    }
    Result result{key, median(eager_ms), traced_median, capture_ms, info.commands, info.bytes,
                  identical};
    if (vae) {
      // The decode, eager and then traced under the same key (the first call captures, the
      // second replays). Each is timed on its second call: the first eager decode also maps
      // fresh device memory and makes the GEMM libraries' kernels, as the capture does.
      auto t0 = Clock::now();
      (void)vae->decode(traced_x);
      device->synchronize();
      const double first_eager_ms = timing::milliseconds_since(t0);
      t0 = Clock::now();
      const Tensor eager_out = vae->decode(traced_x);
      device->synchronize();
      result.decode_eager_ms = timing::milliseconds_since(t0);
      const std::vector<float> eager_image = eager_out.to_vector<float>();
      t0 = Clock::now();
      (void)decode.call(CallOptions{.key = key}, *vae, traced_x);
      device->synchronize();
      result.decode_capture_ms = timing::milliseconds_since(t0);
      t0 = Clock::now();
      const Tensor& image = decode.call(CallOptions{.key = key}, *vae, traced_x);
      device->synchronize();
      result.decode_traced_ms = timing::milliseconds_since(t0);
      result.decode_identical = same_bits(image.to_vector<float>(), eager_image);
      std::printf("  decode  eager %.1f ms, traced %.1f ms (first calls: eager %.1f ms, traced "
                  "with capture %.1f ms); image %s, traced %s eager %s\n",
                  result.decode_eager_ms, result.decode_traced_ms, first_eager_ms,
                  result.decode_capture_ms,
                  image.shape().to_string().c_str(), result.decode_identical ? "==" : "!=",
                  result.decode_identical ? "bit for bit" : "-- MISMATCH");
      if (primary) {
        for (std::int64_t i = 0; i < run.batch; ++i) {
          const std::string path = batch_image_path(image_out, i, run.batch);
          const models::RgbImage rgb = models::vae_image(image, i);
          models::write_png(path, rgb);
          std::printf("  wrote %s (%lldx%lld image decoded by the VAE)\n", path.c_str(),
                      static_cast<long long>(rgb.width), static_cast<long long>(rgb.height));
        }
      }
    }
    results.push_back(result);
  }

  std::printf("summary:\n");
  bool all_identical = true;
  for (const Result& r : results) {
    std::printf("  %7s latents: eager %8.2f ms/step, traced %8.2f ms/step, speedup %.2fx, %s\n",
                r.key.c_str(), r.eager_ms, r.traced_ms, r.eager_ms / r.traced_ms,
                r.identical ? "identical" : "DIFFERENT");
    if (vae) {
      std::printf("  %7s decode:  eager %8.1f ms,      traced %8.1f ms,      speedup %.2fx, %s\n",
                  r.key.c_str(), r.decode_eager_ms, r.decode_traced_ms,
                  r.decode_eager_ms / r.decode_traced_ms,
                  r.decode_identical ? "identical" : "DIFFERENT");
    }
    all_identical = all_identical && r.identical && r.decode_identical;
  }
  std::printf("  live traces: %zu (one per resolution)", step.live_traces(sampler));
  if (vae) std::printf(", and %zu of the decoder", decode.live_traces(*vae));
  std::printf("\n");
  std::printf("what these lines mean: %s\n", docs_page("cli.md#retrace-demo").c_str());
  if (!all_identical) {
    std::fprintf(stderr,
                 "retrace demo: traced and eager results differ; this is a bug, please "
                 "report it with the command line above\n");
    return 1;
  }
  return 0;
}

}  // namespace retrace::cli
