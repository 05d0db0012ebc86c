// Options shared by the CLI's subcommands: the model size, dtype, device, weights and seed.
#pragma once

#include <retrace/models/dit.hpp>

#include <CLI/CLI.hpp>

#include <memory>
#include <stdexcept>
#include <string>

namespace retrace::cli {

struct ModelOptions {
  models::DiTConfig config{.tokens = 256, .hidden = 256, .depth = 4, .heads = 4};
  std::string dtype = "float32";
  std::string device = "cpu";
  std::string weights;
  std::int64_t steps = 20;
};

void add_model_options(CLI::App& app, ModelOptions& options);

// "must be a whole number from MIN to MAX": checked before CLI11 converts the text, so a
// usage error names the option and the allowed range in words a person would write.
CLI::Validator whole_number(std::int64_t min, std::int64_t max);

// The device asked for cannot be used on this machine (exit status 3).
struct DeviceUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The device named by --device (the CPU device; CUDA when built with it and a GPU is usable).
std::unique_ptr<Device> open_device(const ModelOptions& options);
// The model: weights from --weights, or from --seed.
std::unique_ptr<models::DiT> make_model(ModelOptions& options, Device& device);

std::string human_bytes(std::size_t bytes);

}  // namespace retrace::cli
