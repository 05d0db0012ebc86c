#include "cpu/gemm.hpp"
#include "cpu/parallel.hpp"

// GCC 12 warns "(may be) used uninitialized" inside its own AVX-512 intrinsics as Eigen inlines
// them (the intrinsics start from a deliberately undefined register); silenced here, for this
// include only, so the avx512 kernel variant builds with warnings as errors.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <cblas.h>

namespace retrace::cpu {

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

void eigen_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, const float* b, float beta, float* c) {
  Map out(c, m, n);
  const ConstMap a_map(a, ta ? k : m, ta ? m : k);
  const ConstMap b_map(b, tb ? n : k, tb ? k : n);
  if (beta == 0.0f) out.setZero();
  else if (beta != 1.0f) out *= beta;
  if (!ta && !tb) out.noalias() += alpha * a_map * b_map;
  else if (ta && !tb) out.noalias() += alpha * a_map.transpose() * b_map;
  else if (!ta && tb) out.noalias() += alpha * a_map * b_map.transpose();
  else out.noalias() += alpha * a_map.transpose() * b_map.transpose();
}
}  // namespace

GemmLibrary gemm_choice(std::int64_t m, std::int64_t n, std::int64_t k) noexcept {
  // Measured on the 2-core build machines (bench/bench_ops.cpp): single-threaded, Eigen beats
  // OpenBLAS on thin shapes (32 rows: 77-80 vs 65-70 GFLOP/s) but OpenBLAS on two threads beats
  // both from about a million multiply-adds up (32x256x256: 124 GFLOP/s). Below that the
  // hand-off to the second core does not pay: Eigen.
  return m * n * k < (std::int64_t{1} << 20) ? GemmLibrary::eigen : GemmLibrary::openblas;
}

namespace {

void openblas_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                   float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// OpenBLAS on the kernel threads: single-threaded OpenBLAS calls on disjoint blocks of rows of C
// (of columns for a single row). OpenBLAS's own threads are not used: after a call they spin
// for a while, and on a machine with as many kernel threads as cores a spinning OpenBLAS thread
// took a core from the next op's parallel loop (an attention ran at half speed about every
// other run). Each element of C is summed over k in the same order whatever the split, so the
// result does not depend on the number of threads.
void split_openblas_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                         float alpha, const float* a, const float* b, float beta, float* c) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
  constexpr std::int64_t kMinRows = 8, kMinColumns = 64;
  if (m >= 2 * kMinRows || n < 2 * kMinColumns) {
    parallel_for(m, kMinRows, [&](std::int64_t begin, std::int64_t end) {
      openblas_gemm(ta, tb, end - begin, n, k, alpha, ta ? a + begin : a + begin * k, lda, b,
                    ldb, beta, c + begin * n, n);
    });
  } else {
    parallel_for(n, kMinColumns, [&](std::int64_t begin, std::int64_t end) {
      openblas_gemm(ta, tb, m, end - begin, k, alpha, a, lda, tb ? b + begin * k : b + begin,
                    ldb, beta, c + begin, n);
    });
  }
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c, GemmLibrary library) {
  // A device whose kernels keep to one thread: Eigen, single-threaded at every size (OpenBLAS
  // would hand the product to its own threads, which concurrent callers contend for).
  if (library == GemmLibrary::automatic) {
    library = serial_kernels() ? GemmLibrary::eigen : gemm_choice(m, n, k);
    if (library == GemmLibrary::openblas) {
      split_openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
      return;
    }
  }
  if (library == GemmLibrary::eigen) {
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    return;
  }
  // OpenBLAS as the process has it configured (its own threads): what benchmarks compare with.
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c,
                n);
}

}  // namespace retrace::cpu
