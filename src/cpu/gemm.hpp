// Single-precision GEMM on the CPU, through Eigen, OpenBLAS or oneDNN, chosen by shape and CPU as
// measured in bench/bench_ops.cpp: small products on the calling thread (Eigen; oneDNN from ~32k
// multiply-adds on AVX-512 CPUs when built with it); from about a million multiply-adds up,
// single-threaded library calls (oneDNN on AVX-512, else OpenBLAS) on blocks of C split over the
// kernel threads. On AVX2 and AVX-512 kernel variants a product of at most 4 rows of A (with beta
// 0) is instead a set of dot products in vector lanes (the libraries first copy the whole of B
// into a blocked layout, which dominates when A has a row or two); its bits do not depend on
// whether A or B is stored transposed.
#pragma once

#include "retrace/bfloat16.hpp"

#include <cstdint>

namespace retrace {
class Buffer;
}

namespace retrace::cpu {

// Where a product's B comes from when it is a whole operand of a kernel call read alike by all
// its products (a linear's weight; MatmulParams::b_buffer): its buffer, and a number that tells
// one kernel call from the next (the products of one call count as one use of the weight). A
// product given one may multiply by a packed copy of B (see gemm.cpp).
struct WeightSource {
  const Buffer* buffer;
  std::uint64_t call;
};

// automatic: by shape (see above). this_thread: the faster single-threaded library on the calling
// thread (for callers already inside a parallel loop). eigen: Eigen on the calling thread.
// openblas: one OpenBLAS call with the threads OpenBLAS is configured for; onednn: one oneDNN
// call on the calling thread (OpenBLAS when built without oneDNN) - for benchmarks that
// compare libraries.
enum class GemmLibrary : std::uint8_t { automatic, this_thread, eigen, openblas, onednn };

// C[m, n] = alpha * op(A) * op(B) + beta * C, row-major. op(A) is A[m, k] or, transposed,
// stored as [k, m]; likewise B[k, n] or [n, k]. With `bias` (n values; beta must be 0), bias
// is added to every row: C[i, j] = (alpha * op(A) * op(B))[i, j] + bias[j]. oneDNN adds it as
// it writes C (when alpha is 1); otherwise C starts as the bias rows and the product is added
// with beta 1, an extra pass over C. The choice depends on the shape only, so a shape always
// rounds the same way.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c,
           GemmLibrary library = GemmLibrary::automatic, const float* bias = nullptr);

// The same with the operands' leading dimensions (elements from one stored row to the next:
// at least k for an A[m, k], m for a transposed one, and so on): blocks of larger matrices.
void sgemm_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc,
                   GemmLibrary library = GemmLibrary::automatic, const float* bias = nullptr,
                   const WeightSource* weight = nullptr);

// bfloat16 products without converting the operands first: C = alpha * op(A) * op(B) (+ bias,
// n float32 values), A and B bfloat16, each product exact in float32 and summed in float32, C
// rounded once to bfloat16 (to nearest even).
// - On the CPU's bfloat16 instructions (AVX512-BF16 dot products, AMX-BF16 tiles) through
//   oneDNN, which picks them at run time (bfloat16_gemm_native()): split over the kernel
//   threads by the rules of sgemm (blocks of rows, or of columns for a wide C), each block one
//   oneDNN call on its thread.
// - Products of at most 4 rows, on kernel variants with FMA vectors, whatever the CPU: sgemm's
//   thin float32 lanes reading the bfloat16 weight in place (the bits of the float32 product of
//   the converted operands).
// false, nothing written, where the caller should convert to float32 and call sgemm instead:
// neither applies, an empty product, alpha other than 1 with a bias, or (unless `library` is
// onednn: one call on the calling thread whatever the size) under ~32k multiply-adds.
bool bfloat16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                   std::int64_t ldb, bfloat16* c, std::int64_t ldc,
                   GemmLibrary library = GemmLibrary::automatic, const float* bias = nullptr,
                   const WeightSource* weight = nullptr);
// The same with C in float32 (not rounded): attention's scores and weighted values.
bool bfloat16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                   std::int64_t ldb, float* c, std::int64_t ldc,
                   GemmLibrary library = GemmLibrary::automatic, const float* bias = nullptr,
                   const WeightSource* weight = nullptr);

// Whether bfloat16_gemm runs here: built with oneDNN, a CPU with AVX512-BF16 or AMX-BF16 as
// oneDNN sees it, and neither RETRACE_NO_ONEDNN nor RETRACE_NO_BF16_GEMM set. Elsewhere
// bfloat16 products are float32 products of converted operands (slower than float32 itself
// on CPUs without bfloat16 instructions, which convert in software).
[[nodiscard]] bool bfloat16_gemm_native() noexcept;
// "amx_bf16", "avx512_bf16" or "float32" (converted operands): what bfloat16 products run on.
[[nodiscard]] const char* bfloat16_gemm_path() noexcept;

// Bytes held by this kernel variant's packed weights (oneDNN-layout copies of weights that
// linear and matmul read, kept while the weight's buffer is not written; see gemm.cpp).
[[nodiscard]] std::int64_t packed_weight_bytes() noexcept;

// What `automatic` does with a shape: this_thread, or automatic for a product split over the
// kernel threads.
[[nodiscard]] GemmLibrary gemm_choice(std::int64_t m, std::int64_t n, std::int64_t k) noexcept;

}  // namespace retrace::cpu
