// Built when CMake did not find libtorch: the benchmark skips its libtorch mode.
#include "torch_dit.hpp"

namespace retrace::bench {

std::unique_ptr<TorchStep> make_torch_step(const models::DiT&, std::string& why) {
  why = "this build has no libtorch (install libtorch-dev, e.g. with make bench, and rebuild)";
  return nullptr;
}

}  // namespace retrace::bench
