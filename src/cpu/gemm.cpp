#include "cpu/gemm.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/parallel.hpp"
#include "retrace/device.hpp"
#include "retrace/error.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

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
// Row-major matrices with a leading dimension (elements from one row to the next).
using Stride = Eigen::OuterStride<>;
using ConstMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Stride>;
using Map = Eigen::Map<RowMatrix, Eigen::Unaligned, Stride>;

// For a library that adds the product to C: with a bias (beta is then 0), C's rows start as the
// bias and the product is added with beta 1; returns the beta to pass on.
float start_from_bias(const float* bias, std::int64_t m, std::int64_t n, float* c,
                      std::int64_t ldc, float beta) {
  if (bias == nullptr) return beta;
  for (std::int64_t r = 0; r < m; ++r) std::copy(bias, bias + n, c + r * ldc);
  return 1.0f;
}

void eigen_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc) {
  Map out(c, m, n, Stride(ldc));
  const ConstMap a_map(a, ta ? k : m, ta ? m : k, Stride(lda));
  const ConstMap b_map(b, tb ? n : k, tb ? k : n, Stride(ldb));
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
  bool bf16 = false;       // bfloat16 A and B (float32 bias and accumulation); else float32
  bool float_out = false;  // with bf16: C float32 (else bfloat16)
  bool packed_b = false;   // B in the layout oneDNN prefers (a packed weight), not ldb rows
  bool operator==(const OnednnKey&) const = default;
};
struct OnednnKeyHash {
  std::size_t operator()(const OnednnKey& key) const noexcept {
    std::size_t h = 0;
    for (std::int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) {
      h = h * 1000003u ^ static_cast<std::size_t>(v);
    }
    return h * 31u + (key.ta ? 1u : 0u) + (key.tb ? 2u : 0u) + (key.accumulate ? 4u : 0u) +
           (key.bias ? 8u : 0u) + (key.bf16 ? 16u : 0u) + (key.float_out ? 32u : 0u) +
           (key.packed_b ? 64u : 0u);
  }
};
struct OnednnGemm {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias;
  dnnl::memory::desc scratchpad;
};

// oneDNN's scratch space (a packed block of B, partial sums) for the calls of one thread: kept
// and grown as needed. Left to the library, each call would allocate it (hundreds of MiB for a
// wide product: fresh pages the kernel zeroes on every call, a quarter of a VAE decode's time).
std::byte* onednn_scratchpad(std::size_t bytes) {
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    buffer.data.reset();
    buffer.data = std::make_unique_for_overwrite<std::byte[]>(bytes + 64);
    buffer.size = bytes;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data.get());
  return buffer.data.get() + ((64 - address % 64) % 64);
}

const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

