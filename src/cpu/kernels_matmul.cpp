// Matmul and attention CPU kernels. float32 goes straight to sgemm; bfloat16 goes to
// bfloat16_gemm (the CPU's bfloat16 instructions, or the weight read in place by thin
// products); otherwise (and float16) operands are converted to float32 in per-thread scratch
// buffers, multiplied, and rounded once on the way out.
#include "cpu/elementwise.hpp"
#include "cpu/gemm.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/error.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace retrace::cpu {

namespace {

// A float32 view of n elements of T: the data itself for float, a converted copy otherwise.
template <class T>
const float* as_float(const T* data, std::int64_t n, int slot) {
  if constexpr (std::is_same_v<T, float>) {
    return data;
  } else {
    float* out = thread_scratch(slot, n);
    // Split over the kernel threads when called outside a parallel loop (a matmul's operands).
    parallel_for(n, std::int64_t{1} << 15, [&](std::int64_t begin, std::int64_t end) {
      widen_block(data + begin, out + begin, end - begin);
    });
    return out;
  }
}

// Loops over independent products (a batch of small ones, attention's (batch, head, block)
// items) give each thread at least this many multiply-adds, as a product is split from about
// this size: a smaller share costs more to hand to a helper (microseconds, tens of them when it
// sleeps or, on a busy machine, waits for a core) than it saves. Which thread runs an item never
// changes its bits.
constexpr std::int64_t kMinSplitWork = std::int64_t{1} << 20;
std::int64_t items_per_part(std::int64_t work_per_item) {
  return std::max<std::int64_t>(1, kMinSplitWork / std::max<std::int64_t>(work_per_item, 1));
}

template <class T>
void store_from_float(const float* src, T* dst, std::int64_t n) {
  parallel_for(n, std::int64_t{1} << 15, [&](std::int64_t begin, std::int64_t end) {
    narrow_block(src + begin, dst + begin, end - begin);
  });
}

template <class T>
void matmul_kernel(const std::byte* raw) {
  const auto& p = params_as<MatmulParams>(raw);
  std::int64_t batches = 1;
  for (int d = 0; d < p.batch_rank; ++d) batches *= p.batch_shape[d];
  const std::int64_t mn = p.m * p.n, mk = p.m * p.k, kn = p.k * p.n;
  // Converted once (in this thread's scratch; the batches only read it).
  const float* bias =
      p.bias == nullptr ? nullptr : as_float(static_cast<const T*>(p.bias), p.n, 3);
  // A B read alike by every batch may be used packed (MatmulParams::b_buffer).
  bool shared_b = p.b_buffer != nullptr;
  for (int d = 0; d < p.batch_rank; ++d) shared_b = shared_b && p.b_batch_strides[d] == 0;
  static std::atomic<std::uint64_t> calls{0};
  const WeightSource source{p.b_buffer, shared_b ? calls.fetch_add(1) + 1 : 0};
  const WeightSource* weight = shared_b ? &source : nullptr;
  auto one = [&](std::int64_t batch, GemmLibrary library) {
    std::int64_t offsets[2];
    row_offsets(batch, p.batch_shape, p.batch_rank, {p.a_batch_strides, p.b_batch_strides},
                offsets);
    T* out = static_cast<T*>(p.out) + batch * mn;
    if constexpr (std::is_same_v<T, bfloat16>) {
      // Without converting the operands where bfloat16_gemm can (float32 sums, one rounding).
      if (bfloat16_gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                        static_cast<const T*>(p.a) + offsets[0], p.trans_a ? p.m : p.k,
                        static_cast<const T*>(p.b) + offsets[1], p.trans_b ? p.k : p.n, out, p.n,
                        library, bias, weight)) {
        return;
      }
    }
    const float* a = as_float(static_cast<const T*>(p.a) + offsets[0], mk, 0);
    const float* b = as_float(static_cast<const T*>(p.b) + offsets[1], kn, 1);
    float* c = std::is_same_v<T, float> ? reinterpret_cast<float*>(out) : thread_scratch(2, mn);
    sgemm_strided(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, p.trans_a ? p.m : p.k, b,
                  p.trans_b ? p.k : p.n, 0.0f, c, p.n, library, bias,
                  std::is_same_v<T, float> ? weight : nullptr);
    if constexpr (!std::is_same_v<T, float>) store_from_float(c, out, mn);
  };
  if (batches > 1 && gemm_choice(p.m, p.n, p.k) == GemmLibrary::this_thread) {
    // Many small products: one per core, each single-threaded, at least kMinSplitWork each.
    const std::int64_t per_part = items_per_part(p.m * p.n * p.k);
    parallel_for(batches, per_part, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) one(i, GemmLibrary::this_thread);
    });
  } else {
    for (std::int64_t i = 0; i < batches; ++i) one(i, GemmLibrary::automatic);
  }
}

