#include "cpu/gemm.hpp"
#include "cpu/parallel.hpp"
#include "retrace/error.hpp"

#include <algorithm>

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

#if RETRACE_HAVE_ONEDNN
#include <omp.h>

#include <dnnl.hpp>
#include <unordered_map>
#endif

namespace retrace::cpu {

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

// For a library that adds the product to C: with a bias (beta is then 0), C's rows start as the
// bias and the product is added with beta 1; returns the beta to pass on.
float start_from_bias(const float* bias, std::int64_t m, std::int64_t n, float* c,
                      std::int64_t ldc, float beta) {
  if (bias == nullptr) return beta;
  for (std::int64_t r = 0; r < m; ++r) std::copy(bias, bias + n, c + r * ldc);
  return 1.0f;
}

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
#if RETRACE_HAVE_ONEDNN
// oneDNN's matmul (its brgemm kernels): 10-20 % faster than Eigen and OpenBLAS single-threaded
// at the transformer's shapes on AVX-512 machines (bench/bench_ops.cpp). A primitive is made
// once per shape and thread (creating one costs tens of microseconds) and reused with new
// pointers; each call runs on the calling thread (oneDNN's OpenMP team is held to one thread for
// the call), so a product is summed in the same order whatever the kernel threads.
struct OnednnKey {
  std::int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb, accumulate, bias;
  float alpha;
  bool operator==(const OnednnKey&) const = default;
};
struct OnednnKeyHash {
  std::size_t operator()(const OnednnKey& key) const noexcept {
    std::size_t h = 0;
    for (std::int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) {
      h = h * 1000003u ^ static_cast<std::size_t>(v);
    }
    return h * 31u + (key.ta ? 1u : 0u) + (key.tb ? 2u : 0u) + (key.accumulate ? 4u : 0u) +
           (key.bias ? 8u : 0u);
  }
};
struct OnednnGemm {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias;
};

const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

OnednnGemm make_onednn_gemm(const OnednnKey& key) {
  using dnnl::memory;
  const dnnl::engine& engine = onednn_engine();
  const auto f32 = memory::data_type::f32;
  // Row-major operands with leading dimensions; a transposed operand is its strides swapped.
  const memory::desc a_desc({key.m, key.k}, f32,
                            key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  const memory::desc b_desc({key.k, key.n}, f32,
                            key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  const memory::desc c_desc({key.m, key.n}, f32, memory::dims{key.ldc, 1});
  const memory::desc bias_desc({1, key.n}, f32, memory::dims{key.n, 1});
  dnnl::primitive_attr attr;
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.accumulate) {
    dnnl::post_ops post;
    post.append_sum(1.0f);
    attr.set_post_ops(post);
  }
  const dnnl::matmul::primitive_desc desc(
      key.bias ? dnnl::matmul::desc(a_desc, b_desc, bias_desc, c_desc)
               : dnnl::matmul::desc(a_desc, b_desc, c_desc),
      attr, engine);
  return {dnnl::matmul(desc), memory(a_desc, engine, DNNL_MEMORY_NONE),
          memory(b_desc, engine, DNNL_MEMORY_NONE), memory(c_desc, engine, DNNL_MEMORY_NONE),
          memory(bias_desc, engine, DNNL_MEMORY_NONE)};
}

// Whether oneDNN's kernels are the faster choice on this CPU (measured on AVX-512 only; other
// CPUs keep Eigen and OpenBLAS). RETRACE_NO_ONEDNN=1 in the environment turns them off (to
// compare).
bool onednn_preferred() {
  static const bool preferred = [] {
    return dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core &&
           std::getenv("RETRACE_NO_ONEDNN") == nullptr;
  }();
  return preferred;
}

// C = alpha op(A) op(B) + beta C (+ bias, one value per column, when given; beta is then 0)
// through oneDNN on the calling thread; false (nothing written) when oneDNN refuses the product
// (it then goes to another library). With alpha 1 the bias is the matmul's bias argument, added
// as C is written; with another alpha (where oneDNN's output scale and bias would raise which
// comes first) C starts as the bias rows and the product is added.
bool onednn_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                 float* c, std::int64_t ldc, const float* bias) {
  thread_local std::unordered_map<OnednnKey, OnednnGemm, OnednnKeyHash> cache;
  const bool fused = bias != nullptr && alpha == 1.0f;
  const bool accumulate = beta != 0.0f || (bias != nullptr && !fused);
  const OnednnKey key{m, n, k, lda, ldb, ldc, ta, tb, accumulate, fused, alpha};
  auto it = cache.find(key);
  if (it == cache.end()) {
    // Bounded: a program whose shapes keep changing (a growing sequence) starts over rather
    // than keeping every shape's compiled kernel.
    constexpr std::size_t kMaxShapes = 256;
    if (cache.size() >= kMaxShapes) cache.clear();
    try {
      it = cache.emplace(key, make_onednn_gemm(key)).first;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  if (bias != nullptr && !fused) {
    (void)start_from_bias(bias, m, n, c, ldc, beta);
  } else if (accumulate && beta != 1.0f) {  // the sum post-op adds C as it is
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < n; ++j) c[r * ldc + j] *= beta;
    }
  }
  OnednnGemm& g = it->second;
  g.a.set_data_handle(const_cast<float*>(a));
  g.b.set_data_handle(const_cast<float*>(b));
  g.c.set_data_handle(c);
  thread_local dnnl::stream stream(onednn_engine());
  // One OpenMP thread for the call; the calling thread's setting is put back.
  const int previous_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  if (fused) {
    g.bias.set_data_handle(const_cast<float*>(bias));
    g.primitive.execute(stream, {{DNNL_ARG_SRC, g.a},
                                 {DNNL_ARG_WEIGHTS, g.b},
                                 {DNNL_ARG_BIAS, g.bias},
                                 {DNNL_ARG_DST, g.c}});
  } else {
    g.primitive.execute(stream,
                        {{DNNL_ARG_SRC, g.a}, {DNNL_ARG_WEIGHTS, g.b}, {DNNL_ARG_DST, g.c}});
  }
  omp_set_num_threads(previous_threads);
  return true;
}
#endif

}  // namespace