OnednnGemm make_onednn_gemm(const OnednnKey& key) {
  using dnnl::memory;
  const dnnl::engine& engine = onednn_engine();
  const auto f32 = memory::data_type::f32;
  const auto operands = key.bf16 ? memory::data_type::bf16 : f32;
  // Row-major operands with leading dimensions; a transposed operand is its strides swapped.
  const memory::desc a_desc({key.m, key.k}, operands,
                            key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  const memory::desc b_desc =
      key.packed_b ? memory::desc({key.k, key.n}, operands, memory::format_tag::any)
                   : memory::desc({key.k, key.n}, operands,
                                  key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  const memory::desc c_desc({key.m, key.n}, key.float_out ? f32 : operands,
                            memory::dims{key.ldc, 1});
  const memory::desc bias_desc({1, key.n}, f32, memory::dims{key.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
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
          memory(desc.weights_desc(), engine, DNNL_MEMORY_NONE),
          memory(c_desc, engine, DNNL_MEMORY_NONE), memory(bias_desc, engine, DNNL_MEMORY_NONE),
          desc.scratchpad_desc()};
}

// Whether oneDNN runs its kernels for `isa` here. oneDNN's ISA values are sets of feature bits,
// not an order: avx2_vnni (0x407) compares above avx512_core (0x27) on CPUs without AVX-512.
bool onednn_isa_has(dnnl_cpu_isa_t isa) {
  const auto effective = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (effective & static_cast<unsigned>(isa)) == static_cast<unsigned>(isa);
}

// Whether oneDNN's kernels are the faster choice on this CPU (measured on AVX-512 only; other
// CPUs keep Eigen and OpenBLAS). RETRACE_NO_ONEDNN=1 in the environment turns them off (to
// compare).
bool onednn_preferred() {
  static const bool preferred = [] {
    return onednn_isa_has(dnnl_cpu_isa_avx512_core) &&
           std::getenv("RETRACE_NO_ONEDNN") == nullptr;
  }();
  return preferred;
}

// The calling thread's primitive for `key` (made on first use); null when oneDNN refuses the
// product.
OnednnGemm* find_onednn(const OnednnKey& key) {
  thread_local std::unordered_map<OnednnKey, OnednnGemm, OnednnKeyHash> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    // Bounded: a program whose shapes keep changing (a growing sequence) starts over rather
    // than keeping every shape's compiled kernel.
    constexpr std::size_t kMaxShapes = 256;
    if (cache.size() >= kMaxShapes) cache.clear();
    try {
      it = cache.emplace(key, make_onednn_gemm(key)).first;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  }
  return &it->second;
}

// One oneDNN call on the calling thread, while it lives: oneDNN's OpenMP team held to one
// thread (the calling thread's setting is put back after), and the thread's stream.
class OnednnCall {
 public:
  OnednnCall() : previous_threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OnednnCall() { omp_set_num_threads(previous_threads_); }
  OnednnCall(const OnednnCall&) = delete;
  OnednnCall& operator=(const OnednnCall&) = delete;
  static dnnl::stream& stream() {
    thread_local dnnl::stream stream(onednn_engine());
    return stream;
  }

 private:
  int previous_threads_;
};

// Runs g (made for a key with a bias when `bias` is given) on the calling thread. C's sum
// post-op, if any, adds C as it is.
void run_onednn(OnednnGemm& g, const void* a, const void* b, void* c, const void* bias) {
  g.a.set_data_handle(const_cast<void*>(a));
  g.b.set_data_handle(const_cast<void*>(b));
  g.c.set_data_handle(c);
  const OnednnCall call;
  dnnl::stream& stream = OnednnCall::stream();
  const dnnl::memory scratchpad(g.scratchpad, onednn_engine(),
                                onednn_scratchpad(g.scratchpad.get_size()));
  if (bias != nullptr) {
    g.bias.set_data_handle(const_cast<void*>(bias));
    g.primitive.execute(stream, {{DNNL_ARG_SRC, g.a},
                                 {DNNL_ARG_WEIGHTS, g.b},
                                 {DNNL_ARG_BIAS, g.bias},
                                 {DNNL_ARG_DST, g.c},
                                 {DNNL_ARG_SCRATCHPAD, scratchpad}});
  } else {
    g.primitive.execute(stream, {{DNNL_ARG_SRC, g.a},
                                 {DNNL_ARG_WEIGHTS, g.b},
                                 {DNNL_ARG_DST, g.c},
                                 {DNNL_ARG_SCRATCHPAD, scratchpad}});
  }
}

// --- packed weights ------------------------------------------------------------------------
// oneDNN multiplies by a B stored as plain rows by first copying each block of it into its
// kernels' layout, on every call and on every thread that takes rows of C. A B that comes from
// a buffer outside any trace's pool (a linear's weight, MatmulParams::b_buffer) is instead
// copied into that layout once (a reorder) and the copy reused while the buffer's write count
// stays the same: 3-8 % faster products at the DiT's shapes, more where two threads each took
// half the rows. The copy belongs to the buffer (Buffer::add_derived), so it is freed with it
// and can never be taken for another buffer made at the same address.
//
// - A copy is made at the second kernel call that sees the weight at one write count (the
//   products of one call, a block of rows per thread, count once): an operand rewritten before
//   every product (activations passed as B) never pays for a reorder.
// - The call that makes it multiplies both ways and compares the bits; the copy is used only if
//   they agree (they do: the same kernels, the same order of sums), so eager products and
//   replays that use it give the same bits. A disagreement turns packing off for the weight.
// - Packed copies take at most kPackedBudget bytes in the process; beyond, products read B as
//   it is. RETRACE_NO_WEIGHT_PACKING=1 turns packing off (to compare).
constexpr std::int64_t kPackedBudget = std::int64_t{2} << 30;
std::atomic<std::int64_t> packed_bytes{0};

bool packing_enabled() {
  static const bool enabled = std::getenv("RETRACE_NO_WEIGHT_PACKING") == nullptr;
  return enabled;
}

struct PackedWeight {
  std::mutex mutex;
  // Which product layout this is for (a hash collision of the key is caught here).
  std::int64_t offset, k, n, ldb;
  bool tb, bf16;
  std::uint64_t writes = 0;  // the buffer's write count when `sightings` started
  int sightings = 0;         // kernel calls at that count
  std::uint64_t last_call = 0;
  bool refused = false;      // packed and plain products disagreed
  dnnl::memory packed;       // the copy (empty until made)
  std::int64_t bytes = 0;

  void drop() {
    packed = dnnl::memory();
    packed_bytes.fetch_sub(bytes);
    bytes = 0;
  }
  ~PackedWeight() { drop(); }
};

// The entry of this kernel variant for B at `b` in `buffer`, or null where B is not a whole
// region of the buffer.
std::shared_ptr<PackedWeight> packed_entry(const Buffer& buffer, const void* b, std::int64_t k,
                                           std::int64_t n, std::int64_t ldb, bool tb, bool bf16) {
  const auto offset = static_cast<std::int64_t>(static_cast<const std::byte*>(b) -
                                                static_cast<const std::byte*>(buffer.data()));
  const std::int64_t elem = bf16 ? 2 : 4;
  const std::int64_t extent = ((tb ? n : k) - 1) * ldb + (tb ? k : n);
  if (offset < 0 || offset % elem != 0 ||
      offset + extent * elem > static_cast<std::int64_t>(buffer.size())) {
    return nullptr;
  }
  // One key space per kernel variant (each variant's objects are its own): the address of
  // this variant's budget counter tells them apart.
  std::uint64_t key = reinterpret_cast<std::uintptr_t>(&packed_bytes);
  for (std::int64_t v : {offset, k, n, ldb, std::int64_t{tb} * 2 + std::int64_t{bf16}}) {
    key = (key ^ static_cast<std::uint64_t>(v)) * 0x100000001b3u;
  }
  auto made = std::make_shared<PackedWeight>();
  made->offset = offset;
  made->k = k;
  made->n = n;
  made->ldb = ldb;
  made->tb = tb;
  made->bf16 = bf16;
  auto entry = std::static_pointer_cast<PackedWeight>(buffer.add_derived(key, made));
  if (entry->offset != offset || entry->k != k || entry->n != n || entry->ldb != ldb ||
      entry->tb != tb || entry->bf16 != bf16) {
    return nullptr;
  }
  return entry;
}

// B at `b`, laid out as `plain`'s product reads it, reordered into `packed`'s layout (empty
// where the budget is spent).
dnnl::memory pack_weight(const OnednnGemm& plain, const OnednnGemm& packed, const void* b) {
  using dnnl::memory;
  const memory::desc& packed_desc = packed.b.get_desc();
  const auto bytes = static_cast<std::int64_t>(packed_desc.get_size());
  if (packed_bytes.fetch_add(bytes) + bytes > kPackedBudget) {
    packed_bytes.fetch_sub(bytes);
    return {};
  }
  memory source(plain.b.get_desc(), onednn_engine(), const_cast<void*>(b));
  memory copy(packed_desc, onednn_engine());
  const OnednnCall call;
  dnnl::reorder(source, copy).execute(OnednnCall::stream(), source, copy);
  return copy;
}

// The product of `plain` (made by find_onednn) with B packed where `weight` allows (see
// above): true when done here, false when the caller should run the plain product.
bool packed_product(const OnednnKey& plain, const WeightSource* weight, const void* a,
                    const void* b, void* c, const void* bias) {
  if (weight == nullptr || plain.accumulate || !packing_enabled()) return false;
  const Buffer& buffer = *weight->buffer;
  const std::shared_ptr<PackedWeight> entry =
      packed_entry(buffer, b, plain.k, plain.n, plain.ldb, plain.tb, plain.bf16);
  if (entry == nullptr) return false;
  OnednnKey packed_key = plain;
  packed_key.packed_b = true;
  OnednnGemm* g = find_onednn(packed_key);
  if (g == nullptr) return false;
  std::unique_lock lock(entry->mutex);
  if (entry->refused) return false;
  const std::uint64_t writes = buffer.write_count();
  if (entry->writes != writes) {
    entry->drop();
    entry->writes = writes;
    entry->sightings = 0;
  }
  if (entry->packed && entry->packed.get_desc() == g->b.get_desc()) {
    const dnnl::memory packed = entry->packed;
    lock.unlock();
    run_onednn(*g, a, packed.get_data_handle(), c, bias);
    return true;
  }
  if (entry->last_call != weight->call) {
    entry->last_call = weight->call;
    ++entry->sightings;
  }
  if (entry->sightings < 2) return false;
  // The second call at this count: the plain product, then the packed one into scratch, and
  // the copy kept if their bits agree.
  OnednnGemm* plain_g = find_onednn(plain);
  if (plain_g == nullptr) return false;
  dnnl::memory packed = pack_weight(*plain_g, *g, b);
  run_onednn(*plain_g, a, b, c, bias);
  if (!packed) return true;
  const std::size_t elem = plain.bf16 && !plain.float_out ? 2 : 4;
  const auto row_bytes = static_cast<std::size_t>(plain.n) * elem;
  thread_local std::vector<std::byte> check;
  check.resize(static_cast<std::size_t>(plain.m) * row_bytes);
  OnednnKey dense_key = packed_key;
  dense_key.ldc = plain.n;
  OnednnGemm* check_g = find_onednn(dense_key);
  bool same = check_g != nullptr;
  if (same) {
    run_onednn(*check_g, a, packed.get_data_handle(), check.data(), bias);
    for (std::int64_t r = 0; r < plain.m && same; ++r) {
      same = std::memcmp(static_cast<const std::byte*>(c) + r * plain.ldc * elem,
                         check.data() + r * row_bytes, row_bytes) == 0;
    }
  }
  const auto bytes = static_cast<std::int64_t>(packed.get_desc().get_size());
  if (!same || buffer.write_count() != writes) {
    packed_bytes.fetch_sub(bytes);
    entry->refused = entry->refused || !same;
    return true;
  }
  entry->drop();
  entry->packed = packed;
  entry->bytes = bytes;
  return true;
}

// C = alpha op(A) op(B) + beta C (+ bias, one value per column, when given; beta is then 0)
// through oneDNN on the calling thread; false (nothing written) when oneDNN refuses the product
// (it then goes to another library). With alpha 1 the bias is the matmul's bias argument, added
// as C is written; with another alpha (where oneDNN's output scale and bias would raise which
// comes first) C starts as the bias rows and the product is added.
bool onednn_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                 float* c, std::int64_t ldc, const float* bias,
                 const WeightSource* weight = nullptr) {
  const bool fused = bias != nullptr && alpha == 1.0f;
  const bool accumulate = beta != 0.0f || (bias != nullptr && !fused);
  const OnednnKey key{m, n, k, lda, ldb, ldc, ta, tb, accumulate, fused, alpha};
  // Made first: a refusal leaves C untouched.
  OnednnGemm* g = find_onednn(key);
  if (g == nullptr) return false;
  if (bias != nullptr && !fused) {
    (void)start_from_bias(bias, m, n, c, ldc, beta);
  } else if (accumulate && beta != 1.0f) {  // the sum post-op adds C as it is
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < n; ++j) c[r * ldc + j] *= beta;
    }
  }
  if (packed_product(key, weight, a, b, c, fused ? bias : nullptr)) return true;
  run_onednn(*g, a, b, c, fused ? bias : nullptr);
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// The sum of 8 lanes: halves added onto each other (GCC's vector extensions: GCC 12 warns,
// with -Werror, in the AVX-512 shuffle intrinsics).
struct Lanes8 {
  static float sum(__m256 v) {
    using F8 = float __attribute__((vector_size(32)));
    using F4 = float __attribute__((vector_size(16)));
    const auto x = reinterpret_cast<F8>(v);
    const F4 quarter = __builtin_shufflevector(x, x, 0, 1, 2, 3) +
                       __builtin_shufflevector(x, x, 4, 5, 6, 7);
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  }
};
// The vector of this kernel variant: 16 floats (AVX-512) or 8 (AVX2), with a masked load of a
// row's last k % lanes values.
#if defined(__AVX512F__)
struct Lanes {
  using V = __m512;
  static constexpr std::int64_t n = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, std::int64_t count) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), p);
  }
  static void store_first(float* p, std::int64_t count, V v) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1u), v);
  }
  // bfloat16 values widened to float32 (exactly: the bits moved up 16 places).
  // (The zero-masked forms: GCC 12 warns, with -Werror, in the unmasked intrinsics, which
  // start from a deliberately undefined register.)
  static V widen(__m256i halves) {
    constexpr auto kAll = static_cast<__mmask16>(0xffff);
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, halves), 16));
  }
  static V load(const bfloat16* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_first(const bfloat16* p, std::int64_t count) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << count) - 1u), p));
  }
  static V broadcast(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) {  // halves added onto each other down to one lane
    using F16 = float __attribute__((vector_size(64)));
    using F8 = float __attribute__((vector_size(32)));
    const auto x = reinterpret_cast<F16>(v);
    const F8 half = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    return Lanes8::sum(reinterpret_cast<__m256>(half));
  }
};
#else
struct Lanes {
  using V = __m256;
  static constexpr std::int64_t n = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i first(std::int64_t count) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), index);
  }
  static V load_first(const float* p, std::int64_t count) {
    return _mm256_maskload_ps(p, first(count));
  }
  static void store_first(float* p, std::int64_t count, V v) {
    _mm256_maskstore_ps(p, first(count), v);
  }
  // bfloat16 values widened to float32 (exactly: the bits moved up 16 places).
  static V load(const bfloat16* p) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  }
  static V load_first(const bfloat16* p, std::int64_t count) {
    bfloat16 padded[n] = {};
    std::copy(p, p + count, padded);
    return load(padded);
  }
  static V broadcast(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) { return Lanes8::sum(v); }
};
#endif

