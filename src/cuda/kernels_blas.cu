// Matmul, linear and attention on CUDA: cuBLAS GEMMs (float32 accumulation; float32 stays
// strict fp32, no TF32) plus our own bias broadcast and fused mask + softmax kernels.
//
// Row-major C[m,n] = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T,
// so no operand is ever copied or transposed in memory.
#include "cuda/common.cuh"
#include "cuda/kernels_cuda.hpp"

namespace retrace::cuda {

namespace {

constexpr std::size_t kAttentionScratchLimit = std::size_t{64} << 20;

cudaDataType_t blas_type(DType dtype) {
  return dtype == DType::bfloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

struct Gemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  cudaDataType_t ab_type = CUDA_R_32F, c_type = CUDA_R_32F;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
  std::int64_t batch = 1;
  float alpha = 1.0f, beta = 0.0f;
};

cublasStatus_t run_gemm(const Gemm& g, const LaunchContext& ctx) {
  const auto lda = static_cast<int>(g.trans_a ? g.m : g.k);
  const auto ldb = static_cast<int>(g.trans_b ? g.k : g.n);
  const auto ldc = static_cast<int>(g.n);
  return cublasGemmStridedBatchedEx(
      ctx.cublas, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &g.alpha, g.b,
      g.ab_type, ldb, g.stride_b, g.a, g.ab_type, lda, g.stride_a, &g.beta, g.c, g.c_type, ldc,
      g.stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

template <class T>
__global__ void bias_rows_kernel(const FailureRecord* record, const T* bias, T* out,
                                 std::int64_t n, std::int64_t cols) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) { out[i] = bias[i % cols]; }
}

// Scores rows of one chunk of (batch, head) pairs: scores += mask, softmax, probs = result.
template <class T>
__global__ void attention_softmax_kernel(const FailureRecord* record, float* scores, T* probs,
                                         const T* mask, std::int64_t bh0, std::int64_t heads,
                                         std::int64_t sq, std::int64_t sk,
                                         std::int64_t mask_batch_stride,
                                         std::int64_t mask_head_stride) {
  if (aborted(record)) return;
  using E = Elem<T>;
  const std::int64_t row = blockIdx.x;  // within the chunk: (bh - bh0) * sq + r
  const std::int64_t bh = bh0 + row / sq, r = row % sq;
  float* s = scores + row * sk;
  const T* m = mask == nullptr ? nullptr
                               : mask + (bh / heads) * mask_batch_stride +
                                     (bh % heads) * mask_head_stride + r * sk;
  float mx = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < sk; c += blockDim.x) {
    float v = s[c];
    if (m != nullptr) v += static_cast<float>(E::load(m, c));
    s[c] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_reduce<true>(mx);
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < sk; c += blockDim.x) {
    const float e = expf(s[c] - mx);
    s[c] = e;
    sum += e;
  }
  const float inv = 1.0f / block_reduce<false>(sum);
  T* p = probs + row * sk;
  for (std::int64_t c = threadIdx.x; c < sk; c += blockDim.x) E::store(p, c, s[c] * inv);
}

// (batch, head) pairs per chunk so that the scores fit the scratch limit.
std::int64_t attention_chunk(const AttentionParams& p) {
  const std::int64_t per_bh = p.sq * p.sk * static_cast<std::int64_t>(4 + dtype_size(p.dtype));
  const std::int64_t bh = p.batch * p.heads;
  if (per_bh == 0) return bh > 0 ? bh : 1;
  const std::int64_t fit = static_cast<std::int64_t>(kAttentionScratchLimit) / per_bh;
  return fit < 1 ? 1 : (fit < bh ? fit : bh);
}

// Merges batch dimensions that are contiguous for both operands and the output, so most
// batched products become one strided-batched call.
struct BatchPlan {
  std::int64_t shape[kMaxBatchRank];
  std::int64_t a[kMaxBatchRank];
  std::int64_t b[kMaxBatchRank];
  int rank = 0;
};

BatchPlan plan_batches(const MatmulParams& p) {
  BatchPlan plan;
  for (int d = 0; d < p.batch_rank; ++d) {
    if (p.batch_shape[d] == 1) continue;
    if (plan.rank > 0) {
      const int last = plan.rank - 1;
      const std::int64_t inner = p.batch_shape[d];
      if (plan.a[last] == p.a_batch_strides[d] * inner &&
          plan.b[last] == p.b_batch_strides[d] * inner) {
        plan.shape[last] *= inner;
        plan.a[last] = p.a_batch_strides[d];
        plan.b[last] = p.b_batch_strides[d];
        continue;
      }
    }
    plan.shape[plan.rank] = p.batch_shape[d];
    plan.a[plan.rank] = p.a_batch_strides[d];
    plan.b[plan.rank] = p.b_batch_strides[d];
    ++plan.rank;
  }
  return plan;
}

}  // namespace

