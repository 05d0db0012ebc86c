// The CUDA device's GEMM planning (src/cuda/gemm_plan.hpp), checked without a GPU: each planned
// column-major cuBLAS call is emulated here and the result compared with a row-major batched
// product computed directly, over random shapes, transposes and broadcast batch strides.
#include "cuda/gemm_plan.hpp"
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace retrace::cuda {
namespace {

// What cublasGemmStridedBatchedEx computes for one call (column-major, alpha = 1, beta = 0).
void emulate(const GemmCall& g, const std::vector<double>& a, const std::vector<double>& b,
             std::vector<double>& c) {
  for (std::int64_t batch = 0; batch < g.batch; ++batch) {
    const double* first = b.data() + g.offset_first + batch * g.stride_first;
    const double* second = a.data() + g.offset_second + batch * g.stride_second;
    double* out = c.data() + g.offset_out + batch * g.stride_out;
    for (std::int64_t r = 0; r < g.rows; ++r) {
      for (std::int64_t col = 0; col < g.cols; ++col) {
        double sum = 0.0;
        for (std::int64_t l = 0; l < g.depth; ++l) {
          const double f = g.trans_first ? first[l + r * g.ld_first] : first[r + l * g.ld_first];
          const double s =
              g.trans_second ? second[col + l * g.ld_second] : second[l + col * g.ld_second];
          sum += f * s;
        }
        out[r + col * g.ld_out] = sum;
      }
    }
  }
}

// The row-major batched product MatmulParams describes, computed directly.
std::vector<double> reference(const MatmulParams& p, const std::vector<double>& a,
                              const std::vector<double>& b) {
  std::int64_t batches = 1;
  for (int d = 0; d < p.batch_rank; ++d) batches *= p.batch_shape[d];
  std::vector<double> out(static_cast<std::size_t>(batches * p.m * p.n));
  for (std::int64_t batch = 0; batch < batches; ++batch) {
    std::int64_t rest = batch, off_a = 0, off_b = 0;
    for (int d = p.batch_rank - 1; d >= 0; --d) {
      const std::int64_t idx = rest % p.batch_shape[d];
      rest /= p.batch_shape[d];
      off_a += idx * p.a_batch_strides[d];
      off_b += idx * p.b_batch_strides[d];
    }
    for (std::int64_t i = 0; i < p.m; ++i) {
      for (std::int64_t j = 0; j < p.n; ++j) {
        double sum = 0.0;
        for (std::int64_t l = 0; l < p.k; ++l) {
          const double x = p.trans_a ? a[off_a + l * p.m + i] : a[off_a + i * p.k + l];
          const double y = p.trans_b ? b[off_b + j * p.k + l] : b[off_b + l * p.n + j];
          sum += x * y;
        }
        out[(batch * p.m + i) * p.n + j] = sum;
      }
    }
  }
  return out;
}

// Batch strides of an operand whose dimensions are each either its own (contiguous after the
// matrix) or broadcast (stride 0); returns the operand's element count.
std::int64_t operand_strides(const MatmulParams& p, std::int64_t matrix,
                             const std::vector<bool>& broadcast, std::int64_t* strides) {
  std::int64_t extent = matrix;
  for (int d = p.batch_rank - 1; d >= 0; --d) {
    if (broadcast[d]) {
      strides[d] = 0;
    } else {
      strides[d] = extent;
      extent *= p.batch_shape[d];
    }
  }
  return extent;
}

// An unbatched product's sizes (m up to max_m, n and k up to 5) and transposes, drawn by pick.
template <class Pick>
MatmulParams random_matrices(Pick& pick, int max_m) {
  MatmulParams p{};
  p.m = pick(1, max_m);
  p.n = pick(1, 5);
  p.k = pick(1, 5);
  p.trans_a = pick(0, 1) == 1;
  p.trans_b = pick(0, 1) == 1;
  return p;
}

// n small integers (exact in any order of summation).
template <class Pick>
std::vector<double> random_values(Pick& pick, std::int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = pick(-9, 9);
  return v;
}

TEST(GemmPlanTest, PlannedCallsComputeTheRowMajorBatchedProduct) {
  std::mt19937_64 rng(testing::test_seed() + 77);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 300; ++round) {
    MatmulParams p = random_matrices(pick, 5);
    p.batch_rank = pick(0, 3);
    std::vector<bool> a_broadcast, b_broadcast;
    for (int d = 0; d < p.batch_rank; ++d) {
      p.batch_shape[d] = pick(1, 3);
      a_broadcast.push_back(pick(0, 3) == 0);
      b_broadcast.push_back(pick(0, 3) == 0);
    }
    const std::int64_t a_size = operand_strides(p, p.m * p.k, a_broadcast, p.a_batch_strides);
    const std::int64_t b_size = operand_strides(p, p.k * p.n, b_broadcast, p.b_batch_strides);
    const std::vector<double> a = random_values(pick, a_size), b = random_values(pick, b_size);

    const std::vector<double> want = reference(p, a, b);
    std::vector<double> got(want.size(), std::nan(""));
    for (const GemmCall& call : plan_matmul(p)) emulate(call, a, b, got);
    ASSERT_EQ(got, want) << "round " << round << ": m " << p.m << " n " << p.n << " k " << p.k
                         << " trans " << p.trans_a << p.trans_b << " batch rank " << p.batch_rank;
  }
}

TEST(GemmPlanTest, RowChunksOfAnUnbatchedProductComputeItsRows) {
  std::mt19937_64 rng(testing::test_seed() + 79);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 200; ++round) {
    const MatmulParams p = random_matrices(pick, 9);
    const std::vector<double> a = random_values(pick, p.m * p.k),
                              b = random_values(pick, p.k * p.n);
    const std::vector<double> want = reference(p, a, b);
    const std::int64_t chunk = pick(1, static_cast<int>(p.m));
    std::vector<double> got(want.size(), std::nan(""));
    for (std::int64_t r0 = 0; r0 < p.m; r0 += chunk) {
      const std::int64_t rows = std::min(chunk, p.m - r0);
      std::vector<double> scratch(static_cast<std::size_t>(rows * p.n), std::nan(""));
      emulate(plan_matmul_rows(p, r0, rows), a, b, scratch);
      std::copy(scratch.begin(), scratch.end(), got.begin() + r0 * p.n);
    }
    ASSERT_EQ(got, want) << "round " << round << ": m " << p.m << " n " << p.n << " k " << p.k
                         << " trans " << p.trans_a << p.trans_b << " chunk " << chunk;
  }
}