// C[R rows, W columns] for R rows of A and W rows of B (a linear's weight rows, [n, k]): each
// element a dot product over k in vector lanes, the lanes summed at the end. Every weight value
// is loaded once for all R rows of A.
template <int R, int W, class B>
void thin_tile(std::int64_t k, float alpha, const float* a, std::int64_t lda, const B* b,
               std::int64_t ldb, float* c, std::int64_t ldc, const float* bias) {
  typename Lanes::V acc[R][W];
  for (auto& row : acc) {
    for (auto& v : row) v = Lanes::zero();
  }
  std::int64_t p = 0;
  for (; p + Lanes::n <= k; p += Lanes::n) {
    typename Lanes::V x[R];
    for (int r = 0; r < R; ++r) x[r] = Lanes::load(a + r * lda + p);
    for (int w = 0; w < W; ++w) {
      const typename Lanes::V y = Lanes::load(b + w * ldb + p);
      for (int r = 0; r < R; ++r) acc[r][w] = Lanes::fma(x[r], y, acc[r][w]);
    }
  }
  if (p < k) {
    typename Lanes::V x[R];
    for (int r = 0; r < R; ++r) x[r] = Lanes::load_first(a + r * lda + p, k - p);
    for (int w = 0; w < W; ++w) {
      const typename Lanes::V y = Lanes::load_first(b + w * ldb + p, k - p);
      for (int r = 0; r < R; ++r) acc[r][w] = Lanes::fma(x[r], y, acc[r][w]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int w = 0; w < W; ++w) {
      const float product = alpha * Lanes::sum(acc[r][w]);
      c[r * ldc + w] = bias == nullptr ? product : product + bias[w];
    }
  }
}

// R rows of A against all n weight rows: W at a time (R x W accumulators, enough independent
// FMA chains to cover their latency without spilling: 32 vector registers on AVX-512, 16 on
// AVX2), then one at a time. The tile width does not change any element's sum.
template <int R, class B>
void thin_rows(std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
               const B* b, std::int64_t ldb, float* c, std::int64_t ldc, const float* bias) {
  constexpr int kRegisters = Lanes::n == 16 ? 32 : 16;
  constexpr int W = R * 8 + R + 1 <= kRegisters ? 8 : R * 4 + R + 1 <= kRegisters ? 4 : 2;
  std::int64_t j = 0;
  for (; j + W <= n; j += W) {
    thin_tile<R, W, B>(k, alpha, a, lda, b + j * ldb, ldb, c + j, ldc,
                    bias == nullptr ? nullptr : bias + j);
  }
  for (; j < n; ++j) {
    thin_tile<R, 1, B>(k, alpha, a, lda, b + j * ldb, ldb, c + j, ldc,
                    bias == nullptr ? nullptr : bias + j);
  }
}

// One row of A against B stored as [k, n] (not transposed), vectorized over n, with the sums
// thin_tile makes: lane l of its accumulator takes the k indices p with p % lanes == l in
// order, and the lanes are added in its tree (halves onto each other). Here accumulator l holds
// lane l for a vector of columns, so each column comes out with exactly the bits a [n, k]
// weight gives: a product's bits do not depend on its operands' orientation.
template <class B>
void thin_row_columns(std::int64_t n, std::int64_t k, float alpha, const float* a, const B* b,
                      std::int64_t ldb, float* c, const float* bias) {
  constexpr std::int64_t L = Lanes::n;
  for (std::int64_t j = 0; j < n; j += L) {
    const std::int64_t width = std::min(L, n - j);
    const auto load = [&](const auto* p) {
      return width == L ? Lanes::load(p) : Lanes::load_first(p, width);
    };
    typename Lanes::V acc[L];
    for (auto& v : acc) v = Lanes::zero();
    std::int64_t p = 0;
    for (; p + L <= k; p += L) {
      for (std::int64_t l = 0; l < L; ++l) {
        acc[l] = Lanes::fma(Lanes::broadcast(a[p + l]), load(b + (p + l) * ldb + j), acc[l]);
      }
    }
    if (p < k) {  // thin_tile's masked last load: 0 * 0 added in the lanes past k
      for (std::int64_t l = 0; l < L; ++l) {
        acc[l] = p + l < k ? Lanes::fma(Lanes::broadcast(a[p + l]), load(b + (p + l) * ldb + j),
                                        acc[l])
                           : Lanes::fma(Lanes::zero(), Lanes::zero(), acc[l]);
      }
    }
    for (std::int64_t w = L / 2; w >= 4; w /= 2) {
      for (std::int64_t l = 0; l < w; ++l) acc[l] = Lanes::add(acc[l], acc[l + w]);
    }
    typename Lanes::V out = Lanes::mul(
        Lanes::broadcast(alpha),
        Lanes::add(Lanes::add(acc[0], acc[2]), Lanes::add(acc[1], acc[3])));
    if (bias != nullptr) out = Lanes::add(out, load(bias + j));
    Lanes::store_first(c + j, width, out);
  }
}
#endif

// A product of at most kThinRows rows of A (the adaLN projection of one conditioning row, a
// decoding step's tokens, the last rows of an attention block) on the calling thread: against
// B stored as [n, k] (a linear's weight) as dot products of contiguous rows, against B stored
// as [k, n] by thin_row_columns with the same sums, a transposed A copied out first. Reading
// the weight bounds these, and the libraries first copy it into their own blocked layout
// (oneDNN: ~300 us for a 1536x256 weight on one AVX-512 core, against 60-150 us here). False
// (nothing written) for other products, with beta != 0, and on kernel variants without FMA
// vectors. A column's value does not depend on n, so a product split by columns rounds as a
// whole one does.
// B may be bfloat16 (widened in registers: the bits of a float32 B of the same values).
constexpr std::int64_t kThinRows = 4;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
constexpr bool kThinLanes = true;  // this kernel variant has thin_gemm's vector lanes
#else
constexpr bool kThinLanes = false;
#endif
template <class B>
bool thin_gemm([[maybe_unused]] bool ta, [[maybe_unused]] bool tb,
               [[maybe_unused]] std::int64_t m, [[maybe_unused]] std::int64_t n,
               [[maybe_unused]] std::int64_t k, [[maybe_unused]] float alpha,
               [[maybe_unused]] const float* a, [[maybe_unused]] std::int64_t lda,
               [[maybe_unused]] const B* b, [[maybe_unused]] std::int64_t ldb,
               [[maybe_unused]] float beta, [[maybe_unused]] float* c,
               [[maybe_unused]] std::int64_t ldc, [[maybe_unused]] const float* bias) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  if (beta != 0.0f || m > kThinRows || m < 1 || k < 1) return false;
  if (ta) {  // A stored [k, m]: its few rows copied out
    thread_local std::vector<float> rows;
    rows.resize(static_cast<std::size_t>(m * k));
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t p = 0; p < k; ++p) rows[r * k + p] = a[p * lda + r];
    }
    return thin_gemm(false, tb, m, n, k, alpha, rows.data(), k, b, ldb, beta, c, ldc, bias);
  }
  if (!tb) {
    for (std::int64_t r = 0; r < m; ++r) {
      thin_row_columns(n, k, alpha, a + r * lda, b, ldb, c + r * ldc, bias);
    }
    return true;
  }
  switch (m) {
    case 1: thin_rows<1>(n, k, alpha, a, lda, b, ldb, c, ldc, bias); break;
    case 2: thin_rows<2>(n, k, alpha, a, lda, b, ldb, c, ldc, bias); break;
    case 3: thin_rows<3>(n, k, alpha, a, lda, b, ldb, c, ldc, bias); break;
    default: thin_rows<4>(n, k, alpha, a, lda, b, ldb, c, ldc, bias); break;
  }
  return true;