// `rows` rows of `cols` elements of T, `ld` apart, as dense float32 rows for the products: the
// data itself for dense float rows, else a (converted) copy in scratch `slot`. Rows further
// apart are copied rather than read in place: rows kilobytes apart (the heads of a fused qkv
// projection) thrashed the cache and made attention 25 % slower than a copy first. Sets
// `ld_out` to the result's row distance.
template <class T>
const float* rows_as_float(const T* data, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           int slot, std::int64_t& ld_out) {
  ld_out = cols;
  if constexpr (std::is_same_v<T, float>) {
    if (rows <= 1 || ld == cols) return data;
  }
  float* out = thread_scratch(slot, rows * cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      std::copy(data + r * ld, data + r * ld + cols, out + r * cols);
    } else {
      widen_block(data + r * ld, out + r * cols, cols);
    }
  }
  return out;
}

// `rows` bfloat16 rows of `cols` values, `ld` apart, as rows oneDNN can read: in place (ld_out
// = ld, or cols for a single row), or copied dense into `copy` where rows overlap.
const bfloat16* bfloat16_rows(const bfloat16* data, std::int64_t rows, std::int64_t cols,
                              std::int64_t ld, std::vector<bfloat16>& copy,
                              std::int64_t& ld_out) {
  if (rows <= 1 || ld >= cols) {
    ld_out = rows <= 1 ? cols : ld;
    return data;
  }
  copy.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy(data + r * ld, data + r * ld + cols, copy.data() + r * cols);
  }
  ld_out = cols;
  return copy.data();
}

