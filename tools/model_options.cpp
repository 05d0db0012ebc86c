#include "model_options.hpp"

#include <retrace/models/safetensors.hpp>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <tuple>

namespace retrace::cli {

CLI::Validator whole_number(std::int64_t min, std::int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && ptr == end && value >= min && value <= max) return {};
        return fmt::format("must be a whole number from {} to {}, got '{}'", min, max, text);
      },
      fmt::format("INT in [{}, {}]", min, max));
}

namespace {

// "1073741824", "512M", "8G", "1T" (binary units) -> bytes; nullopt when malformed or over 2^50.
std::optional<std::size_t> parse_bytes(const std::string& text) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || ptr == text.data()) return std::nullopt;
  int shift = 0;
  if (ptr != end) {
    if (ptr + 1 != end) return std::nullopt;
    switch (*ptr) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      case 'T': case 't': shift = 40; break;
      default: return std::nullopt;
    }
  }
  constexpr std::uint64_t kMax = std::uint64_t{1} << 50;
  if (value == 0 || value > (kMax >> shift)) return std::nullopt;
  return static_cast<std::size_t>(value << shift);
}

// Device memory the model needs, roughly: its weights (twice over for a file whose dtype is
// converted), plus 1 GiB for activations and traces.
std::size_t model_bytes(const ModelOptions& o) {
  std::size_t weights = 0;
  if (!o.weights.empty()) {
    std::error_code error;
    weights = 2 * static_cast<std::size_t>(std::filesystem::file_size(o.weights, error));
    if (error) weights = 0;
  } else {
    try {
      for (const auto& [name, shape] : models::DiT::weight_shapes(o.config)) {
        weights += static_cast<std::size_t>(shape.numel()) * 4;
      }
    } catch (const Error&) {
      weights = 0;  // a bad configuration: the model's own checks will say what is wrong
    }
  }
  return weights + (std::size_t{1} << 30) + o.extra_bytes;
}

}  // namespace

DType dtype_named(const std::string& name) {
  return name == "bfloat16" ? DType::bfloat16 : name == "float16" ? DType::float16 : DType::float32;
}

std::string batch_image_path(const std::string& path, std::int64_t i, std::int64_t batch) {
  if (batch == 1) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / fmt::format("{}_{}{}", p.stem().string(), i, p.extension().string()))
      .string();
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return parse_bytes(text) ? std::string()
                                 : fmt::format("must be a size such as 512M, 8G or a number of "
                                               "bytes (up to 1024T), got '{}'",
                                               text);
      },
      "SIZE");
}

void add_model_options(CLI::App& app, ModelOptions& o) {
  // Bounds the model accepts (DiTConfig): sizes far beyond any machine's memory are refused
  // here with a clear line instead of overflowing a size computation later.
  constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;
  o.app = &app;
  app.add_option("--steps", o.steps, "sampler steps (DDIM)")->check(whole_number(1, 1000));
  app.add_option("--input-size", o.config.input_size,
                 "latent height and width (the first resolution)")
      ->check(whole_number(1, kMaxSize));
  app.add_option("--patch", o.config.patch_size, "patch size")->check(whole_number(1, 64));
  app.add_option("--channels", o.config.in_channels, "latent channels")
      ->check(whole_number(1, 4096));
  app.add_option("--hidden", o.config.hidden, "token width C")->check(whole_number(4, kMaxSize));
  app.add_option("--depth", o.config.depth, "transformer blocks")->check(whole_number(1, 4096));
  app.add_option("--heads", o.config.heads,
                 "attention heads (with --weights: default hidden / 64, as the reference)")
      ->check(whole_number(1, kMaxSize));
  app.add_option("--classes", o.config.num_classes, "class labels (plus one null class)")
      ->check(whole_number(1, kMaxSize));
  app.add_option("--dtype", o.dtype, "float32, bfloat16 or float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--device", o.device,
                 "the device: a backend, optionally with a number (cpu, cuda, cuda:1)");
  app.add_option("--memory", o.memory,
                 "device memory, e.g. 8G (default: the device's, raised to fit the model)")
      ->check(byte_size());
  app.add_option("--weights", o.weights,
                 ".safetensors checkpoint in the reference DiT layout (facebookresearch/DiT)")
      ->check(CLI::ExistingFile);
  app.add_flag("--allow-unused-weights", o.allow_unused,
               "warn about tensors of --weights the model does not use instead of failing");
  app.add_option("--seed", o.config.seed, "seed of the random weights and latents")
      ->check(whole_number(0, INT64_MAX));
}

