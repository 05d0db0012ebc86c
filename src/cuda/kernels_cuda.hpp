// Launchers of the CUDA kernel families (one per KernelId), called by launch_command.
#pragma once

#include "cuda/launch.hpp"

namespace retrace::cuda {

cudaError_t launch_fill(const FillParams& p, const LaunchContext& ctx);
cudaError_t launch_copy(const CopyParams& p, const LaunchContext& ctx);
cudaError_t launch_binary(const BinaryParams& p, const LaunchContext& ctx);
cudaError_t launch_binary_scalar(const BinaryScalarParams& p, const LaunchContext& ctx);
cudaError_t launch_assert_finite(const AssertFiniteParams& p, const LaunchContext& ctx);
cudaError_t launch_unary(const UnaryParams& p, const LaunchContext& ctx);
cudaError_t launch_reduce(const ReduceParams& p, const LaunchContext& ctx);
cudaError_t launch_softmax(const SoftmaxParams& p, const LaunchContext& ctx);
cudaError_t launch_norm(const NormParams& p, const LaunchContext& ctx);
cudaError_t launch_strided_copy(const StridedCopyParams& p, const LaunchContext& ctx);
cudaError_t launch_typecast(const TypecastParams& p, const LaunchContext& ctx);
cudaError_t launch_tilize(const TilizeParams& p, const LaunchContext& ctx);
cudaError_t launch_random(const RandomParams& p, const LaunchContext& ctx);
cudaError_t launch_compare(const CompareParams& p, const LaunchContext& ctx);
cudaError_t launch_where(const WhereParams& p, const LaunchContext& ctx);
cudaError_t launch_gather(const GatherParams& p, const LaunchContext& ctx);
cudaError_t launch_matmul(const MatmulParams& p, const LaunchContext& ctx,
                          cublasStatus_t* blas_status);
cudaError_t launch_attention(const AttentionParams& p, const LaunchContext& ctx,
                             cublasStatus_t* blas_status);
std::size_t attention_scratch_bytes(const AttentionParams& p) noexcept;
// Whether the product goes through the float32 gemm_scratch (a half-precision one with a bias).
bool matmul_needs_gemm_scratch(const MatmulParams& p) noexcept;

// out[r, j] = bias[j] for rows r < rows (the matmul's beta = 1 input), T = float32, bfloat16 or float16.
cudaError_t launch_bias_rows(const void* bias, void* out, std::int64_t rows, std::int64_t cols,
                             DType dtype, const LaunchContext& ctx);
// The fused mask + softmax of attention: in place on float rows of `sk`, written to `probs`
// (dtype) for the second product.
cudaError_t launch_attention_softmax(const AttentionParams& p, std::int64_t bh0, std::int64_t bhs,
                                     float* scores, void* probs, const LaunchContext& ctx);

}  // namespace retrace::cuda
