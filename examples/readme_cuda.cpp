#include <retrace/cuda.hpp>
#include <retrace/retrace.hpp>

#include <cstdio>

int main() {
  if (retrace::cuda_device_count() == 0) {
    std::printf("no GPU: %s\n", retrace::cuda_unavailable_reason().c_str());
    return 3;
  }
  retrace::CudaDeviceOptions options;  // defaults: GPU 0, 8 GiB arena, 1 GiB for traces
  options.memory_bytes = std::size_t{1} << 30;
  auto gpu = retrace::open_cuda_device(options);  // "cuda:0"
  std::printf("%s on %s\n", gpu->name().c_str(), retrace::cuda_device_description(0).c_str());

  // The same ops, Tracer and traced functions as on the CPU device; replays are CUDA graphs.
  auto step = retrace::make_tracer(
      [](const retrace::Tensor& x) {
        return retrace::ops::softmax(
            retrace::ops::matmul(x, x, retrace::ops::Transpose::no, retrace::ops::Transpose::yes));
      },
      *gpu);
  retrace::Tensor x = retrace::ops::full({64, 64}, 0.5, *gpu);
  for (int i = 0; i < 10; ++i) (void)step(x);  // 1 capture, 9 graph launches
  const float first = step.outputs().to_vector<float>()[0];
  std::printf("softmax(x x^T)[0] = %.6f (1/64 = %.6f), %llu replays\n", first, 1.0 / 64,
              static_cast<unsigned long long>(step.stats().replays));
  return 0;
}
