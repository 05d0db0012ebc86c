// Matmul, linear and attention on CUDA: cuBLAS GEMMs (float32 accumulation; float32 stays
// strict fp32, no TF32) plus our own bias broadcast and fused mask + softmax kernels.
//
// Row-major C[m,n] = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T,
// so no operand is ever copied or transposed in memory.
#include "cuda/common.cuh"
#include "cuda/gemm_plan.hpp"
#include "cuda/kernels_cuda.hpp"

namespace retrace::cuda {

namespace {

constexpr std::size_t kAttentionScratchLimit = std::size_t{64} << 20;

cudaDataType_t blas_type(DType dtype) {
  switch (dtype) {
    case DType::bfloat16: return CUDA_R_16BF;
    case DType::float16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// Runs one planned call on p's operands (element size es, types as given).
cublasStatus_t run_gemm(const GemmCall& g, const void* a, const void* b, void* c,
                        cudaDataType_t ab_type, cudaDataType_t c_type, std::int64_t es, float alpha,
                        float beta, const LaunchContext& ctx) {
  const auto* first = static_cast<const char*>(b) + g.offset_first * es;
  const auto* second = static_cast<const char*>(a) + g.offset_second * es;
  auto* out = static_cast<char*>(c) + g.offset_out * (c_type == CUDA_R_32F ? 4 : es);
  return cublasGemmStridedBatchedEx(
      ctx.cublas, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
      g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.rows),
      static_cast<int>(g.cols), static_cast<int>(g.depth), &alpha, first, ab_type,
      static_cast<int>(g.ld_first), g.stride_first, second, ab_type, static_cast<int>(g.ld_second),
      g.stride_second, &beta, out, c_type, static_cast<int>(g.ld_out), g.stride_out,
      static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

template <class T>
__global__ void bias_rows_kernel(const FailureRecord* record, const T* bias, T* out, std::int64_t n,
                                 std::int64_t cols) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    out[i] = bias[i % cols];
  }
}

// out = T(acc + bias) over rows of `cols`: the bias of a half-precision product added in float32
// to the float32 product, so the output is rounded once.
template <class T>
__global__ void add_bias_round_kernel(const FailureRecord* record, const float* acc, const T* bias,
                                      T* out, std::int64_t n, std::int64_t cols) {
  if (aborted(record)) return;
  using E = Elem<T>;
  RETRACE_GRID_STRIDE(i, n) {
    E::store(out, i, acc[i] + E::load(bias, i % cols));
  }
}

std::int64_t matmul_batches(const MatmulParams& p) {
  std::int64_t batches = 1;
  for (int d = 0; d < p.batch_rank; ++d) batches *= p.batch_shape[d];
  return batches;
}

// The cuBLASLt descriptors of one product, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (out != nullptr) cublasLtMatrixLayoutDestroy(out);
    if (second != nullptr) cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) cublasLtMatrixLayoutDestroy(first);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two, up to 256, that divides the address.
std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

enum class LtResult { not_applicable, done, failed };

// An unbatched product with a bias, the bias added by cuBLASLt's epilogue (in float32, before the
// one rounding into the output: no separate kernel puts the bias into C, and half-precision
// outputs are rounded once). not_applicable, with nothing enqueued, where cuBLASLt offers no
// algorithm: the caller takes the cuBLAS path.
LtResult lt_matmul_bias(const MatmulParams& p, const LaunchContext& ctx,
                        cublasStatus_t* blas_status) {
  if (ctx.cublas_lt == nullptr || p.bias == nullptr || matmul_batches(p) != 1 || p.k == 0 ||
      p.m == 0 || p.n == 0 || !aligned16(p.bias)) {  // (a bias sliced at any element)
    return LtResult::not_applicable;
  }
  const auto ok = [](cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS; };
  const GemmCall g = column_major_call(p.trans_a, p.trans_b, p.m, p.n, p.k);
  const cudaDataType_t type = blas_type(p.dtype);
  LtCall call;
  if (!ok(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) {
    return LtResult::not_applicable;
  }
  const cublasOperation_t op_first = g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const void* bias = p.bias;
  // The stored matrices (column-major): op(first) is rows x depth, op(second) depth x cols.
  const auto rows = static_cast<std::uint64_t>(g.rows), cols = static_cast<std::uint64_t>(g.cols),
             depth = static_cast<std::uint64_t>(g.depth);
  if (!ok(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                         sizeof op_first)) ||
      !ok(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                         sizeof op_second)) ||
      !ok(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof epilogue)) ||
      !ok(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof bias)) ||
      !ok(cublasLtMatrixLayoutCreate(&call.first, type, g.trans_first ? depth : rows,
                                     g.trans_first ? rows : depth, g.ld_first)) ||
      !ok(cublasLtMatrixLayoutCreate(&call.second, type, g.trans_second ? cols : depth,
                                     g.trans_second ? depth : cols, g.ld_second)) ||
      !ok(cublasLtMatrixLayoutCreate(&call.out, type, rows, cols, g.ld_out)) ||
      !ok(cublasLtMatmulPreferenceCreate(&call.preference))) {
    return LtResult::not_applicable;
  }
  // Only algorithms for the workspace there is and for the operands' actual alignment (views
  // can start at any element).
  const std::size_t workspace = ctx.blas_workspace_bytes;
  const std::uint32_t align_first = alignment_of(p.b), align_second = alignment_of(p.a),
                      align_out = alignment_of(p.out);
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
    return ok(cublasLtMatmulPreferenceSetAttribute(call.preference, attribute, &value,
                                                   sizeof value));
  };
  if (!prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace) ||
      !prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first) ||
      !prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second) ||
      !prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_out) ||
      !prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_out)) {
    return LtResult::not_applicable;
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (!ok(cublasLtMatmulAlgoGetHeuristic(ctx.cublas_lt, call.op, call.first, call.second, call.out,
                                         call.out, call.preference, 1, &heuristic, &found)) ||
      found == 0) {
    return LtResult::not_applicable;
  }
  const float alpha = p.alpha, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(ctx.cublas_lt, call.op, &alpha, p.b, call.first, p.a, call.second, &beta,
                     p.out, call.out, p.out, call.out, &heuristic.algo, ctx.blas_workspace,
                     workspace, ctx.stream);
  if (!ok(status)) {
    *blas_status = status;
    return LtResult::failed;
  }
  return LtResult::done;
}

