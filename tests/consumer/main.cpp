// Built against an installed retrace through find_package(retrace).
#include <retrace/retrace.hpp>
#ifdef RETRACE_HAVE_CUDA
#include <retrace/cuda.hpp>
#endif

#include <cstdio>

int main() {
  auto device = retrace::open_cpu_device();
  auto x = retrace::ops::full({4}, 2.0, *device);
  device->begin_trace_capture(retrace::kDefaultQueue);
  auto y = retrace::ops::mul(x, 3.0);
  const auto trace = device->end_trace_capture(retrace::kDefaultQueue);
  device->execute_trace(trace, retrace::kDefaultQueue, retrace::Blocking::yes);
  const auto values = y.to_vector<float>();
  std::printf("consumer: %g\n", static_cast<double>(values[0]));
#ifdef RETRACE_HAVE_CUDA
  std::printf("consumer: retrace::cuda linked, %d GPU(s) usable\n", retrace::cuda_device_count());
#endif
  return values[0] == 6.0f ? 0 : 1;
}