#else
  return false;
#endif
}

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
                float* c, std::int64_t ldc, const float* bias, const WeightSource* weight) {
  if (thin_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias)) return;
  if (!preferred_onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias,
                             weight)) {
    openblas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb,
                  start_from_bias(bias, m, n, c, ldc, beta), c, ldc);
  }
}

// A large product on the kernel threads: single-threaded library calls on disjoint blocks of
// rows of C (of columns for a single row). OpenBLAS's own threads are not used: after a call
// they spin for a while, and on a machine with as many kernel threads as cores a spinning
// OpenBLAS thread took a core from the next op's parallel loop (an attention ran at half speed
// about every other run). Each element of C is summed over k in the same order whatever the
// split, so the result does not depend on the number of threads. block(m, n, a, b, c, bias)
// does one block.
template <class T, class C, class Block>
void split_product(bool ta, bool tb, std::int64_t m, std::int64_t n, const T* a,
                   std::int64_t lda, const T* b, std::int64_t ldb, C* c, std::int64_t ldc,
                   const float* bias, Block&& block) {
  constexpr std::int64_t kMinRows = 8, kMinColumns = 64;
  // Rows, unless C is much wider than tall (a convolution's weights times its columns): then
  // each thread reads its own columns of B once instead of every thread reading all of B
  // (a 3x3 convolution of 128 channels at 256x256 on 2 threads: 124 -> 153 GFLOP/s).
  const bool by_columns = n >= 2 * kMinColumns && (m < 2 * kMinRows || n >= 16 * m);
  if (!by_columns) {
    parallel_for(m, kMinRows, [&](std::int64_t begin, std::int64_t end) {
      block(end - begin, n, ta ? a + begin : a + begin * lda, b, c + begin * ldc, bias);
    });
  } else {
    parallel_for(n, kMinColumns, [&](std::int64_t begin, std::int64_t end) {
      block(m, end - begin, a, tb ? b + begin * ldb : b + begin, c + begin,
            bias == nullptr ? nullptr : bias + begin);
    });
  }
}

