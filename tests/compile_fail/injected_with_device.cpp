// Must not compile: injecting a device into a function that already takes one.
#include <retrace/retrace.hpp>

retrace::Tensor scaled(const retrace::Tensor& x, retrace::Device& device) {
  (void)device;
  return retrace::ops::mul(x, 2.0);
}

int main() {
  auto traced = retrace::traced_function_injected(scaled);
  (void)traced;
}
