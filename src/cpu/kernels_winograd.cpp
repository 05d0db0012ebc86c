// The Winograd 3x3 convolution kernel: F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015) built by Toom-Cook on the points 0, 1, -1, 1/2, -2 and
// infinity rather than their 0, +-1, +-2: the points Barabasz et al. ("Error analysis and
// improving the accuracy of Winograd convolution for deep neural networks", 2020) found most
// accurate, about 3x smaller float32 errors than +-2 in a simulation of 256-channel products.
// For each chunk of 4x4 output tiles:
//  1. the weights, once per call: U[p, o, c] = (G g[o, c] G^T)[p], p = 6 i + j of the 6x6 block;
//  2. the input: V[p, c, t] = (B^T d[c, t] B)[p] for each input channel and tile t (its 6x6
//     input block, zeros outside the image);
//  3. 36 products M[p] = U[p] V[p] ([o, c] x [c, tiles]), one per point, each on one thread with
//     the single-threaded GEMM, so the sums over c run in the same order whatever the threads;
//  4. the output: out[o, 4x4 tile] = A^T M[., o, t] A + bias.
// Steps 2 and 4 work on whole rows of tiles in vector lanes (the tiles of a row are contiguous in
// V and M). Each output element comes from the same arithmetic whatever the kernel threads, so
// eager and replayed runs give the same bits.
//
// The transforms add and subtract neighbouring values, so one infinity in a 6x6 block makes NaNs
// across the 4x4 outputs it reaches (and values near float32's limit can overflow): when any
// output is not finite the whole call is computed again directly, which puts NaN and infinity
// where a direct convolution does.
#include "cpu/gemm.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace retrace::cpu {