void split_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc, const float* bias, const WeightSource* weight) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  split_product(ta, tb, m, n, a, lda, b, ldb, c, ldc, bias,
                [&](std::int64_t rows, std::int64_t cols, const float* a_block,
                    const float* b_block, float* c_block, const float* bias_block) {
                  block_gemm(ta, tb, rows, cols, k, alpha, a_block, lda, b_block, ldb, beta,
                             c_block, ldc, bias_block, weight);
                });
}

// A bfloat16 product of at most kThinRows rows (the adaLN projection of a conditioning row, a
// class embedding's one-hot row) by thin_gemm's float32 lanes reading the bfloat16 weight where
// it is: the bits of a float32 product of the converted operands, without converting the whole
// weight first. Columns split over the kernel threads as sgemm splits a thin float32 product.
// false (nothing written) on kernel variants without thin_gemm.
template <class C>
bool bfloat16_thin(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const bfloat16* a, std::int64_t lda, const bfloat16* b, std::int64_t ldb, C* c,
                   std::int64_t ldc, GemmLibrary library, const float* bias) {
  if constexpr (!kThinLanes) return false;
  constexpr bool kFloatOut = std::is_same_v<C, float>;
  thread_local std::vector<float> rows, wide_c;
  rows.resize(static_cast<std::size_t>(m * k));
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t p = 0; p < k; ++p) {
      rows[r * k + p] = a[ta ? p * lda + r : r * lda + p].to_float();
    }
  }
  if constexpr (!kFloatOut) wide_c.resize(static_cast<std::size_t>(m * n));
  float* out = kFloatOut ? reinterpret_cast<float*>(c) : wide_c.data();
  const std::int64_t ldo = kFloatOut ? ldc : n;
  const float* a_rows = rows.data();
  auto columns = [&](std::int64_t begin, std::int64_t end) {
    (void)thin_gemm(false, tb, m, end - begin, k, alpha, a_rows, k,
                    tb ? b + begin * ldb : b + begin, ldb, 0.0f, out + begin, ldo,
                    bias == nullptr ? nullptr : bias + begin);
  };
  if (library == GemmLibrary::automatic && !serial_kernels() &&
      gemm_choice(m, n, k) == GemmLibrary::automatic) {
    parallel_for(n, 64, columns);
  } else {
    columns(0, n);
  }
  if constexpr (!kFloatOut) {
    for (std::int64_t r = 0; r < m; ++r) narrow_block(wide_c.data() + r * n, c + r * ldc, n);
  }
  return true;
}

