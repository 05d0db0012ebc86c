// launch_command: KernelId -> the CUDA launcher of its family.
#include "cuda/collective.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels_cuda.hpp"

namespace retrace::cuda {

namespace {
template <class P>
const P& as(const void* params) {
  return *static_cast<const P*>(params);
}

bool is_float(DType dtype) {
  return dtype_info(dtype).is_floating;
}

// Kernels that only move elements take 1, 2, 4 and 8 bytes (see with_size).
const char* unmovable(std::int32_t elem_size) {
  const bool ok = elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8;
  return ok ? nullptr : "elements of this size";
}
}  // namespace

std::size_t scratch_bytes(KernelId kernel, const void* params) noexcept {
  if (kernel == KernelId::attention) return attention_scratch_bytes(as<AttentionParams>(params));
  if (kernel == KernelId::collective) return kCollectiveScratchBytes;  // its failure word
  return 0;
}

bool needs_gemm_scratch(KernelId kernel, const void* params) noexcept {
  return kernel == KernelId::matmul && matmul_needs_gemm_scratch(as<MatmulParams>(params));
}

const char* unsupported_reason(KernelId kernel, const void* params) noexcept {
  constexpr std::int64_t kMaxRows = 0x7fffffff;  // one block per row
  switch (kernel) {
    case KernelId::binary:
      if (as<BinaryParams>(params).dtype == DType::uint8) return "binary ops on uint8";
      return nullptr;
    case KernelId::binary_scalar:
      if (as<BinaryScalarParams>(params).dtype == DType::uint8) return "binary ops on uint8";
      return nullptr;
    case KernelId::assert_finite:
      return is_float(as<AssertFiniteParams>(params).dtype) ? nullptr : "assert_finite on integers";
    case KernelId::unary:
      return is_float(as<UnaryParams>(params).dtype) ? nullptr : "unary ops on integers";
    case KernelId::reduce: {
      const auto& p = as<ReduceParams>(params);
      if (!is_float(p.dtype)) return "reductions on integers";
      return p.rows > kMaxRows ? "more than 2^31-1 rows" : nullptr;
    }
    case KernelId::softmax: {
      const auto& p = as<SoftmaxParams>(params);
      if (!is_float(p.dtype)) return "softmax on integers";
      return p.rows > kMaxRows ? "more than 2^31-1 rows" : nullptr;
    }
    case KernelId::norm: {
      const auto& p = as<NormParams>(params);
      if (!is_float(p.dtype)) return "normalisation on integers";
      return p.rows > kMaxRows ? "more than 2^31-1 rows" : nullptr;
    }
    case KernelId::matmul: {
      const auto& p = as<MatmulParams>(params);
      if (!is_float(p.dtype)) return "matmul on integers";
      constexpr std::int64_t kMaxDim = 0x7fffffff;  // cuBLAS takes int sizes
      return p.m > kMaxDim || p.n > kMaxDim || p.k > kMaxDim ? "a matrix side over 2^31-1"
                                                             : nullptr;
    }
    case KernelId::attention: {
      const auto& p = as<AttentionParams>(params);
      if (!is_float(p.dtype)) return "attention on integers";
      if (!has_dense_attention_strides(p)) return "attention on strided q, k, v or out";
      return p.batch * p.heads * p.sq > kMaxRows ? "more than 2^31-1 query rows" : nullptr;
    }
    case KernelId::strided_copy:
      return unmovable(as<StridedCopyParams>(params).elem_size);
    case KernelId::tilize:
      return unmovable(as<TilizeParams>(params).elem_size);
    case KernelId::collective:
      return collective_unsupported_reason(as<CollectiveParams>(params));
    case KernelId::random:
      return is_float(as<RandomParams>(params).dtype) ? nullptr : "random numbers of integers";
    case KernelId::where:
      return unmovable(as<WhereParams>(params).elem_size);
    case KernelId::gather:
      return unmovable(as<GatherParams>(params).elem_size);
    case KernelId::compare:
    case KernelId::fill:
    case KernelId::copy:
    case KernelId::typecast:
      return nullptr;
    case KernelId::winograd:  // conv2d takes its im2col path (cuBLAS) on this device
      return "the Winograd convolution";
    case KernelId::count_:
      break;
  }
  return "this kernel";
}

namespace {

// One overload per parameter struct: the CUDA device's kernel table is generated from
// RETRACE_KERNEL_LIST, so a kernel without an overload here does not compile.
cudaError_t launch(const FillParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_fill(p, ctx);
}
cudaError_t launch(const CopyParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_copy(p, ctx);
}
cudaError_t launch(const BinaryParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_binary(p, ctx);
}
cudaError_t launch(const BinaryScalarParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_binary_scalar(p, ctx);
}
cudaError_t launch(const AssertFiniteParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_assert_finite(p, ctx);
}
cudaError_t launch(const UnaryParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_unary(p, ctx);
}
cudaError_t launch(const ReduceParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_reduce(p, ctx);
}
cudaError_t launch(const SoftmaxParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_softmax(p, ctx);
}
cudaError_t launch(const NormParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_norm(p, ctx);
}
cudaError_t launch(const MatmulParams& p, const LaunchContext& ctx, cublasStatus_t* blas) {
  return launch_matmul(p, ctx, blas);
}
cudaError_t launch(const StridedCopyParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_strided_copy(p, ctx);
}
cudaError_t launch(const TypecastParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_typecast(p, ctx);
}
cudaError_t launch(const TilizeParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_tilize(p, ctx);
}
cudaError_t launch(const AttentionParams& p, const LaunchContext& ctx, cublasStatus_t* blas) {
  return launch_attention(p, ctx, blas);
}
cudaError_t launch(const RandomParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_random(p, ctx);
}
cudaError_t launch(const CompareParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_compare(p, ctx);
}
cudaError_t launch(const WhereParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_where(p, ctx);
}
cudaError_t launch(const GatherParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return launch_gather(p, ctx);
}
cudaError_t launch(const WinogradParams&, const LaunchContext&, cublasStatus_t*) {
  return cudaErrorNotSupported;  // refused before (unsupported_reason)
}
cudaError_t launch(const CollectiveParams& p, const LaunchContext& ctx, cublasStatus_t*) {
  return stage_collective(p, ctx);  // NCCL starts it once every member has staged its part
}

using Launcher = cudaError_t (*)(const void*, const LaunchContext&, cublasStatus_t*);

template <KernelId K>
cudaError_t launch_entry(const void* params, const LaunchContext& ctx, cublasStatus_t* blas) {
  return launch(as<KernelParamsOf<K>>(params), ctx, blas);
}

constexpr Launcher kLaunchers[kKernelCount] = {
#define RETRACE_CUDA_KERNEL(name, params) &launch_entry<KernelId::name>,
    RETRACE_KERNEL_LIST(RETRACE_CUDA_KERNEL)
#undef RETRACE_CUDA_KERNEL
};

}  // namespace

bool supports_kernel(KernelId kernel) noexcept {
  const auto index = static_cast<std::size_t>(kernel);
  return index < kKernelCount && kLaunchers[index] != nullptr;
}

cudaError_t launch_command(KernelId kernel, const void* params, const LaunchContext& ctx,
                           cublasStatus_t* blas_status) {
  if (!supports_kernel(kernel)) return cudaErrorInvalidValue;
  return kLaunchers[static_cast<std::size_t>(kernel)](params, ctx, blas_status);
}

cudaError_t clear_record(FailureRecord* record, cudaStream_t stream) {
  FailureRecord empty{0u, 0u, ~0ULL};
  // From a stack value: the copy is staged before cudaMemcpyAsync returns for pageable memory
  // this small, and the caller synchronises right after.
  const cudaError_t e =
      cudaMemcpyAsync(record, &empty, sizeof empty, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

}  // namespace retrace::cuda
