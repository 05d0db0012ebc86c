// retrace: the command line. `retrace demo` runs the traced denoising loop of the example DiT
// (what `make demo` runs); `retrace inspect` captures one step and prints its trace; `retrace
// bench` compares eager, traced and the kernel-library floor.
#include "model_options.hpp"

#include <cstdio>

namespace retrace::cli {
int run_demo(ModelOptions& options);
int run_inspect(ModelOptions& options, const std::string& dot_path);
int run_bench(const std::string& json_path, const std::string& plot_path,
              const std::vector<std::string>& sizes, int repeats, std::int64_t steps);
}  // namespace retrace::cli

int main(int argc, char** argv) {
  CLI::App app{"retrace: capture device work once, replay it safely"};
  app.require_subcommand(1);
  retrace::cli::ModelOptions demo_options, inspect_options;
  inspect_options.config.depth = 2;
  std::string dot_path;
  CLI::App* demo = app.add_subcommand(
      "demo", "denoising loop of a small diffusion transformer, eager and traced, compared");
  retrace::cli::add_model_options(*demo, demo_options);
  CLI::App* inspect = app.add_subcommand("inspect", "capture one denoising step, print its trace");
  retrace::cli::add_model_options(*inspect, inspect_options);
  inspect->add_option("--dot", dot_path, "write a Graphviz graph of the trace to this file");
  std::string json_path, plot_path;
  std::vector<std::string> sizes{"S", "M", "L"};
  int repeats = 5;
  std::int64_t steps = 3;
  CLI::App* bench = app.add_subcommand(
      "bench", "one denoising step: eager vs traced vs the kernel-library floor, 1 and 2 threads");
  bench->add_option("--json", json_path, "write the results as JSON");
  bench->add_option("--plot", plot_path, "write a PNG chart (needs gnuplot)");
  bench->add_option("--sizes", sizes, "sizes to run: S, M, L")->delimiter(',');
  bench->add_option("--repeats", repeats, "rounds per mode")->check(CLI::PositiveNumber);
  bench->add_option("--steps", steps, "steps per round")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo) return retrace::cli::run_demo(demo_options);
    if (*bench) return retrace::cli::run_bench(json_path, plot_path, sizes, repeats, steps);
    return retrace::cli::run_inspect(inspect_options, dot_path);
  } catch (const retrace::Error& e) {
    std::fprintf(stderr, "retrace: %s\n", e.what());
    return 2;
  } catch (const retrace::cli::DeviceUnavailable& e) {
    std::fprintf(stderr, "retrace: %s\n", e.what());
    return 3;
  }
}