#if RETRACE_HAVE_ONEDNN
// `rows` rows of `cols` bfloat16 values, `ld` apart, as dense float32 rows in `out`.
void widen_rows(const bfloat16* data, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) widen_block(data + r * ld, out.data() + r * cols, cols);
}

// One block of a bfloat16 product on the calling thread: one oneDNN call, or where oneDNN
// refuses the shape, a float32 product of converted copies (rounded once as well).
template <class C>
void bfloat16_block(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                    std::int64_t ldb, C* c, std::int64_t ldc, const float* bias,
                    const WeightSource* weight) {
  constexpr bool kFloatOut = std::is_same_v<C, float>;
  const OnednnKey key{m, n, k, lda, ldb, ldc, ta, tb, /*accumulate=*/false,
                      /*bias=*/bias != nullptr, alpha, /*bf16=*/true, kFloatOut};
  if (OnednnGemm* g = find_onednn(key)) {
    if (packed_product(key, weight, a, b, c, bias)) return;
    run_onednn(*g, a, b, c, bias);
    return;
  }
  thread_local std::vector<float> wide_a, wide_b, wide_c;
  widen_rows(a, ta ? k : m, ta ? m : k, lda, wide_a);
  widen_rows(b, tb ? n : k, tb ? k : n, ldb, wide_b);
  if constexpr (kFloatOut) {
    sgemm_strided(ta, tb, m, n, k, alpha, wide_a.data(), ta ? m : k, wide_b.data(), tb ? k : n,
                  0.0f, c, ldc, GemmLibrary::this_thread, bias);
  } else {
    wide_c.resize(static_cast<std::size_t>(m * n));
    sgemm_strided(ta, tb, m, n, k, alpha, wide_a.data(), ta ? m : k, wide_b.data(), tb ? k : n,
                  0.0f, wide_c.data(), n, GemmLibrary::this_thread, bias);
    for (std::int64_t r = 0; r < m; ++r) narrow_block(wide_c.data() + r * n, c + r * ldc, n);
  }
}
#endif

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, const float* b, float beta, float* c, GemmLibrary library,
           const float* bias) {
  sgemm_strided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta,
                c, n, library, bias);
}

