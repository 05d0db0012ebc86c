// Single-precision GEMM on the CPU, through Eigen or OpenBLAS, chosen by shape as measured in
// bench/bench_ops.cpp (Eigen single-threaded for small products; from about a million
// multiply-adds up, single-threaded OpenBLAS calls on blocks of C split over the kernel threads).
#pragma once

#include <cstdint>

namespace retrace::cpu {

// automatic: by shape (see above). eigen: Eigen on the calling thread. openblas: one OpenBLAS
// call with the threads OpenBLAS is configured for (for benchmarks that compare libraries).
enum class GemmLibrary : std::uint8_t { automatic, eigen, openblas };

// C[m, n] = alpha * op(A) * op(B) + beta * C, row-major. op(A) is A[m, k] or, transposed,
// stored as [k, m]; likewise B[k, n] or [n, k].
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c,
           GemmLibrary library = GemmLibrary::automatic);

// Which library `automatic` picks for a shape.
[[nodiscard]] GemmLibrary gemm_choice(std::int64_t m, std::int64_t n, std::int64_t k) noexcept;

}  // namespace retrace::cpu
