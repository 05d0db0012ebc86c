// Must not compile: a raw pointer is not a tree leaf.
#include <retrace/retrace.hpp>

int main() {
  auto device = retrace::open_cpu_device();
  auto tracer = retrace::make_tracer([](const retrace::Tensor& x, const float* scale) {
    return retrace::ops::mul(x, *scale);
  }, *device);
  float scale = 2.0f;
  tracer(retrace::ops::full({2}, 1.0, *device), &scale);
}
