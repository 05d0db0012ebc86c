// How a row-major, batched MatmulParams becomes column-major strided-batched GEMM calls (what
// cuBLAS takes). Plain host code without CUDA, so the planning is unit-tested on any machine
// (tests/test_gemm_plan.cpp emulates the calls).
//
// Row-major C[m,n] = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T:
// the first cuBLAS operand is B, the second A, no operand is copied or transposed in memory.
#pragma once

#include "retrace/kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace retrace::cuda {

// One column-major call: out[r + c*ld_out] = alpha * sum_l first'(r, l) * second'(l, c)
// (+ beta * out), where first' is the first operand (ld_first) transposed if trans_first,
// likewise second'. Offsets and strides are in elements.
struct GemmCall {
  bool trans_first = false, trans_second = false;
  std::int64_t rows = 0, cols = 0, depth = 0;  // cuBLAS m, n, k
  std::int64_t ld_first = 0, ld_second = 0, ld_out = 0;
  std::int64_t offset_first = 0, offset_second = 0, offset_out = 0;
  std::int64_t stride_first = 0, stride_second = 0, stride_out = 0;
  std::int64_t batch = 1;
};

// The shape part of the call for one (unbatched) row-major product.
inline GemmCall column_major_call(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                  std::int64_t k) {
  GemmCall call;
  call.trans_first = trans_b;
  call.trans_second = trans_a;
  call.rows = n;
  call.cols = m;
  call.depth = k;
  call.ld_first = trans_b ? k : n;
  call.ld_second = trans_a ? m : k;
  call.ld_out = n;
  return call;
}

// Batch dimensions with their operand strides, size-1 dimensions dropped and neighbours merged
// where both operands' strides allow it (the output is contiguous over all of them).
struct BatchPlan {
  std::int64_t shape[kMaxBatchRank] = {};
  std::int64_t a[kMaxBatchRank] = {};
  std::int64_t b[kMaxBatchRank] = {};
  int rank = 0;
};

inline BatchPlan plan_batches(const MatmulParams& p) {
  BatchPlan plan;
  for (int d = 0; d < p.batch_rank; ++d) {
    if (p.batch_shape[d] == 1) continue;
    if (plan.rank > 0) {
      const int last = plan.rank - 1;
      const std::int64_t inner = p.batch_shape[d];
      if (plan.a[last] == p.a_batch_strides[d] * inner &&
          plan.b[last] == p.b_batch_strides[d] * inner) {
        plan.shape[last] *= inner;
        plan.a[last] = p.a_batch_strides[d];
        plan.b[last] = p.b_batch_strides[d];
        continue;
      }
    }
    plan.shape[plan.rank] = p.batch_shape[d];
    plan.a[plan.rank] = p.a_batch_strides[d];
    plan.b[plan.rank] = p.b_batch_strides[d];
    ++plan.rank;
  }
  return plan;
}

// The calls of a batched product: the innermost merged batch dimension is one strided-batched
// call, outer ones become separate calls. Empty when there is nothing to multiply (a zero
// batch, m, n or k: the caller writes zeros or the bias).
inline std::vector<GemmCall> plan_matmul(const MatmulParams& p) {
  std::int64_t batches = 1;
  for (int d = 0; d < p.batch_rank; ++d) batches *= p.batch_shape[d];
  std::vector<GemmCall> calls;
  if (batches == 0 || p.m == 0 || p.n == 0 || p.k == 0) return calls;
  const BatchPlan plan = plan_batches(p);
  const int inner = plan.rank - 1;
  GemmCall call = column_major_call(p.trans_a, p.trans_b, p.m, p.n, p.k);
  call.batch = plan.rank > 0 ? plan.shape[inner] : 1;
  call.stride_first = plan.rank > 0 ? plan.b[inner] : 0;
  call.stride_second = plan.rank > 0 ? plan.a[inner] : 0;
  call.stride_out = p.m * p.n;
  const std::int64_t outer = batches / call.batch;
  calls.reserve(static_cast<std::size_t>(outer));
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t rest = o, off_a = 0, off_b = 0;
    for (int d = inner - 1; d >= 0; --d) {
      const std::int64_t idx = rest % plan.shape[d];
      rest /= plan.shape[d];
      off_a += idx * plan.a[d];
      off_b += idx * plan.b[d];
    }
    call.offset_first = off_b;
    call.offset_second = off_a;
    call.offset_out = o * call.batch * p.m * p.n;
    calls.push_back(call);
  }
  return calls;
}

// The rows [r0, r0 + rows) of an unbatched product (a linear's): its one planned call narrowed to
// those rows, writing them from offset 0 of its output (a float32 scratch of rows x n).
inline GemmCall plan_matmul_rows(const MatmulParams& p, std::int64_t r0, std::int64_t rows) {
  GemmCall call = column_major_call(p.trans_a, p.trans_b, p.m, p.n, p.k);
  call.cols = rows;  // the column-major product's columns are the row-major rows
  call.offset_second = p.trans_a ? r0 : r0 * p.k;
  return call;
}

// The two products of attention for the (batch, head) pairs [bh0, bh0 + bhs): scores =
// q k^T into a chunk-local [bhs, sq, sk] buffer (first operand k, second q), then out = probs v
// with probs chunk-local too (first operand v, second probs) into the full output.
struct AttentionCalls {
  GemmCall scores;
  GemmCall output;
};

// With grouped-query attention (kv_heads < heads) a chunk must stay within one group of query
// heads (see attention_chunk_size), whose key and value head is one matrix: batch stride 0.
inline AttentionCalls plan_attention(const AttentionParams& p, std::int64_t bh0, std::int64_t bhs) {
  AttentionCalls calls;
  const bool grouped = p.kv_heads > 0 && p.kv_heads != p.heads;
  const std::int64_t kv0 = attention_kv_index(p, bh0);
  GemmCall& s = calls.scores;
  s = column_major_call(false, true, p.sq, p.sk, p.d);
  s.offset_first = kv0 * p.sk * p.d;
  s.offset_second = bh0 * p.sq * p.d;
  s.stride_first = grouped ? 0 : p.sk * p.d;
  s.stride_second = p.sq * p.d;
  s.stride_out = p.sq * p.sk;
  s.batch = bhs;
  GemmCall& o = calls.output;
  o = column_major_call(false, false, p.sq, p.dv, p.sk);
  o.offset_first = kv0 * p.sk * p.dv;
  o.offset_out = bh0 * p.sq * p.dv;
  o.stride_first = grouped ? 0 : p.sk * p.dv;
  o.stride_second = p.sq * p.sk;
  o.stride_out = p.sq * p.dv;
  o.batch = bhs;
  return calls;
}

// The (batch, head) pairs of the chunk starting at bh0: at most `chunk`, not past the end,
// and not past the end of bh0's group of query heads under grouped-query attention.
inline std::int64_t attention_chunk_size(const AttentionParams& p, std::int64_t bh0,
                                         std::int64_t chunk) {
  std::int64_t end = p.batch * p.heads;
  if (p.kv_heads > 0 && p.kv_heads != p.heads) {
    const std::int64_t group = p.heads / p.kv_heads;
    end = std::min(end, (bh0 / group + 1) * group);
  }
  return std::min(chunk, end - bh0);
}

}  // namespace retrace::cuda
