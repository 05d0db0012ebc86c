// Must not compile: a traced function may not return a shared_ptr.
#include <retrace/retrace.hpp>

#include <memory>

int main() {
  auto device = retrace::open_cpu_device();
  auto tracer = retrace::make_tracer(
      [](const retrace::Tensor& x) {
        return std::make_shared<retrace::Tensor>(retrace::ops::add(x, 1.0));
      },
      *device);
  tracer(retrace::ops::full({2}, 1.0, *device));
}
