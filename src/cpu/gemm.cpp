#include "cpu/gemm.hpp"

#include <Eigen/Core>
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
  // Thin or small products: Eigen (no threading overhead, good blocking for few rows).
  if (m <= 64 || n <= 64 || m * n * k <= 64 * 64 * 64) return GemmLibrary::eigen;
  return GemmLibrary::openblas;
}

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c, GemmLibrary library) {
  if (library == GemmLibrary::automatic) library = gemm_choice(m, n, k);
  if (library == GemmLibrary::eigen) {
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(trans_a ? m : k), b,
              static_cast<int>(trans_b ? k : n), beta, c, static_cast<int>(n));
}

}  // namespace retrace::cpu