TEST(GemmPlanTest, ContiguousAndBroadcastBatchesMergeIntoOneCall) {
  MatmulParams p{};
  p.m = 4;
  p.n = 3;
  p.k = 2;
  p.batch_rank = 3;
  const std::int64_t shape[] = {2, 3, 5};
  for (int d = 0; d < 3; ++d) p.batch_shape[d] = shape[d];
  // a contiguous over [2, 3, 5], b broadcast over all batch dimensions (a weight).
  p.a_batch_strides[2] = 8;
  p.a_batch_strides[1] = 40;
  p.a_batch_strides[0] = 120;
  const std::vector<GemmCall> calls = plan_matmul(p);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].batch, 30);
  EXPECT_EQ(calls[0].stride_second, 8);  // a
  EXPECT_EQ(calls[0].stride_first, 0);   // b
  EXPECT_EQ(calls[0].stride_out, 12);
  // Broadcasting a along the middle dimension only: [2] x [3 (broadcast), 5] -> two levels.
  p.a_batch_strides[1] = 0;
  p.a_batch_strides[0] = 40;
  p.b_batch_strides[0] = p.b_batch_strides[1] = p.b_batch_strides[2] = 6;
  p.b_batch_strides[1] = 30;
  p.b_batch_strides[0] = 90;
  p.b_batch_strides[2] = 6;
  EXPECT_GT(plan_matmul(p).size(), 1u);
}

