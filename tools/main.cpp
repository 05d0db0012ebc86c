// retrace: the command line. `retrace demo` runs the traced denoising loop of the example DiT
// (what `make demo` runs); `retrace inspect` captures one step and prints its trace.
#include "model_options.hpp"

#include <cstdio>

namespace retrace::cli {
int run_demo(ModelOptions& options);
int run_inspect(ModelOptions& options, const std::string& dot_path);
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
  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo) return retrace::cli::run_demo(demo_options);
    return retrace::cli::run_inspect(inspect_options, dot_path);
  } catch (const retrace::Error& e) {
    std::fprintf(stderr, "retrace: %s\n", e.what());
    return 2;
  }
}
