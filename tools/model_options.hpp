// Options shared by the CLI's subcommands: the model size, dtype, device, weights and seed.
#pragma once

#include <retrace/models/dit.hpp>

#include <CLI/CLI.hpp>

#include <memory>
#include <stdexcept>
#include <string>

namespace retrace::cli {

struct ModelOptions {
  // Random weights: this architecture. A checkpoint (--weights) brings its own, read from its
  // tensors; size options given with it must agree with the file.
  models::DiTConfig config{.input_size = 32, .hidden = 256, .depth = 4, .heads = 4};
  std::string dtype = "float32";
  std::string device = "cpu";
  std::string weights;
  std::string memory;  // device memory ("8G"); default: the backend's, raised to fit the model
  bool allow_unused = false;
  std::int64_t steps = 20;
  // Device memory the run needs besides the DiT's (a VAE decode): added to the default size.
  std::size_t extra_bytes = 0;
  // Trace memory the run needs (a VAE decode's trace): the device's trace region is at least this.
  std::size_t trace_bytes = 0;
  CLI::App* app = nullptr;  // to tell options given on the command line from defaults
};

void add_model_options(CLI::App& app, ModelOptions& options);

// The dtype named by --dtype ("float32", "bfloat16" or "float16").
[[nodiscard]] DType dtype_named(const std::string& name);
// Where image i of a batch of B is written: `path` itself when B is 1, else path with _i before
// its extension (out.png -> out_0.png, out_1.png, ...).
[[nodiscard]] std::string batch_image_path(const std::string& path, std::int64_t i,
                                           std::int64_t batch);

// retrace demo's sampling options.
struct DemoOptions {
  std::int64_t label = -1;  // -1: 207 (as the reference's sample script) or 0 with fewer classes
  double cfg_scale = 4.0;
  std::string preview;      // PNG of the final latents; default dit_sample.png with --weights
  std::size_t mesh = 0;     // > 0: also split the model over a mesh of this many CPU devices
  std::string sampler = "ddim";  // ddim, euler or euler-ancestral (models::parse_sampler)
  std::string vae;           // a VAE's .safetensors: decode the final latents to an image
  std::string out;           // the decoded image (PNG); default dit_sample.png
  std::string noise;         // .npy [B, C, H, W]: the starting latents instead of random ones
  std::string save_latents;  // .npy: the final latents (traced run, first resolution)
};

// retrace decode's options (the device, dtype and --allow-unused-weights are ModelOptions').
struct DecodeOptions {
  std::string vae;         // diffusers AutoencoderKL .safetensors
  std::string latents;     // .npy [B, C, h, w], the sampler's (scaled) latents
  std::string out = "decoded.png";
  std::string save_image;  // .npy of the decoder's float output
  std::int64_t replays = 5;
  std::int64_t norm_groups = 32;
  double scaling_factor = 0.18215;
};

// retrace inspect's options.
struct InspectOptions {
  std::string dot_path;     // Graphviz graph of the trace
  bool profile = false;     // time every command over `replays` replays
  std::size_t replays = 20;
  std::string trace_json;   // with profile: a Chrome/Perfetto trace file of one replay
  std::string vae;          // inspect one decode of this VAE instead of a DiT step
};

// "must be a whole number from MIN to MAX": checked before CLI11 converts the text, so a
// usage error names the option and the allowed range in words a person would write.
CLI::Validator whole_number(std::int64_t min, std::int64_t max);
// A byte count such as 512M, 8G or 1073741824 (--memory).
CLI::Validator byte_size();

// The device asked for cannot be used on this machine (exit status 3).
struct DeviceUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// DeviceOptions for --device with --memory (default: the backend's, raised to fit the model).
DeviceOptions device_options_for(const ModelOptions& options);
// The device named by --device (the CPU device; CUDA when built with it and a GPU is usable).
std::unique_ptr<Device> open_device(const ModelOptions& options);
// The model: weights from --weights (configuration inferred from the file and checked against
// the size options given), or random from --seed.
std::unique_ptr<models::DiT> make_model(ModelOptions& options, Device& device);

std::string human_bytes(std::size_t bytes);

}  // namespace retrace::cli