namespace {

// B^T d for n columns of six values d0..d5 (element q of each at q * stride) into the rows
// r[0..5]; applied again along rows, d B.
void input_transform(const float* d0, const float* d1, const float* d2, const float* d3,
                     const float* d4, const float* d5, float* const (&r)[6], std::int64_t n,
                     std::int64_t stride) {
  for (std::int64_t q = 0; q < n; ++q) {
    const float a0 = d0[q * stride], a1 = d1[q * stride], a2 = d2[q * stride];
    const float a3 = d3[q * stride], a4 = d4[q * stride], a5 = d5[q * stride];
    r[0][q] = (a0 - 2.0f * a2) + 1.5f * (a3 - a1) + a4;
    r[1][q] = (0.5f * a2 - a1) + 2.5f * a3 + a4;
    r[2][q] = (a1 + 0.5f * a3) - 2.5f * a2 + a4;
    r[3][q] = 2.0f * (a3 - a1) + (a4 - a2);
    r[4][q] = 0.5f * (a1 - a3) + (a4 - a2);
    r[5][q] = (a1 - 2.0f * a3) + 1.5f * (a4 - a2) + a5;
  }
}

// G w for three values w0..w2 (a column of a 3x3 filter, or a row of G g): G's rows are w0;
// (w0 + w1 + w2) / 3; (w1 - w0 - w2) / 3; -(16 w0 + 8 w1 + 4 w2) / 15; (w0 - 2 w1 + 4 w2) / 15;
// w2.
struct Six {
  float v[6];
};
inline Six weight_transform(float w0, float w1, float w2) {
  return {{w0, (w0 + w1 + w2) * (1.0f / 3.0f), (w1 - w0 - w2) * (1.0f / 3.0f),
           (16.0f * w0 + 8.0f * w1 + 4.0f * w2) * (-1.0f / 15.0f),
           (w0 - 2.0f * w1 + 4.0f * w2) * (1.0f / 15.0f), w2}};
}

// A^T m for six values m0..m5 (a column of a tile's products, or a row of A^T m).
struct Four {
  float v[4];
};
inline Four output_transform(float m0, float m1, float m2, float m3, float m4, float m5) {
  const float s12 = m1 + m2, d12 = m1 - m2;
  return {{(m0 + s12) + (m3 + m4), d12 + (0.5f * m3 - 2.0f * m4), s12 + (0.25f * m3 + 4.0f * m4),
           d12 + (0.125f * m3 - 8.0f * m4) + m5}};
}

// Step 1 for output channels [o0, o1): U[p, o, c].
void transform_weights(const float* weight, float* u, std::int64_t o0, std::int64_t o1,
                       std::int64_t o, std::int64_t c) {
  constexpr std::int64_t kLanes = 16;
  for (std::int64_t oi = o0; oi < o1; ++oi) {
    for (std::int64_t c0 = 0; c0 < c; c0 += kLanes) {
      const std::int64_t lanes = std::min(kLanes, c - c0);
      float g[9][kLanes] = {};
      for (std::int64_t l = 0; l < lanes; ++l) {
        const float* src = weight + (oi * c + c0 + l) * 9;
        for (int e = 0; e < 9; ++e) g[e][l] = src[e];
      }
      // G g: 6 rows of 3, then (G g) G^T the same on columns.
      float t[6][3][kLanes];
      for (int col = 0; col < 3; ++col) {
        for (std::int64_t l = 0; l < kLanes; ++l) {
          const Six r = weight_transform(g[col][l], g[3 + col][l], g[6 + col][l]);
          for (int i = 0; i < 6; ++i) t[i][col][l] = r.v[i];
        }
      }
      for (int i = 0; i < 6; ++i) {
        float v[6][kLanes];
        for (std::int64_t l = 0; l < kLanes; ++l) {
          const Six r = weight_transform(t[i][0][l], t[i][1][l], t[i][2][l]);
          for (int j = 0; j < 6; ++j) v[j][l] = r.v[j];
        }
        for (int j = 0; j < 6; ++j) {
          float* dst = u + ((i * 6 + j) * o + oi) * c + c0;
          for (std::int64_t l = 0; l < lanes; ++l) dst[l] = v[j][l];
        }
      }
    }
  }
}

struct Geometry {
  std::int64_t n, c, h, w, o, ho, wo, ph, pw;
  std::int64_t th, tw;  // tile rows and columns per image
};

// Step 2 for input channel ci and global tile row g (image g / th) of a chunk starting at tile
// row g0: V[p, ci, (g - g0) * tw + q], row stride ld (the chunk's tiles).
void transform_input_row(const float* x, float* v, const Geometry& s, std::int64_t ci,
                         std::int64_t g, std::int64_t g0, std::int64_t ld) {
  const std::int64_t image = g / s.th, tr = g % s.th;
  const std::int64_t width = 4 * s.tw + 2;
  // Six input rows (buffer column u holds input column u - pw, zeros outside the image), then
  // the six rows of B^T d.
  float* work = thread_scratch(kWinogradScratchSlot, 12 * width);
  float* padded[6];
  float* r[6];
  for (int i = 0; i < 6; ++i) {
    padded[i] = work + i * width;
    r[i] = work + (6 + i) * width;
    const std::int64_t y = 4 * tr - s.ph + i;
    std::fill(padded[i], padded[i] + width, 0.0f);
    if (y < 0 || y >= s.h) continue;
    const float* src = x + ((image * s.c + ci) * s.h + y) * s.w;
    const std::int64_t first = std::max<std::int64_t>(0, s.pw);
    const std::int64_t last = std::min(width, s.w + s.pw);
    if (last > first) std::copy(src + (first - s.pw), src + (last - s.pw), padded[i] + first);
  }
  input_transform(padded[0], padded[1], padded[2], padded[3], padded[4], padded[5], r, width, 1);
  // Then along the rows: V[6k + l, ci, t0 + q] = (r_k's columns 4q .. 4q + 5 times B)[l].
  const std::int64_t t0 = (g - g0) * s.tw;
  for (int k = 0; k < 6; ++k) {
    float* dst[6];
    for (int l = 0; l < 6; ++l) dst[l] = v + ((6 * k + l) * s.c + ci) * ld + t0;
    input_transform(r[k], r[k] + 1, r[k] + 2, r[k] + 3, r[k] + 4, r[k] + 5, dst, s.tw, 4);
  }
}

// Step 4 for output channel oi and global tile row g; returns false when an output is not finite.
bool transform_output_row(const float* m, const float* bias, float* out, const Geometry& s,
                          std::int64_t oi, std::int64_t g, std::int64_t g0, std::int64_t ld) {
  const std::int64_t image = g / s.th, tr = g % s.th;
  const std::int64_t tw = s.tw;
  float* work = thread_scratch(kWinogradScratchSlot, 24 * tw + 4 * 4 * tw);
  float* p = work;            // P[a][j][q]: (A^T m)[a][j], 24 rows of tw
  float* y = work + 24 * tw;  // output rows [a][4 tw]
  const std::int64_t t0 = (g - g0) * tw;
  auto mrow = [&](int i, int j) { return m + ((6 * i + j) * s.o + oi) * ld + t0; };
  for (int j = 0; j < 6; ++j) {
    const float *m0 = mrow(0, j), *m1 = mrow(1, j), *m2 = mrow(2, j), *m3 = mrow(3, j),
                *m4 = mrow(4, j), *m5 = mrow(5, j);
    float* p0 = p + (0 * 6 + j) * tw;
    float* p1 = p + (1 * 6 + j) * tw;
    float* p2 = p + (2 * 6 + j) * tw;
    float* p3 = p + (3 * 6 + j) * tw;
    for (std::int64_t q = 0; q < tw; ++q) {
      const Four r = output_transform(m0[q], m1[q], m2[q], m3[q], m4[q], m5[q]);
      p0[q] = r.v[0];
      p1[q] = r.v[1];
      p2[q] = r.v[2];
      p3[q] = r.v[3];
    }
  }
  const float b = bias == nullptr ? 0.0f : bias[oi];
  float check = 0.0f;
  for (int a = 0; a < 4; ++a) {
    const float* q0 = p + (a * 6 + 0) * tw;
    const float* q1 = p + (a * 6 + 1) * tw;
    const float* q2 = p + (a * 6 + 2) * tw;
    const float* q3 = p + (a * 6 + 3) * tw;
    const float* q4 = p + (a * 6 + 4) * tw;
    const float* q5 = p + (a * 6 + 5) * tw;
    float* row = y + a * 4 * tw;
    for (std::int64_t q = 0; q < tw; ++q) {
      const Four r = output_transform(q0[q], q1[q], q2[q], q3[q], q4[q], q5[q]);
      for (int e = 0; e < 4; ++e) row[4 * q + e] = r.v[e] + b;
    }
    const std::int64_t out_y = 4 * tr + a;
    if (out_y >= s.ho) continue;
    float* dst = out + ((image * s.o + oi) * s.ho + out_y) * s.wo;
    for (std::int64_t xo = 0; xo < s.wo; ++xo) {
      dst[xo] = row[xo];
      check += row[xo] * 0.0f;  // NaN once any output is NaN or infinite
    }
  }
  return check == 0.0f;
}

// The direct convolution (for outputs that are not all finite): out = sum over c, then the
// 3x3 taps, of weight * x, + bias.
void direct(const WinogradParams& prm, const Geometry& s) {
  const auto* x = static_cast<const float*>(prm.x);
  const auto* weight = static_cast<const float*>(prm.weight);
  const auto* bias = static_cast<const float*>(prm.bias);
  auto* out = static_cast<float*>(prm.out);
  parallel_for(s.n * s.o, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t image = item / s.o, oi = item % s.o;
      float* plane = out + item * s.ho * s.wo;
      std::fill(plane, plane + s.ho * s.wo, 0.0f);
      for (std::int64_t ci = 0; ci < s.c; ++ci) {
        const float* src = x + (image * s.c + ci) * s.h * s.w;
        const float* k = weight + (oi * s.c + ci) * 9;
        for (std::int64_t i = 0; i < s.ho; ++i) {
          float* dst = plane + i * s.wo;
          for (int a = 0; a < 3; ++a) {
            const std::int64_t yy = i + a - s.ph;
            if (yy < 0 || yy >= s.h) continue;
            const float* line = src + yy * s.w;
            for (int bb = 0; bb < 3; ++bb) {
              const float kv = k[a * 3 + bb];
              const std::int64_t j0 = std::max<std::int64_t>(0, s.pw - bb);
              const std::int64_t j1 = std::min(s.wo, s.w + s.pw - bb);
              for (std::int64_t j = j0; j < j1; ++j) dst[j] += kv * line[j + bb - s.pw];
            }
          }
        }
      }
      if (bias != nullptr) {
        for (std::int64_t e = 0; e < s.ho * s.wo; ++e) plane[e] += bias[oi];
      }
    }
  });
}