void sgemm_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc, GemmLibrary library,
                   const float* bias, const WeightSource* weight) {
  RETRACE_ASSERT(bias == nullptr || beta == 0.0f, "sgemm: a bias with beta {}", beta);
  // A device whose kernels keep to one thread: the calling thread at every size (OpenBLAS
  // would hand the product to its own threads, which concurrent callers contend for).
  if (library == GemmLibrary::automatic) {
    library = serial_kernels() ? GemmLibrary::this_thread : gemm_choice(m, n, k);
    if (library == GemmLibrary::automatic) {
      split_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias, weight);
      return;
    }
  }
  switch (library) {
    case GemmLibrary::this_thread:
      if (thin_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias)) {
        return;
      }
      // Below ~32k multiply-adds Eigen's inlined product beats a library call.
      if (m * n * k >= (std::int64_t{1} << 15) &&
          preferred_onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                                bias, weight)) {
        return;
      }
      [[fallthrough]];
    case GemmLibrary::eigen:
      eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                 start_from_bias(bias, m, n, c, ldc, beta), c, ldc);
      return;
    case GemmLibrary::onednn:
#if RETRACE_HAVE_ONEDNN
      if (onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias,
                      weight)) {
        return;
      }
#endif
      break;  // not built, or refused: OpenBLAS below
    case GemmLibrary::openblas:
    case GemmLibrary::automatic:
      break;
  }
  // OpenBLAS as the process has it configured (its own threads): what benchmarks compare with.
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                start_from_bias(bias, m, n, c, ldc, beta), c, ldc);
}