// A half-precision product with a bias: cuBLAS, given the bias as C with beta = 1, rounds the
// product to the output type before adding C (seen on an H200: a bfloat16 linear whose bias
// cancelled its product came out 15 bfloat16 steps from the float64 value, exactly
// bf16(bf16(a b) + bias)). These products (linear's: unbatched) go to float32 scratch instead,
// row chunk by row chunk, and the bias is added there: one rounding, as on the CPU device.
// (A row of more outputs than the scratch holds, over 4M, keeps cuBLAS's two roundings.)
bool bias_in_float32(const MatmulParams& p) {
  constexpr auto kMaxColumns = static_cast<std::int64_t>(kGemmScratchBytes / sizeof(float));
  return p.bias != nullptr && dtype_size(p.dtype) == 2 && p.k > 0 && p.m > 0 && p.n > 0 &&
         p.n <= kMaxColumns && matmul_batches(p) == 1;
}

cudaError_t launch_add_bias_round(const float* acc, const void* bias, void* out, std::int64_t n,
                                  std::int64_t cols, DType dtype, const LaunchContext& ctx) {
  if (dtype == DType::bfloat16) {
    add_bias_round_kernel<bfloat16><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, acc, static_cast<const bfloat16*>(bias), static_cast<bfloat16*>(out), n, cols);
  } else {
    add_bias_round_kernel<float16><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, acc, static_cast<const float16*>(bias), static_cast<float16*>(out), n, cols);
  }
  return cudaGetLastError();
}