DeviceOptions device_options_for(const ModelOptions& options) {
  DeviceOptions device_options = retrace::default_device_options(options.device);
  if (!options.memory.empty()) {
    device_options.memory_bytes = *parse_bytes(options.memory);
  } else {
    device_options.memory_bytes = std::max(device_options.memory_bytes, model_bytes(options));
  }
  device_options.trace_region_bytes =
      std::max(device_options.trace_region_bytes, options.trace_bytes);
  return device_options;
}

std::unique_ptr<Device> open_device(const ModelOptions& options) {
  const std::string name = options.device.substr(0, options.device.find(':'));
  std::vector<std::string> known;
  for (const BackendStatus& backend : available_backends()) {
    known.push_back(backend.name);
    if (backend.name != name) continue;
    if (!backend.available) {
      throw DeviceUnavailable(fmt::format(
          "--device {}: this build has the {} backend, but it cannot be used here: {}",
          options.device, name, backend.reason));
    }
    std::unique_ptr<Device> device;
    try {
      device = retrace::open_device(options.device, device_options_for(options));
    } catch (const Error& e) {
      // A device this machine cannot run as configured (RETRACE_CPU_ISA=avx512 on a CPU without
      // AVX-512): exit status 3, like a missing GPU.
      if (e.category() == ErrorCategory::unimplemented) throw DeviceUnavailable(e.what());
      throw;
    }
    if (const std::string about = device->description(); !about.empty()) {
      std::printf("%s: %s\n", device->name().c_str(), about.c_str());
    }
    return device;
  }
  throw DeviceUnavailable(fmt::format("--device {}: this build has no {} backend (it has: {})",
                                      options.device, name, fmt::join(known, ", ")));
}

std::unique_ptr<models::DiT> make_model(ModelOptions& options, Device& device) {
  const DType dtype = dtype_named(options.dtype);
  options.config.dtype = dtype;
  if (options.weights.empty()) return std::make_unique<models::DiT>(options.config, device);
  auto given = [&](const char* name) { return options.app != nullptr && options.app->count(name) > 0; };
  // Uploaded tensor by tensor (peak memory close to the file's size); the shapes are the same.
  const auto weights = models::load_safetensors(options.weights, device);
  models::DiTInference inference;
  inference.dtype = dtype;
  if (given("--heads")) inference.heads = options.config.heads;
  if (given("--input-size")) inference.input_size = options.config.input_size;
  models::DiTConfig config = models::infer_dit_config(weights, inference);
  config.seed = options.config.seed;
  // A size given on the command line must be the file's: nothing is silently dropped or resized.
  for (const auto& [name, wanted, found, what] :
       {std::tuple{"--hidden", options.config.hidden, config.hidden, "hidden size"},
        std::tuple{"--depth", options.config.depth, config.depth, "depth"},
        std::tuple{"--patch", options.config.patch_size, config.patch_size, "patch size"},
        std::tuple{"--channels", options.config.in_channels, config.in_channels,
                   "latent channels"},
        std::tuple{"--classes", options.config.num_classes, config.num_classes, "classes"}}) {
    RETRACE_CHECK(!given(name) || wanted == found, invalid_argument,
                  "{} {} disagrees with {}, which has {} {}", name, wanted, options.weights, what,
                  found);
  }
  options.config = config;
  return std::make_unique<models::DiT>(
      config, device, weights,
      options.allow_unused ? models::UnusedWeights::warn : models::UnusedWeights::error);
}

std::string human_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

}  // namespace retrace::cli
