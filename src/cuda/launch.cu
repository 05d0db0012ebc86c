// launch_command: KernelId -> the CUDA launcher of its family.
#include "cuda/common.cuh"
#include "cuda/kernels_cuda.hpp"

namespace retrace::cuda {

namespace {
template <class P>
const P& as(const void* params) {
  return *static_cast<const P*>(params);
}

bool is_float(DType dtype) {
  return dtype == DType::float32 || dtype == DType::bfloat16;
}
}  // namespace

std::size_t scratch_bytes(KernelId kernel, const void* params) noexcept {
  if (kernel == KernelId::attention) return attention_scratch_bytes(as<AttentionParams>(params));
  return 0;
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
      return p.batch * p.heads * p.sq > kMaxRows ? "more than 2^31-1 query rows" : nullptr;
    }
    case KernelId::strided_copy: {
      const int es = as<StridedCopyParams>(params).elem_size;
      return es == 1 || es == 2 || es == 4 ? nullptr : "elements of this size";
    }
    case KernelId::tilize: {
      const int es = as<TilizeParams>(params).elem_size;
      return es == 1 || es == 2 || es == 4 ? nullptr : "elements of this size";
    }
    case KernelId::fill:
    case KernelId::copy:
    case KernelId::typecast:
      return nullptr;
    case KernelId::count_:
      break;
  }
  return "this kernel";
}

cudaError_t launch_command(KernelId kernel, const void* params, const LaunchContext& ctx,
                           cublasStatus_t* blas_status) {
  switch (kernel) {
    case KernelId::fill:
      return launch_fill(as<FillParams>(params), ctx);
    case KernelId::copy:
      return launch_copy(as<CopyParams>(params), ctx);
    case KernelId::binary:
      return launch_binary(as<BinaryParams>(params), ctx);
    case KernelId::binary_scalar:
      return launch_binary_scalar(as<BinaryScalarParams>(params), ctx);
    case KernelId::assert_finite:
      return launch_assert_finite(as<AssertFiniteParams>(params), ctx);
    case KernelId::unary:
      return launch_unary(as<UnaryParams>(params), ctx);
    case KernelId::reduce:
      return launch_reduce(as<ReduceParams>(params), ctx);
    case KernelId::softmax:
      return launch_softmax(as<SoftmaxParams>(params), ctx);
    case KernelId::norm:
      return launch_norm(as<NormParams>(params), ctx);
    case KernelId::matmul:
      return launch_matmul(as<MatmulParams>(params), ctx, blas_status);
    case KernelId::strided_copy:
      return launch_strided_copy(as<StridedCopyParams>(params), ctx);
    case KernelId::typecast:
      return launch_typecast(as<TypecastParams>(params), ctx);
    case KernelId::tilize:
      return launch_tilize(as<TilizeParams>(params), ctx);
    case KernelId::attention:
      return launch_attention(as<AttentionParams>(params), ctx, blas_status);
    case KernelId::count_:
      break;
  }
  return cudaErrorInvalidValue;
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