// The product of a bias_in_float32 matmul: float32 GEMMs into the gemm scratch, as many rows at
// a time as it holds, each chunk followed by the bias and the one rounding into the output.
cudaError_t matmul_bias_in_float32(const MatmulParams& p, const LaunchContext& ctx,
                                   cublasStatus_t* blas_status) {
  const auto es = static_cast<std::int64_t>(dtype_size(p.dtype));
  const cudaDataType_t type = blas_type(p.dtype);
  auto* acc = static_cast<float*>(ctx.gemm_scratch);
  const std::int64_t fit = static_cast<std::int64_t>(kGemmScratchBytes / sizeof(float)) / p.n;
  const std::int64_t chunk = fit < p.m ? fit : p.m;
  for (std::int64_t r0 = 0; r0 < p.m; r0 += chunk) {
    const std::int64_t rows = chunk < p.m - r0 ? chunk : p.m - r0;
    const GemmCall call = plan_matmul_rows(p, r0, rows);
    const cublasStatus_t status =
        run_gemm(call, p.a, p.b, acc, type, CUDA_R_32F, es, p.alpha, 0.0f, ctx);
    if (status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
    const cudaError_t e =
        launch_add_bias_round(acc, p.bias, static_cast<char*>(p.out) + r0 * p.n * es, rows * p.n,
                              p.n, p.dtype, ctx);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Scores rows of one chunk of (batch, head) pairs: scores += mask, softmax, probs = result.
template <class T>
__global__ void attention_softmax_kernel(const FailureRecord* record, float* scores, T* probs,
                                         const T* mask, std::int64_t bh0, std::int64_t heads,
                                         std::int64_t sq, std::int64_t sk,
                                         std::int64_t mask_batch_stride,
                                         std::int64_t mask_head_stride,
                                         std::int64_t mask_row_stride, bool causal) {
  if (aborted(record)) return;
  using E = Elem<T>;
  const std::int64_t row = blockIdx.x;  // within the chunk: (bh - bh0) * sq + r
  const std::int64_t bh = bh0 + row / sq, r = row % sq;
  float* s = scores + row * sk;
  const T* m = mask == nullptr ? nullptr
                               : mask + (bh / heads) * mask_batch_stride +
                                     (bh % heads) * mask_head_stride + r * mask_row_stride;
  float mx = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < sk; c += blockDim.x) {
    float v = s[c];
    if (m != nullptr) v += static_cast<float>(E::load(m, c));
    if (causal && c > r) v = -INFINITY;
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
  // A row whose every key is masked out (all -inf) attends to nothing: zeros, as the CPU
  // device and torch's attention give, not the NaNs of 0 / 0.
  const bool none = mx == -INFINITY;  // the block's maximum: the same in every thread
  const float total = block_reduce<false>(sum);
  const float inv = none ? 0.0f : 1.0f / total;
  T* p = probs + row * sk;
  for (std::int64_t c = threadIdx.x; c < sk; c += blockDim.x) {
    E::store(p, c, none ? 0.0f : s[c] * inv);
  }
}

// (batch, head) pairs per chunk so that the scores fit the scratch limit.
std::int64_t attention_chunk(const AttentionParams& p) {
  const std::int64_t per_bh = p.sq * p.sk * static_cast<std::int64_t>(4 + dtype_size(p.dtype));
  const std::int64_t bh = p.batch * p.heads;
  if (per_bh == 0) return bh > 0 ? bh : 1;
  const std::int64_t fit = static_cast<std::int64_t>(kAttentionScratchLimit) / per_bh;
  return fit < 1 ? 1 : (fit < bh ? fit : bh);
}

}  // namespace

cudaError_t launch_bias_rows(const void* bias, void* out, std::int64_t rows, std::int64_t cols,
                             DType dtype, const LaunchContext& ctx) {
  const std::int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  if (dtype_size(dtype) == 2) {  // bfloat16, float16: the bits are copied
    bias_rows_kernel<std::uint16_t><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const std::uint16_t*>(bias), static_cast<std::uint16_t*>(out), n,
        cols);
  } else {
    bias_rows_kernel<float><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const float*>(bias), static_cast<float*>(out), n, cols);
  }
  return cudaGetLastError();
}

bool matmul_needs_gemm_scratch(const MatmulParams& p) noexcept { return bias_in_float32(p); }