GemmLibrary gemm_choice(std::int64_t m, std::int64_t n, std::int64_t k) noexcept {
  // Measured on the 2-core build machines (bench/bench_ops.cpp): single-threaded, Eigen beats
  // OpenBLAS on thin shapes (32 rows: 77-80 vs 65-70 GFLOP/s) but OpenBLAS on two threads beats
  // both from about a million multiply-adds up (32x256x256: 124 GFLOP/s). Below that the
  // hand-off to the second core does not pay: one thread.
  // A thin product against a large matrix (a GEMV: the adaLN projection of one conditioning
  // row) is bound by reading that matrix, which two cores read faster than one: its columns are
  // split (split_gemm) however few the multiply-adds.
  if (m < 16 && n >= 128 && n * k >= (std::int64_t{1} << 17)) return GemmLibrary::automatic;
  return m * n * k < (std::int64_t{1} << 20) ? GemmLibrary::this_thread : GemmLibrary::automatic;
}

namespace {

void openblas_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                   float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// oneDNN where it is the faster library (built with it, AVX-512 CPU): true when it did the
// product (onednn_gemm's arguments), false when the caller should use another library.
template <class... GemmArgs>
bool preferred_onednn_gemm([[maybe_unused]] GemmArgs... args) {
#if RETRACE_HAVE_ONEDNN
  return onednn_preferred() && onednn_gemm(args...);
#else
  return false;
#endif
}

// One block of a split product on the calling thread: oneDNN where it is the faster library,
// else OpenBLAS held to one thread.
void block_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc, const float* bias) {
  if (!preferred_onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias)) {
    openblas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb,
                  start_from_bias(bias, m, n, c, ldc, beta), c, ldc);
  }
}

// A large product on the kernel threads: single-threaded library calls on disjoint blocks of
// rows of C (of columns for a single row). OpenBLAS's own threads are not used: after a call
// they spin for a while, and on a machine with as many kernel threads as cores a spinning
// OpenBLAS thread took a core from the next op's parallel loop (an attention ran at half speed
// about every other run). Each element of C is summed over k in the same order whatever the
// split, so the result does not depend on the number of threads.
void split_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                float* c, const float* bias) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  constexpr std::int64_t kMinRows = 8, kMinColumns = 64;
  if (m >= 2 * kMinRows || n < 2 * kMinColumns) {
    parallel_for(m, kMinRows, [&](std::int64_t begin, std::int64_t end) {
      block_gemm(ta, tb, end - begin, n, k, alpha, ta ? a + begin : a + begin * k, lda, b, ldb,
                 beta, c + begin * n, n, bias);
    });
  } else {
    parallel_for(n, kMinColumns, [&](std::int64_t begin, std::int64_t end) {
      block_gemm(ta, tb, m, end - begin, k, alpha, a, lda, tb ? b + begin * k : b + begin, ldb,
                 beta, c + begin, n, bias == nullptr ? nullptr : bias + begin);
    });
  }
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c, GemmLibrary library,
           const float* bias) {
  RETRACE_ASSERT(bias == nullptr || beta == 0.0f, "sgemm: a bias with beta {}", beta);
  // A device whose kernels keep to one thread: the calling thread at every size (OpenBLAS
  // would hand the product to its own threads, which concurrent callers contend for).
  const std::int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  if (library == GemmLibrary::automatic) {
    library = serial_kernels() ? GemmLibrary::this_thread : gemm_choice(m, n, k);
    if (library == GemmLibrary::automatic) {
      split_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, bias);
      return;
    }
  }
  switch (library) {
    case GemmLibrary::this_thread:
      // Below ~32k multiply-adds Eigen's inlined product beats a library call.
      if (m * n * k >= (std::int64_t{1} << 15) &&
          preferred_onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n,
                                bias)) {
        return;
      }
      [[fallthrough]];
    case GemmLibrary::eigen:
      eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, b,
                 start_from_bias(bias, m, n, c, n, beta), c);
      return;
    case GemmLibrary::onednn:
#if RETRACE_HAVE_ONEDNN
      if (onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n, bias)) return;
#endif
      break;  // not built, or refused: OpenBLAS below
    case GemmLibrary::openblas:
    case GemmLibrary::automatic:
      break;
  }
  // OpenBLAS as the process has it configured (its own threads): what benchmarks compare with.
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                start_from_bias(bias, m, n, c, n, beta), c, n);
}

}  // namespace retrace::cpu
