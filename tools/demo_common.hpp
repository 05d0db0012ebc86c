// What the demo's single-device and mesh runs share: the progress bar, the starting latents,
// loading the model (with the memory check and the class), the header, the sizes sampled and
// the bitwise comparison.
#pragma once

#include "model_options.hpp"
#include "util/same_bits.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace retrace::cli {

// A progress bar on a terminal; nothing in between when stdout is a pipe or a file.
// Off: progress bars are not drawn (only each bar's summary line is printed).
inline bool progress_bars = true;

class Progress {
 public:
  Progress(std::string label, std::int64_t total)
      : label_(std::move(label)),
        total_(total),
        tty_(progress_bars && isatty(fileno(stdout)) != 0) {}
  void tick(std::int64_t done) {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const auto filled = static_cast<int>(kWidth * done / total_);
    std::printf("\r  %-7s [%s%s] %lld/%lld", label_.c_str(), std::string(filled, '#').c_str(),
                std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done),
                static_cast<long long>(total_));
    std::fflush(stdout);
  }
  void finish(const std::string& summary) {
    if (tty_) std::printf("\r\033[K");
    std::printf("  %-7s %s\n", label_.c_str(), summary.c_str());
  }

 private:
  std::string label_;
  std::int64_t total_;
  bool tty_;
};

inline std::vector<float> initial_latents(std::size_t count, std::uint64_t seed, std::int64_t size) {
  std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(size));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// The activations live on the device several times over (eager, the trace's buffers): sizes
// that cannot fit are refused before minutes go into making random weights and data.
void check_demo_fits(const models::DiTConfig& config, std::int64_t batch, const Device& device,
                     const std::string& dtype);

// The device (--device), the model on it (sizes checked against its memory first), the batch
// (2 with guidance) and the class to sample (--class, or 207 / 0), checked against the model.
struct DemoModel {
  std::unique_ptr<Device> device;
  std::unique_ptr<models::DiT> model;
  std::int64_t batch = 1;
  std::int64_t label = 0;
};
DemoModel load_demo_model(ModelOptions& o, const DemoOptions& d);
using util::same_bits;  // equal bit for bit (a NaN equals itself)
// The first lines: the model, where it runs, the sampler.
void print_demo_header(const ModelOptions& o, const DemoOptions& d, const models::DiTConfig& c,
                       std::int64_t label, const std::string& where);
// The latent sizes the demo samples at: the configured one, and half of it when the model
// computes its position table.
std::vector<std::int64_t> demo_sizes(const models::DiT& model);

// retrace demo --mesh N.
int run_demo_mesh(ModelOptions& o, const DemoOptions& d);

// The documentation page `page` ("cli.md#retrace-demo"): a path relative to the working
// directory when the build's source tree is at hand (as after `make demo`), else where it lies
// in retrace's sources.
std::string docs_page(const std::string& page);

}  // namespace retrace::cli