cudaError_t launch_matmul(const MatmulParams& p, const LaunchContext& ctx,
                          cublasStatus_t* blas_status) {
  const std::int64_t batches = matmul_batches(p);
  if (batches == 0 || p.m == 0 || p.n == 0) return cudaSuccess;
  switch (lt_matmul_bias(p, ctx, blas_status)) {
    case LtResult::done: return cudaGetLastError();
    case LtResult::failed: return cudaErrorUnknown;
    case LtResult::not_applicable: break;
  }
  if (bias_in_float32(p)) return matmul_bias_in_float32(p, ctx, blas_status);
  const auto es = static_cast<std::int64_t>(dtype_size(p.dtype));
  float beta = 0.0f;
  if (p.bias != nullptr) {
    const cudaError_t e = launch_bias_rows(p.bias, p.out, batches * p.m, p.n, p.dtype, ctx);
    if (e != cudaSuccess) return e;
    beta = 1.0f;
  } else if (p.k == 0) {  // an empty sum: zeros
    return cudaMemsetAsync(p.out, 0, static_cast<std::size_t>(batches * p.m * p.n * es),
                           ctx.stream);
  }
  const cudaDataType_t type = blas_type(p.dtype);
  for (const GemmCall& call : plan_matmul(p)) {
    const cublasStatus_t status =
        run_gemm(call, p.a, p.b, p.out, type, type, es, p.alpha, beta, ctx);
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
  return scores_bytes(p, chunk) +
         static_cast<std::size_t>(chunk * p.sq * p.sk) * dtype_size(p.dtype);
}

cudaError_t launch_attention_softmax(const AttentionParams& p, std::int64_t bh0, std::int64_t bhs,
                                     float* scores, void* probs, const LaunchContext& ctx) {
  const auto rows = static_cast<unsigned int>(bhs * p.sq);
  if (rows == 0 || p.sk == 0) return cudaSuccess;
  if (p.dtype == DType::bfloat16) {
    attention_softmax_kernel<bfloat16><<<rows, row_threads(p.sk), 0, ctx.stream>>>(
        ctx.record, scores, static_cast<bfloat16*>(probs), static_cast<const bfloat16*>(p.mask),
        bh0, p.heads, p.sq, p.sk, p.mask_batch_stride, p.mask_head_stride,
        p.mask_row_stride, p.causal);
  } else if (p.dtype == DType::float16) {
    attention_softmax_kernel<float16><<<rows, row_threads(p.sk), 0, ctx.stream>>>(
        ctx.record, scores, static_cast<float16*>(probs), static_cast<const float16*>(p.mask),
        bh0, p.heads, p.sq, p.sk, p.mask_batch_stride, p.mask_head_stride,
        p.mask_row_stride, p.causal);
  } else {
    attention_softmax_kernel<float><<<rows, row_threads(p.sk), 0, ctx.stream>>>(
        ctx.record, scores, static_cast<float*>(probs), static_cast<const float*>(p.mask), bh0,
        p.heads, p.sq, p.sk, p.mask_batch_stride, p.mask_head_stride,
        p.mask_row_stride, p.causal);
  }
  return cudaGetLastError();
}

cudaError_t launch_attention(const AttentionParams& p, const LaunchContext& ctx,
                             cublasStatus_t* blas_status) {
  const std::int64_t bh_total = p.batch * p.heads;
  if (bh_total == 0 || p.sq == 0 || p.dv == 0) return cudaSuccess;
  const auto es = static_cast<std::int64_t>(dtype_size(p.dtype));
  const cudaDataType_t type = blas_type(p.dtype);
  const std::int64_t chunk = attention_chunk(p);
  auto* scores = static_cast<float*>(ctx.scratch);
  void* probs = static_cast<char*>(ctx.scratch) + scores_bytes(p, chunk);
  for (std::int64_t bh0 = 0, bhs = 0; bh0 < bh_total; bh0 += bhs) {
    bhs = attention_chunk_size(p, bh0, chunk);
    const AttentionCalls calls = plan_attention(p, bh0, bhs);
    if (p.sk == 0) {
      // no keys: nothing to score (the output is zero below)
    } else if (p.d == 0) {
      const cudaError_t e = cudaMemsetAsync(
          scores, 0, static_cast<std::size_t>(bhs * p.sq * p.sk) * sizeof(float), ctx.stream);
      if (e != cudaSuccess) return e;
    } else if (const cublasStatus_t status = run_gemm(calls.scores, p.q, p.k, scores, type,
                                                      CUDA_R_32F, es, p.scale, 0.0f, ctx);
               status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
    if (const cudaError_t e = launch_attention_softmax(p, bh0, bhs, scores, probs, ctx);
        e != cudaSuccess) {
      return e;
    }
    if (p.sk == 0) {
      const cudaError_t e =
          cudaMemsetAsync(static_cast<char*>(p.out) + calls.output.offset_out * es, 0,
                          static_cast<std::size_t>(bhs * p.sq * p.dv * es), ctx.stream);
      if (e != cudaSuccess) return e;
    } else if (const cublasStatus_t status =
                   run_gemm(calls.output, probs, p.v, p.out, type, type, es, 1.0f, 0.0f, ctx);
               status != CUBLAS_STATUS_SUCCESS) {
      *blas_status = status;
      return cudaErrorUnknown;
    }
  }
  return cudaGetLastError();
}

}  // namespace retrace::cuda
