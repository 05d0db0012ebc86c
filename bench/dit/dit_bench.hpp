// The DiT step benchmark behind `retrace bench`: eager vs traced vs the kernel-library floor
// (and libtorch when the build found it), per size and thread count, in one process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::bench {

struct BenchOptions {
  std::string json_path, plot_path;  // written when not empty
  std::vector<std::string> sizes{"S", "M", "L"};
  // The CPU kernel variants to measure: empty for the one a device picks by default, {"all"}
  // for every variant this CPU runs.
  std::vector<std::string> isas;
  // The step's dtypes: "float32" and/or "bfloat16". A bfloat16 cell has no floor or libtorch
  // mode (both float32); its eager step is compared with the float32 eager step instead.
  std::vector<std::string> dtypes{"float32", "bfloat16"};
  int repeats = 5;          // rounds per mode
  std::int64_t steps = 3;   // timed steps per mode and round
  // Busy competitor processes (bench/dit/load.hpp) to measure every cell under as well: each
  // round runs every mode unloaded, then again with `load` spinning processes beside it.
  int load = 0;
  // Image sizes of the VAE decode row (empty: none), decodes per mode, and the decoder's
  // safetensors (empty: the Stable Diffusion VAE's architecture with seeded random weights).
  std::vector<std::int64_t> decode_sizes;
  int decode_repeats = 3;
  std::string vae;
};

// Prints the table (and the decode row's); writes JSON (an array: the step's rows, "model":
// "dit", then the decode's, "model": "vae_decode") and a gnuplot chart when paths are given.
// Returns the exit status (1 when a peer's output disagrees with retrace's, or a traced decode
// with the eager one).
int run_dit_bench(const BenchOptions& options);

// Writes one safetensors file per size, DIR/dit_step_<size>.safetensors: the model's weights
// (reference names), the step's inputs (step.x, step.t_frequencies, step.label,
// step.coefficients = [a, b], step.heads) and retrace's result of one step (step.x_next), for
// peers outside this process (bench/python/peers.py).
int export_dit_steps(const std::string& dir, const std::vector<std::string>& sizes,
                     std::int64_t steps);

// The libtorch side of the bench, run by `retrace bench --libtorch-peer THREADS` in a child
// process: times libtorch's step at one size and prints "libtorch_ms X libtorch_relative_error Y".
int run_libtorch_peer(const std::string& size, int threads, int repeats, std::int64_t steps);

}  // namespace retrace::bench