TEST(GemmPlanTest, NothingToMultiplyPlansNoCall) {
  MatmulParams p{};
  p.m = 3;
  p.n = 2;
  p.k = 0;
  EXPECT_TRUE(plan_matmul(p).empty());
  p.k = 2;
  p.batch_rank = 1;
  p.batch_shape[0] = 0;
  EXPECT_TRUE(plan_matmul(p).empty());
}

TEST(GemmPlanTest, AttentionChunksComputeSoftmaxQKTimesV) {
  std::mt19937_64 rng(testing::test_seed() + 78);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 100; ++round) {
    AttentionParams p{};
    p.batch = pick(1, 2);
    p.heads = pick(1, 4);
    // Every other round grouped-query: key/value heads a divisor of the query heads.
    p.kv_heads = p.heads;
    if (round % 2 == 1) {
      do p.kv_heads = pick(1, static_cast<int>(p.heads));
      while (p.heads % p.kv_heads != 0);
    }
    const std::int64_t kv_total = p.batch * p.kv_heads;
    p.sq = pick(1, 4);
    p.sk = pick(1, 4);
    p.d = pick(1, 4);
    p.dv = pick(1, 4);
    const std::int64_t bh_total = p.batch * p.heads;
    auto fill = [&](std::int64_t n) {
      std::vector<double> v(static_cast<std::size_t>(n));
      for (double& x : v) x = pick(-4, 4) / 4.0;
      return v;
    };
    const auto q = fill(bh_total * p.sq * p.d), k = fill(kv_total * p.sk * p.d),
               v = fill(kv_total * p.sk * p.dv);
    std::vector<double> want(static_cast<std::size_t>(bh_total * p.sq * p.dv));
    for (std::int64_t bh = 0; bh < bh_total; ++bh) {
      const std::int64_t kv = (bh / p.heads) * p.kv_heads + (bh % p.heads) / (p.heads / p.kv_heads);
      for (std::int64_t r = 0; r < p.sq; ++r) {
        std::vector<double> w(static_cast<std::size_t>(p.sk));
        double total = 0.0;
        for (std::int64_t c = 0; c < p.sk; ++c) {
          double dot = 0.0;
          for (std::int64_t l = 0; l < p.d; ++l) {
            dot += q[(bh * p.sq + r) * p.d + l] * k[(kv * p.sk + c) * p.d + l];
          }
          total += (w[c] = std::exp(dot));
        }
        for (std::int64_t j = 0; j < p.dv; ++j) {
          double acc = 0.0;
          for (std::int64_t c = 0; c < p.sk; ++c)
            acc += w[c] / total * v[(kv * p.sk + c) * p.dv + j];
          want[(bh * p.sq + r) * p.dv + j] = acc;
        }
      }
    }
    const std::int64_t chunk = pick(1, static_cast<int>(bh_total));
    std::vector<double> got(want.size(), std::nan(""));
    for (std::int64_t bh0 = 0, bhs = 0; bh0 < bh_total; bh0 += bhs) {
      bhs = attention_chunk_size(p, bh0, chunk);
      ASSERT_GE(bhs, 1);
      const AttentionCalls calls = plan_attention(p, bh0, bhs);
      std::vector<double> scores(static_cast<std::size_t>(bhs * p.sq * p.sk), std::nan(""));
      emulate(calls.scores, q, k, scores);
      for (std::int64_t row = 0; row < bhs * p.sq; ++row) {  // softmax in place: the probs
        double total = 0.0;
        for (std::int64_t c = 0; c < p.sk; ++c)
          total += (scores[row * p.sk + c] = std::exp(scores[row * p.sk + c]));
        for (std::int64_t c = 0; c < p.sk; ++c) scores[row * p.sk + c] /= total;
      }
      emulate(calls.output, scores, v, got);
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-12) << "round " << round << " element " << i;
    }
  }
}

}  // namespace
}  // namespace retrace::cuda
