// Must not compile: an injected device given twice.
#include <retrace/retrace.hpp>

retrace::Tensor plus_one(const retrace::Tensor& x) { return retrace::ops::add(x, 1.0); }

int main() {
  auto device = retrace::open_cpu_device();
  auto traced = retrace::traced_function_injected(plus_one);
  traced(*device, *device, retrace::ops::full({2}, 1.0, *device));
}