void winograd_kernel(const std::byte* raw) {
  const auto& prm = params_as<WinogradParams>(raw);
  Geometry s{prm.n, prm.c, prm.h, prm.w, prm.o, prm.ho, prm.wo, prm.pad_h, prm.pad_w, 0, 0};
  s.th = (s.ho + 3) / 4;
  s.tw = (s.wo + 3) / 4;
  if (s.n == 0 || s.o == 0 || s.ho == 0 || s.wo == 0) return;
  const auto* x = static_cast<const float*>(prm.x);
  const auto* bias = static_cast<const float*>(prm.bias);
  auto* out = static_cast<float*>(prm.out);
  float* u = static_cast<float*>(prm.scratch);
  const std::int64_t rows_per_chunk_max = std::max<std::int64_t>(1, prm.chunk_tiles / s.tw);
  const std::int64_t tile_rows = s.n * s.th;
  // Equal chunks (no short last one that multiplies a handful of tiles).
  const std::int64_t chunks = (tile_rows + rows_per_chunk_max - 1) / rows_per_chunk_max;
  const std::int64_t rows_per_chunk = (tile_rows + chunks - 1) / chunks;
  float* v = u + kWinogradPoints * s.o * s.c;
  float* m = v + kWinogradPoints * s.c * rows_per_chunk * s.tw;

  parallel_for(s.o, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(s.c, 1)),
               [&](std::int64_t o0, std::int64_t o1) {
                 transform_weights(static_cast<const float*>(prm.weight), u, o0, o1, s.o, s.c);
               });
  std::atomic<bool> finite{true};
  for (std::int64_t g0 = 0; g0 < tile_rows; g0 += rows_per_chunk) {
    const std::int64_t g1 = std::min(tile_rows, g0 + rows_per_chunk);
    const std::int64_t ld = (g1 - g0) * s.tw;
    const std::int64_t items = s.c * (g1 - g0);
    parallel_for(items, 4, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t item = begin; item < end; ++item) {
        transform_input_row(x, v, s, item / (g1 - g0), g0 + item % (g1 - g0), g0, ld);
      }
    });
    parallel_for(kWinogradPoints, 1, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        sgemm_strided(false, false, s.o, ld, s.c, 1.0f, u + p * s.o * s.c, s.c, v + p * s.c * ld,
                      ld, 0.0f, m + p * s.o * ld, ld, GemmLibrary::this_thread);
      }
    });
    const std::int64_t out_items = s.o * (g1 - g0);
    parallel_for(out_items, 4, [&](std::int64_t begin, std::int64_t end) {
      bool ok = true;
      for (std::int64_t item = begin; item < end; ++item) {
        ok &=
            transform_output_row(m, bias, out, s, item / (g1 - g0), g0 + item % (g1 - g0), g0, ld);
      }
      if (!ok) finite.store(false, std::memory_order_relaxed);
    });
  }
  if (!finite.load(std::memory_order_relaxed)) direct(prm, s);
}

}  // namespace

KernelFn resolve(const WinogradParams& p) {
  RETRACE_CHECK(p.dtype == DType::float32, unimplemented,
                "the CPU device's Winograd convolution takes float32, not {}", p.dtype);
  RETRACE_CHECK(p.chunk_tiles >= (p.wo + 3) / 4 && p.ho == p.h + 2 * p.pad_h - 2 &&
                    p.wo == p.w + 2 * p.pad_w - 2,
                invalid_argument, "winograd: inconsistent sizes");
  return &winograd_kernel;
}

}  // namespace retrace::cpu