cudaError_t launch_bias_rows(const void* bias, void* out, std::int64_t rows, std::int64_t cols,
                             DType dtype, const LaunchContext& ctx) {
  const std::int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  if (dtype == DType::bfloat16) {
    bias_rows_kernel<std::uint16_t><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const std::uint16_t*>(bias), static_cast<std::uint16_t*>(out), n,
        cols);
  } else {
    bias_rows_kernel<float><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const float*>(bias), static_cast<float*>(out), n, cols);
  }
  return cudaGetLastError();
}

cudaError_t launch_matmul(const MatmulParams& p, const LaunchContext& ctx,
                          cublasStatus_t* blas_status) {
  std::int64_t batches = 1;
  for (int d = 0; d < p.batch_rank; ++d) batches *= p.batch_shape[d];
  if (batches == 0 || p.m == 0 || p.n == 0) return cudaSuccess;
  const std::size_t es = dtype_size(p.dtype);
  Gemm g;
  g.trans_a = p.trans_a;
  g.trans_b = p.trans_b;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.ab_type = g.c_type = blas_type(p.dtype);
  g.alpha = p.alpha;
  if (p.bias != nullptr) {
    const cudaError_t e = launch_bias_rows(p.bias, p.out, batches * p.m, p.n, p.dtype, ctx);
    if (e != cudaSuccess) return e;
    g.beta = 1.0f;
  }
  if (p.k == 0 && p.bias == nullptr) {  // an empty sum: zeros
    return cudaMemsetAsync(p.out, 0, static_cast<std::size_t>(batches * p.m * p.n) * es,
                           ctx.stream);
  }
  if (p.k == 0) return cudaSuccess;
  const BatchPlan plan = plan_batches(p);
  // The innermost merged batch dimension is one strided-batched call; outer ones loop.
  const int inner = plan.rank - 1;
  g.batch = plan.rank > 0 ? plan.shape[inner] : 1;
  g.stride_a = plan.rank > 0 ? plan.a[inner] : 0;
  g.stride_b = plan.rank > 0 ? plan.b[inner] : 0;
  g.stride_c = p.m * p.n;
  const std::int64_t outer = batches / g.batch;
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t rest = o, off_a = 0, off_b = 0;
    for (int d = inner - 1; d >= 0; --d) {
      const std::int64_t idx = rest % plan.shape[d];
      rest /= plan.shape[d];
      off_a += idx * plan.a[d];
      off_b += idx * plan.b[d];
    }
    g.a = static_cast<const char*>(p.a) + off_a * static_cast<std::int64_t>(es);
    g.b = static_cast<const char*>(p.b) + off_b * static_cast<std::int64_t>(es);
    g.c = static_cast<char*>(p.out) + o * g.batch * p.m * p.n * static_cast<std::int64_t>(es);
    const cublasStatus_t status = run_gemm(g, ctx);
    if (status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
  }
  return cudaGetLastError();
}

// Bytes of the float32 scores of one chunk, rounded so the probabilities after them are aligned.
std::size_t scores_bytes(const AttentionParams& p, std::int64_t chunk) {
  return (static_cast<std::size_t>(chunk * p.sq * p.sk) * 4 + 255) / 256 * 256;
}

std::size_t attention_scratch_bytes(const AttentionParams& p) noexcept {
  const std::int64_t chunk = attention_chunk(p);
  return scores_bytes(p, chunk) + static_cast<std::size_t>(chunk * p.sq * p.sk) * dtype_size(p.dtype);
}