std::int64_t packed_weight_bytes() noexcept {
#if RETRACE_HAVE_ONEDNN
  return packed_bytes.load();
#else
  return 0;
#endif
}

bool bfloat16_gemm_native() noexcept {
#if RETRACE_HAVE_ONEDNN
  static const bool native = onednn_preferred() &&
                             onednn_isa_has(dnnl_cpu_isa_avx512_core_bf16) &&
                             std::getenv("RETRACE_NO_BF16_GEMM") == nullptr;
  return native;
#else
  return false;
#endif
}

const char* bfloat16_gemm_path() noexcept {
#if RETRACE_HAVE_ONEDNN
  if (bfloat16_gemm_native()) {
    return onednn_isa_has(dnnl_cpu_isa_avx512_core_amx) ? "amx_bf16" : "avx512_bf16";
  }
#endif
  return "float32";
}

namespace {
template <class C>
bool bfloat16_product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                      std::int64_t ldb, C* c, std::int64_t ldc, GemmLibrary library,
                      const float* bias, const WeightSource* weight) {
  if (m < 1 || n < 1 || k < 1) return false;
  if (library != GemmLibrary::onednn && m <= kThinRows &&
      bfloat16_thin(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, library, bias)) {
    return true;
  }
#if RETRACE_HAVE_ONEDNN
  if (!bfloat16_gemm_native() || (bias != nullptr && alpha != 1.0f)) return false;
  if (library == GemmLibrary::onednn) {  // whatever the size, on the calling thread
    bfloat16_block(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, bias, weight);
    return true;
  }
  if (m <= kThinRows || m * n * k < (std::int64_t{1} << 15)) return false;
  if (library == GemmLibrary::automatic) {
    library = serial_kernels() ? GemmLibrary::this_thread : gemm_choice(m, n, k);
  }
  if (library != GemmLibrary::automatic) {
    bfloat16_block(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, bias, weight);
    return true;
  }
  split_product(trans_a, trans_b, m, n, a, lda, b, ldb, c, ldc, bias,
                [&](std::int64_t rows, std::int64_t cols, const bfloat16* a_block,
                    const bfloat16* b_block, C* c_block, const float* bias_block) {
                  bfloat16_block(trans_a, trans_b, rows, cols, k, alpha, a_block, lda, b_block,
                                 ldb, c_block, ldc, bias_block, weight);
                });
  return true;
#else
  return false;
#endif
}
}  // namespace

bool bfloat16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                   std::int64_t ldb, bfloat16* c, std::int64_t ldc, GemmLibrary library,
                   const float* bias, const WeightSource* weight) {
  return bfloat16_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, library,
                          bias, weight);
}

bool bfloat16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const bfloat16* a, std::int64_t lda, const bfloat16* b,
                   std::int64_t ldb, float* c, std::int64_t ldc, GemmLibrary library,
                   const float* bias, const WeightSource* weight) {
  return bfloat16_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, library,
                          bias, weight);
}

}  // namespace retrace::cpu
