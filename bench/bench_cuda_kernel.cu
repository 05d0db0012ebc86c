// The hand-written side of retrace_bench_cuda: a plain CUDA kernel (x += 1 on float4s) with no
// retrace code around it, captured by hand into a CUDA graph.
#include <cuda_runtime.h>

namespace {
__global__ void add_one(float4* x, long long n4) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float4 v = x[i];
    v.x += 1.0f;
    v.y += 1.0f;
    v.z += 1.0f;
    v.w += 1.0f;
    x[i] = v;
  }
}
}  // namespace

// x: n floats (n a multiple of 4), 16-byte aligned.
cudaError_t bench_hand_add_one(float* x, long long n, cudaStream_t stream) {
  const long long n4 = n / 4;
  const unsigned int blocks = n4 > 0 ? static_cast<unsigned int>((n4 + 255) / 256) : 1u;
  add_one<<<blocks, 256, 0, stream>>>(reinterpret_cast<float4*>(x), n4);
  return cudaGetLastError();
}