cudaError_t launch_attention_softmax(const AttentionParams& p, std::int64_t bh0, std::int64_t bhs,
                                     float* scores, void* probs, const LaunchContext& ctx) {
  const auto rows = static_cast<unsigned int>(bhs * p.sq);
  if (rows == 0 || p.sk == 0) return cudaSuccess;
  if (p.dtype == DType::bfloat16) {
    attention_softmax_kernel<bf16_t><<<rows, row_threads(p.sk), 0, ctx.stream>>>(
        ctx.record, scores, static_cast<bf16_t*>(probs), static_cast<const bf16_t*>(p.mask), bh0,
        p.heads, p.sq, p.sk, p.mask_batch_stride, p.mask_head_stride);
  } else {
    attention_softmax_kernel<float><<<rows, row_threads(p.sk), 0, ctx.stream>>>(
        ctx.record, scores, static_cast<float*>(probs), static_cast<const float*>(p.mask), bh0,
        p.heads, p.sq, p.sk, p.mask_batch_stride, p.mask_head_stride);
  }
  return cudaGetLastError();
}

cudaError_t launch_attention(const AttentionParams& p, const LaunchContext& ctx,
                             cublasStatus_t* blas_status) {
  const std::int64_t bh_total = p.batch * p.heads;
  if (bh_total == 0 || p.sq == 0 || p.dv == 0) return cudaSuccess;
  const auto es = static_cast<std::int64_t>(dtype_size(p.dtype));
  const std::int64_t chunk = attention_chunk(p);
  auto* scores = static_cast<float*>(ctx.scratch);
  void* probs = static_cast<char*>(ctx.scratch) + scores_bytes(p, chunk);
  for (std::int64_t bh0 = 0; bh0 < bh_total; bh0 += chunk) {
    const std::int64_t bhs = bh_total - bh0 < chunk ? bh_total - bh0 : chunk;
    Gemm s;  // scores = scale * q k^T, float32 output
    s.trans_b = true;
    s.m = p.sq;
    s.n = p.sk;
    s.k = p.d;
    s.a = static_cast<const char*>(p.q) + bh0 * p.sq * p.d * es;
    s.b = static_cast<const char*>(p.k) + bh0 * p.sk * p.d * es;
    s.c = scores;
    s.ab_type = blas_type(p.dtype);
    s.c_type = CUDA_R_32F;
    s.stride_a = p.sq * p.d;
    s.stride_b = p.sk * p.d;
    s.stride_c = p.sq * p.sk;
    s.batch = bhs;
    s.alpha = p.scale;
    if (p.d == 0) {
      const cudaError_t e = cudaMemsetAsync(
          scores, 0, static_cast<std::size_t>(bhs * p.sq * p.sk) * sizeof(float), ctx.stream);
      if (e != cudaSuccess) return e;
    } else if (const cublasStatus_t status = run_gemm(s, ctx); status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
    if (const cudaError_t e = launch_attention_softmax(p, bh0, bhs, scores, probs, ctx);
        e != cudaSuccess) {
      return e;
    }
    Gemm o;  // out = probs v
    o.m = p.sq;
    o.n = p.dv;
    o.k = p.sk;
    o.a = probs;
    o.b = static_cast<const char*>(p.v) + bh0 * p.sk * p.dv * es;
    o.c = static_cast<char*>(p.out) + bh0 * p.sq * p.dv * es;
    o.ab_type = o.c_type = blas_type(p.dtype);
    o.stride_a = p.sq * p.sk;
    o.stride_b = p.sk * p.dv;
    o.stride_c = p.sq * p.dv;
    o.batch = bhs;
    if (p.sk == 0) {
      const cudaError_t e = cudaMemsetAsync(
          o.c, 0, static_cast<std::size_t>(bhs * p.sq * p.dv * es), ctx.stream);
      if (e != cudaSuccess) return e;
    } else if (const cublasStatus_t status = run_gemm(o, ctx); status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
  }
  return cudaGetLastError();
}

}  // namespace retrace::cuda