// Attention by blocks of query rows: each block's scores [rows, keys] stay in the core's cache
// between the two products and the softmax (a full [queries, keys] matrix does not, at a few
// thousand tokens), and (batch, head, block) items spread evenly over the kernel threads. With
// a causal mask a block's keys stop after its last row: the keys past it would have weight 0.
// The softmax's division by each row's sum comes after the second product, on the row's dv
// outputs instead of its keys' weights. A query row with no key left (every score -inf, all
// masked out) attends to nothing: zeros, as torch's attention gives. q, k, v and out are found
// through their (batch, head, row) strides: a slice of a key/value cache is read where it is.
//
// bfloat16 on a CPU with bfloat16 instructions (bfloat16_gemm_native): both products there, q,
// k and v read in place; the scores come out in float32, the softmax's numerators (each in
// (0, 1], the row's largest 1) are rounded to bfloat16 for the second product, as PyTorch's
// CPU attention does, and its float32 sums are divided by the float32 row sum and rounded once.
// Elsewhere the operands are converted to float32 and multiplied there.
template <class T>
void attention_kernel(const std::byte* raw) {
  const auto& p = params_as<AttentionParams>(raw);
  using E = Elem<T>;
  // 128 rows where their scores fit in 512 KiB (1024 keys; 3-6 % faster than 64 rows at the DiT
  // bench's L size, fewer library calls), fewer for longer rows, at least 16.
  const std::int64_t kBlockRows =
      std::clamp<std::int64_t>((std::int64_t{1} << 17) / std::max<std::int64_t>(p.sk, 1), 16, 128);
  const std::int64_t blocks = (p.sq + kBlockRows - 1) / kBlockRows;
  const std::int64_t kv_heads = p.kv_heads > 0 ? p.kv_heads : p.heads;
  // Native where a block's products are worth a library call (from ~32k multiply-adds, as for
  // other products): tiny heads (a handful of tokens) convert and stay on the calling thread.
  bool native = false;
  if constexpr (std::is_same_v<T, bfloat16>) {
    native = bfloat16_gemm_native() && p.d > 0 && p.dv > 0 &&
             std::min(p.sq, kBlockRows) * p.sk * std::max(p.d, p.dv) >= (std::int64_t{1} << 15);
  }
  const std::int64_t per_part = items_per_part(
      std::min(kBlockRows, p.sq) * (p.causal ? std::min(p.sk, kBlockRows) : p.sk) * (p.d + p.dv));
  parallel_for(p.batch * p.heads * blocks, per_part, [&](std::int64_t begin, std::int64_t end) {
    std::int64_t loaded_kv = -1;  // the key/value head whose rows k and v point at
    const float* k = nullptr;
    const float* v = nullptr;
    const T* k_in = nullptr;  // native: the bfloat16 rows themselves
    const T* v_in = nullptr;
    std::int64_t ldk = 0, ldv = 0;
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t bh = item / blocks, r0 = item % blocks * kBlockRows;
      const std::int64_t rows = std::min(kBlockRows, p.sq - r0);
      const std::int64_t b = bh / p.heads, h = bh % p.heads;
      const std::int64_t kv = attention_kv_index(p, bh);
      const T* q_in = static_cast<const T*>(p.q) + b * p.q_strides[0] + h * p.q_strides[1] +
                      r0 * p.q_strides[2];
      if (kv != loaded_kv) {
        const std::int64_t kh = kv % kv_heads;
        k_in = static_cast<const T*>(p.k) + b * p.k_strides[0] + kh * p.k_strides[1];
        v_in = static_cast<const T*>(p.v) + b * p.v_strides[0] + kh * p.v_strides[1];
        if (!native) {
          k = rows_as_float(k_in, p.sk, p.d, p.k_strides[2], 1, ldk);
          v = rows_as_float(v_in, p.sk, p.dv, p.v_strides[2], 4, ldv);
        }
        loaded_kv = kv;
      }
      const std::int64_t cols = p.causal ? std::min(p.sk, r0 + rows) : p.sk;
      float* s = thread_scratch(2, rows * cols);
      float* inverse = thread_scratch(5, rows);
      if constexpr (std::is_same_v<T, bfloat16>) {
        if (native) {
          thread_local std::vector<bfloat16> q_copy, k_copy;
          std::int64_t ldq = 0, ldk_in = 0;
          const bfloat16* qr = bfloat16_rows(q_in, rows, p.d, p.q_strides[2], q_copy, ldq);
          const bfloat16* kr = bfloat16_rows(k_in, cols, p.d, p.k_strides[2], k_copy, ldk_in);
          (void)bfloat16_gemm(false, true, rows, cols, p.d, p.scale, qr, ldq, kr, ldk_in, s, cols,
                              GemmLibrary::onednn);
        }
      }
      if (!native) {
        std::int64_t ldq = 0;
        const float* q = rows_as_float(q_in, rows, p.d, p.q_strides[2], 0, ldq);
        sgemm_strided(false, true, rows, cols, p.d, p.scale, q, ldq, k, ldk, 0.0f, s, cols,
                      GemmLibrary::this_thread);
      }
      const T* mask = p.mask == nullptr
                          ? nullptr
                          : static_cast<const T*>(p.mask) + b * p.mask_batch_stride +
                                h * p.mask_head_stride;
      for (std::int64_t i = 0; i < rows; ++i) {
        const std::int64_t r = r0 + i;
        float* row = s + i * cols;
        if (mask != nullptr) {
          for (std::int64_t c = 0; c < cols; ++c) {
            row[c] += float(E::load(mask, r * p.mask_row_stride + c));
          }
        }
        if (p.causal) {
          for (std::int64_t c = r + 1; c < cols; ++c) {
            row[c] = -std::numeric_limits<float>::infinity();
          }
        }
        // The rows' divisors are applied to the product below (rows x dv values, not
        // rows x keys). A row whose every key is masked out (all -inf) gives zeros, as
        // torch's attention does, not the NaNs of 0 / 0.
        float top = 0.0f;
        const float sum = softmax_numerators(row, row, cols, &top);
        if (top == -std::numeric_limits<float>::infinity()) {
          std::fill(row, row + cols, 0.0f);
          inverse[i] = 0.0f;
        } else {
          inverse[i] = 1.0f / sum;
        }
      }
      T* out = static_cast<T*>(p.out) + b * p.out_strides[0] + h * p.out_strides[1] +
               r0 * p.out_strides[2];
      if constexpr (std::is_same_v<T, float>) {
        const std::int64_t ldo = rows <= 1 ? p.dv : p.out_strides[2];
        sgemm_strided(false, false, rows, p.dv, cols, 1.0f, s, cols, v, ldv, 0.0f, out, ldo,
                      GemmLibrary::this_thread);
        for (std::int64_t i = 0; i < rows; ++i) {
          for (std::int64_t c = 0; c < p.dv; ++c) out[i * ldo + c] *= inverse[i];
        }
      } else {
        float* o = thread_scratch(3, rows * p.dv);
        if constexpr (std::is_same_v<T, bfloat16>) {
          if (native) {
            thread_local std::vector<bfloat16> weights, v_copy;
            weights.resize(static_cast<std::size_t>(rows * cols));
            narrow_block(s, weights.data(), rows * cols);
            std::int64_t ldv_in = 0;
            const bfloat16* vr = bfloat16_rows(v_in, cols, p.dv, p.v_strides[2], v_copy, ldv_in);
            (void)bfloat16_gemm(false, false, rows, p.dv, cols, 1.0f, weights.data(), cols, vr,
                                ldv_in, o, p.dv, GemmLibrary::onednn);
          }
        }
        if (!native) {
          sgemm_strided(false, false, rows, p.dv, cols, 1.0f, s, cols, v, ldv, 0.0f, o, p.dv,
                        GemmLibrary::this_thread);
        }
        for (std::int64_t i = 0; i < rows; ++i) {
          for (std::int64_t c = 0; c < p.dv; ++c) {
            E::store(out, i * p.out_strides[2] + c, o[i * p.dv + c] * inverse[i]);
          }
        }
      }
    }
  });
}

template <class T>
struct MatmulK {
  static void run(const std::byte* p) { matmul_kernel<T>(p); }
};
template <class T>
struct AttentionK {
  static void run(const std::byte* p) { attention_kernel<T>(p); }
};

}  // namespace

KernelFn resolve(const MatmulParams& p) { return float_kernel<MatmulK>(p, "matmul"); }
KernelFn resolve(const AttentionParams& p) {
  return float_kernel<AttentionK>(p, "attention");
}

}  // namespace retrace::cpu
