// Must compile: the control for the compile-fail tests (same harness, valid code).
#include <retrace/retrace.hpp>

struct Config {
  retrace::Tensor weight;
  float scale;
};
RETRACE_FIELDS(Config, weight, scale)

int main() {
  auto device = retrace::open_cpu_device();
  auto tracer = retrace::make_tracer(
      [](const Config& c) { return retrace::ops::mul(c.weight, c.scale); }, *device);
  tracer(Config{retrace::ops::full({2}, 1.0, *device), 2.0f});
}
