// A program of someone else's project, built against retrace through find_package(retrace) or
// add_subdirectory: a traced step on the device named by the registry, and the backends linked.
#include <retrace/retrace.hpp>

#include <cstdio>

int main() {
  auto device = retrace::open_device("cpu");
  auto step = retrace::make_tracer(
      [](const retrace::Tensor& x) { return retrace::ops::mul(x, 3.0); }, *device);
  float last = 0.0f;
  for (int i = 1; i <= 3; ++i) {
    last = step(retrace::ops::full({4}, static_cast<double>(i), *device)).to_vector<float>()[0];
  }
  std::printf("consumer: %g after %llu replays\n", static_cast<double>(last),
              static_cast<unsigned long long>(step.stats().replays));
  for (const retrace::BackendStatus& backend : retrace::available_backends()) {
    std::printf("consumer: backend %s: %s\n", backend.name.c_str(),
                backend.available ? "available" : backend.reason.c_str());
  }
  return last == 9.0f && step.stats().replays == 2 ? 0 : 1;
}
