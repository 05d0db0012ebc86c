// The op library against a float64 reference computed here, on random inputs (seed logged,
// RETRACE_TEST_SEED overrides it), and traced replay against eager execution bit for bit.
// Tolerances: float32 |got - want| <= 1e-5 + 1e-5 |want| (matmul-like ops scale with sqrt(K));
// bfloat16 (float32 arithmetic, inputs and output rounded) 2e-2 + 2e-2 |want|, float16 likewise
// with 4e-3 (a few of its 2^-11 roundings).
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <numeric>

namespace retrace {
namespace {

using testing::random_floats;

struct Ref {
  std::vector<std::int64_t> shape;
  std::vector<double> v;
  std::int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  }
};

Ref read(const Tensor& t) {
  Ref r{{t.shape().dims().begin(), t.shape().dims().end()}, {}};
  for (float x : t.to_vector<float>()) r.v.push_back(x);
  return r;
}

std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

// Index of a broadcast operand for output multi-index `idx`.
std::int64_t broadcast_index(const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& shape) {
  const auto strides = strides_of(shape);
  const std::size_t offset = idx.size() - shape.size();
  std::int64_t at = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    at += (shape[i] == 1 ? 0 : idx[offset + i]) * strides[i];
  }
  return at;
}

std::vector<std::int64_t> unravel(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return idx;
}

class OpsTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Device> device_ = testing::open_test_device({.guard_bytes = 64});
  void SetUp() override { RETRACE_SKIP_WITHOUT_DEVICE(); }
  Device& device() { return *device_; }
  DType dtype() const { return GetParam(); }
  bool bf16() const { return dtype() == DType::bfloat16; }
  double tolerance() const {
    switch (dtype()) {
      case DType::bfloat16: return 2e-2;
      case DType::float16: return 4e-3;
      default: return 1e-5;
    }
  }

  Tensor random(std::vector<std::int64_t> shape, std::uint64_t salt, float lo = -2.0f,
                float hi = 2.0f) {
    const Shape s{std::span<const std::int64_t>(shape)};
    return Tensor::from_vector<float>(random_floats(static_cast<std::size_t>(s.numel()), salt, lo, hi),
                                      s, dtype())
        .to_device(device());
  }

  void expect_close(const Tensor& got, const Ref& want, double scale = 1.0) {
    const Ref g = read(got);
    ASSERT_EQ(g.shape, want.shape);
    const double tol = tolerance() * scale;
    for (std::size_t i = 0; i < want.v.size(); ++i) {
      ASSERT_LE(std::abs(g.v[i] - want.v[i]), tol + tol * std::abs(want.v[i]))
          << "element " << i << " of " << want.v.size() << " (" << dtype_name(dtype()) << ")";
    }
  }

  // The op captured in a trace and replayed equals eager execution bit for bit, also after the
  // inputs change.
  void expect_replay_matches(const std::vector<Tensor>& inputs,
                             const std::function<Tensor(const std::vector<Tensor>&)>& op) {
    auto tracer = make_tracer(op, device());
    const Tensor& traced = tracer(inputs);
    EXPECT_EQ(traced.to_vector<float>(), op(inputs).to_vector<float>());
    std::vector<Tensor> fresh;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto n = static_cast<std::size_t>(inputs[i].numel());
      fresh.push_back(Tensor::from_vector<float>(random_floats(n, 777 + i, 0.1f, 2.0f),
                                                 inputs[i].shape(), inputs[i].dtype(),
                                                 inputs[i].layout()));
    }
    tracer(fresh);
    const auto replayed = traced.to_vector<float>();
    EXPECT_EQ(replayed, op(std::get<0>(tracer.inputs())).to_vector<float>());
  }
};

TEST_P(OpsTest, BinaryOpsBroadcast) {
  const std::vector<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> cases = {
      {{37}, {37}}, {{5, 7}, {7}}, {{4, 1, 6}, {3, 1}}, {{2, 3, 4, 5}, {1, 3, 1, 5}},
      {{1}, {3, 9}}, {{6, 1}, {1, 6}}};
  using Fn = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::tuple<const char*, Fn, std::function<double(double, double)>>> ops_list = {
      {"add", [](auto& a, auto& b) { return ops::add(a, b); }, std::plus<double>()},
      {"sub", [](auto& a, auto& b) { return ops::sub(a, b); }, std::minus<double>()},
      {"mul", [](auto& a, auto& b) { return ops::mul(a, b); }, std::multiplies<double>()},
      {"div", [](auto& a, auto& b) { return ops::div(a, b); }, std::divides<double>()},
      {"maximum", [](auto& a, auto& b) { return ops::maximum(a, b); },
       [](double x, double y) { return std::max(x, y); }},
      {"minimum", [](auto& a, auto& b) { return ops::minimum(a, b); },
       [](double x, double y) { return std::min(x, y); }}};
  std::uint64_t salt = 1;
  for (const auto& [sa, sb] : cases) {
    Tensor a = random(sa, salt++);
    Tensor b = random(sb, salt++, 0.5f, 2.0f);  // away from zero for div
    const Ref ra = read(a), rb = read(b);
    for (const auto& [name, op, ref] : ops_list) {
      Tensor out = op(a, b);
      Ref want{{out.shape().dims().begin(), out.shape().dims().end()}, {}};
      for (std::int64_t i = 0; i < want.numel(); ++i) {
        const auto idx = unravel(i, want.shape);
        want.v.push_back(ref(ra.v[broadcast_index(idx, ra.shape)], rb.v[broadcast_index(idx, rb.shape)]));
      }
      SCOPED_TRACE(name);
      expect_close(out, want);
    }
  }
  expect_replay_matches({random({4, 1, 6}, 50), random({3, 1}, 51)},
                        [](const std::vector<Tensor>& in) { return ops::mul(in[0], in[1]); });
}

TEST_P(OpsTest, ScalarOpsAndOutForms) {
  Tensor a = random({3, 17}, 60);
  const Ref ra = read(a);
  auto check = [&](const Tensor& t, auto f) {
    Ref want{ra.shape, {}};
    for (double x : ra.v) want.v.push_back(f(x));
    expect_close(t, want);
  };
  check(ops::sub(a, 0.5), [](double x) { return x - 0.5; });
  check(ops::div(a, 4.0), [](double x) { return x / 4.0; });
  check(ops::maximum(a, 0.0), [](double x) { return std::max(x, 0.0); });
  check(ops::minimum(a, 0.25), [](double x) { return std::min(x, 0.25); });
  Tensor out = ops::full({3, 17}, 0.0, device(), dtype());
  ops::sub(a, a, out);
  check(out, [](double) { return 0.0; });
  ops::exp(a, out);
  check(out, [](double x) { return std::exp(x); });
  Tensor in_place = a.clone();
  ops::mul(in_place, 2.0, in_place);
  check(in_place, [](double x) { return 2.0 * x; });
}

TEST_P(OpsTest, UnaryOps) {
  using Fn = Tensor (*)(const Tensor&, QueueId);
  const std::vector<std::tuple<const char*, Fn, std::function<double(double)>, bool>> list = {
      {"neg", ops::neg, [](double x) { return -x; }, false},
      {"abs", ops::abs, [](double x) { return std::abs(x); }, false},
      {"exp", ops::exp, [](double x) { return std::exp(x); }, false},
      {"log", ops::log, [](double x) { return std::log(x); }, true},
      {"sqrt", ops::sqrt, [](double x) { return std::sqrt(x); }, true},
      {"rsqrt", ops::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, true},
      {"tanh", ops::tanh, [](double x) { return std::tanh(x); }, false},
      {"sigmoid", ops::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, false},
      {"relu", ops::relu, [](double x) { return std::max(x, 0.0); }, false},
      {"silu", ops::silu, [](double x) { return x / (1.0 + std::exp(-x)); }, false},
      {"gelu", ops::gelu, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); },
       false},
      {"gelu_tanh", ops::gelu_tanh,
       [](double x) {
         return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
       },
       false},
      {"sin", ops::sin, [](double x) { return std::sin(x); }, false},
      {"cos", ops::cos, [](double x) { return std::cos(x); }, false},
      {"square", ops::square, [](double x) { return x * x; }, false},
      {"erf", ops::erf, [](double x) { return std::erf(x); }, false}};
  for (const auto& [name, op, ref, positive] : list) {
    Tensor a = positive ? random({2, 3, 41}, 70, 0.1f, 4.0f) : random({2, 3, 41}, 71);
    const Ref ra = read(a);
    Ref want{ra.shape, {}};
    for (double x : ra.v) want.v.push_back(ref(x));
    SCOPED_TRACE(name);
    expect_close(op(a, kDefaultQueue), want);
  }
  expect_replay_matches({random({5, 33}, 72)},
                        [](const std::vector<Tensor>& in) { return ops::gelu(in[0]); });
}

TEST_P(OpsTest, ReductionsSoftmaxAndNorms) {
  Tensor a = random({3, 5, 67}, 80);
  const Ref ra = read(a);
  const std::int64_t rows = 15, cols = 67;
  Ref sum{{3, 5}, {}}, mean{{3, 5, 1}, {}}, max{{3, 5}, {}}, soft{ra.shape, {}};
  Ref ln{ra.shape, {}}, rms{ra.shape, {}};
  Tensor w = random({67}, 81), b = random({67}, 82);
  const Ref rw = read(w), rb = read(b);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* row = ra.v.data() + r * cols;
    double s = 0, m = -1e300, sq = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      s += row[c];
      m = std::max(m, row[c]);
      sq += row[c] * row[c];
    }
    sum.v.push_back(s);
    mean.v.push_back(s / cols);
    max.v.push_back(m);
    double z = 0;
    for (std::int64_t c = 0; c < cols; ++c) z += std::exp(row[c] - m);
    double var = 0;
    for (std::int64_t c = 0; c < cols; ++c) var += (row[c] - s / cols) * (row[c] - s / cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      soft.v.push_back(std::exp(row[c] - m) / z);
      ln.v.push_back((row[c] - s / cols) / std::sqrt(var / cols + 1e-5) * rw.v[c] + rb.v[c]);
      rms.v.push_back(row[c] / std::sqrt(sq / cols + 1e-6) * rw.v[c]);
    }
  }
  expect_close(ops::sum(a), sum, 8.0);
  expect_close(ops::mean(a, ops::KeepDim::yes), mean);
  expect_close(ops::max(a), max);
  expect_close(ops::softmax(a), soft);
  expect_close(ops::layer_norm(a, w, b), ln, 4.0);
  expect_close(ops::rms_norm(a, w), rms, 4.0);
  // Large values stay finite: the softmax subtracts the row maximum.
  Tensor big = ops::mul(a, 1000.0);
  for (float x : ops::softmax(big).to_vector<float>()) EXPECT_TRUE(std::isfinite(x));
  expect_replay_matches({random({4, 96}, 83), random({96}, 84), random({96}, 85)},
                        [](const std::vector<Tensor>& in) {
                          return ops::softmax(ops::layer_norm(in[0], in[1], in[2]));
                        });
}

Ref reference_matmul(const Ref& a, const Ref& b, bool ta, bool tb) {
  const std::size_t ra = a.shape.size(), rb = b.shape.size(), rank = std::max(ra, rb);
  const std::int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2];
  const std::int64_t k = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  const std::int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  std::vector<std::int64_t> batch(rank - 2);
  for (std::size_t i = 0; i + 2 < rank; ++i) {
    const std::int64_t da = i + ra >= rank ? a.shape[i + ra - rank] : 1;
    const std::int64_t db = i + rb >= rank ? b.shape[i + rb - rank] : 1;
    batch[i] = std::max(da, db);
  }
  Ref out{batch, {}};
  out.shape.push_back(m);
  out.shape.push_back(n);
  const std::vector<std::int64_t> abatch(a.shape.begin(), a.shape.end() - 2);
  const std::vector<std::int64_t> bbatch(b.shape.begin(), b.shape.end() - 2);
  const std::int64_t batches = std::accumulate(batch.begin(), batch.end(), std::int64_t{1},
                                               std::multiplies<>());
  for (std::int64_t bi = 0; bi < batches; ++bi) {
    const auto idx = unravel(bi, batch);
    const std::int64_t ao = (abatch.empty() ? 0 : broadcast_index(idx, abatch)) * m * k;
    const std::int64_t bo = (bbatch.empty() ? 0 : broadcast_index(idx, bbatch)) * k * n;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          acc += a.v[ao + (ta ? p * m + i : i * k + p)] * b.v[bo + (tb ? j * k + p : p * n + j)];
        }
        out.v.push_back(acc);
      }
    }
  }
  return out;
}

TEST_P(OpsTest, MatmulAndLinear) {
  struct Case {
    std::vector<std::int64_t> a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {{{7, 13}, {13, 5}, false, false},
                                   {{13, 7}, {13, 5}, true, false},
                                   {{7, 13}, {5, 13}, false, true},
                                   {{2, 3, 9, 11}, {11, 6}, false, false},
                                   {{2, 1, 9, 11}, {3, 11, 6}, false, false},
                                   {{96, 80}, {80, 72}, false, false}};  // OpenBLAS path
  std::uint64_t salt = 90;
  for (const Case& c : cases) {
    Tensor a = random(c.a, salt++), b = random(c.b, salt++);
    Tensor out = ops::matmul(a, b, c.ta ? ops::Transpose::yes : ops::Transpose::no,
                             c.tb ? ops::Transpose::yes : ops::Transpose::no);
    expect_close(out, reference_matmul(read(a), read(b), c.ta, c.tb), 10.0);
  }
  Tensor x = random({2, 5, 24}, 99), w = random({10, 24}, 100), bias = random({10}, 101);
  Ref want = reference_matmul(read(x), read(w), false, true);
  const Ref rbias = read(bias);
  for (std::size_t i = 0; i < want.v.size(); ++i) want.v[i] += rbias.v[i % 10];
  expect_close(ops::linear(x, w, bias), want, 10.0);
  expect_replay_matches({random({3, 16}, 102), random({8, 16}, 103), random({8}, 104)},
                        [](const std::vector<Tensor>& in) {
                          return ops::linear(in[0], in[1], in[2]);
                        });
}

TEST_P(OpsTest, ScaledDotProductAttention) {
  const std::int64_t B = 2, H = 3, Sq = 5, Sk = 7, D = 8, Dv = 6;
  Tensor q = random({B, H, Sq, D}, 110), k = random({B, H, Sk, D}, 111);
  Tensor v = random({B, H, Sk, Dv}, 112), mask = random({B, 1, Sq, Sk}, 113);
  const Ref rq = read(q), rk = read(k), rv = read(v), rm = read(mask);
  for (bool with_mask : {false, true}) {
    Ref want{{B, H, Sq, Dv}, {}};
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t i = 0; i < Sq; ++i) {
          std::vector<double> s(Sk);
          double m = -1e300;
          for (std::int64_t j = 0; j < Sk; ++j) {
            double acc = 0;
            for (std::int64_t p = 0; p < D; ++p) {
              acc += rq.v[((b * H + h) * Sq + i) * D + p] * rk.v[((b * H + h) * Sk + j) * D + p];
            }
            s[j] = acc * scale + (with_mask ? rm.v[(b * Sq + i) * Sk + j] : 0.0);
            m = std::max(m, s[j]);
          }
          double z = 0;
          for (double& x : s) z += (x = std::exp(x - m));
          for (std::int64_t e = 0; e < Dv; ++e) {
            double acc = 0;
            for (std::int64_t j = 0; j < Sk; ++j) acc += s[j] / z * rv.v[((b * H + h) * Sk + j) * Dv + e];
            want.v.push_back(acc);
          }
        }
      }
    }
    expect_close(ops::scaled_dot_product_attention(q, k, v, with_mask ? mask : Tensor()), want,
                 4.0);
  }
  expect_replay_matches({q, k, v}, [](const std::vector<Tensor>& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2]);
  });
}

// Products large enough to take the CPU device's library paths (blocks of rows over the kernel
// threads; oneDNN on AVX-512 CPUs when built with it; scaled and accumulating calls for
// attention and biases), against float64.
TEST_P(OpsTest, LargeProductsMatchFloat64) {
  struct Case {
    std::vector<std::int64_t> a, b;
    bool ta, tb;
  };
  std::uint64_t salt = 700;
  for (const Case& c : std::vector<Case>{{{130, 300}, {300, 140}, false, false},
                                         {{300, 130}, {300, 140}, true, false},
                                         {{130, 300}, {140, 300}, false, true},
                                         {{3, 300}, {300, 900}, false, false},
                                         // GEMVs against large matrices: columns split.
                                         {{1, 256}, {1536, 256}, false, true},
                                         {{2, 512}, {512, 700}, false, false},
                                         {{512, 3}, {512, 300}, true, false}}) {
    Tensor a = random(c.a, salt++), b = random(c.b, salt++);
    expect_close(ops::matmul(a, b, c.ta ? ops::Transpose::yes : ops::Transpose::no,
                             c.tb ? ops::Transpose::yes : ops::Transpose::no),
                 reference_matmul(read(a), read(b), c.ta, c.tb), 20.0);
  }
  Tensor x = random({2, 70, 256}, 710), w = random({300, 256}, 711), bias = random({300}, 712);
  Ref want = reference_matmul(read(x), read(w), false, true);
  const Ref rbias = read(bias);
  for (std::size_t i = 0; i < want.v.size(); ++i) want.v[i] += rbias.v[i % 300];
  expect_close(ops::linear(x, w, bias), want, 20.0);
  expect_replay_matches({x, w, bias}, [](const std::vector<Tensor>& in) {
    return ops::linear(in[0], in[1], in[2]);
  });
  // The adaLN projection: one conditioning row against a [6 * hidden, hidden] weight.
  Tensor row = random({1, 1, 256}, 713), w6 = random({1536, 256}, 714), b6 = random({1536}, 715);
  Ref want6 = reference_matmul(read(row), read(w6), false, true);
  const Ref rb6 = read(b6);
  for (std::size_t i = 0; i < want6.v.size(); ++i) want6.v[i] += rb6.v[i];
  expect_close(ops::linear(row, w6, b6), want6, 20.0);
  expect_replay_matches({row, w6, b6}, [](const std::vector<Tensor>& in) {
    return ops::linear(in[0], in[1], in[2]);
  });
  // Attention with 64-wide heads over 200 keys: per-block products of ~800k multiply-adds.
  const std::int64_t H = 2, Sq = 130, Sk = 200, D = 64;
  Tensor q = random({1, H, Sq, D}, 720), k = random({1, H, Sk, D}, 721), v = random({1, H, Sk, D}, 722);
  const Ref rq = read(q), rk = read(k), rv = read(v);
  Ref att{{1, H, Sq, D}, {}};
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t i = 0; i < Sq; ++i) {
      std::vector<double> sc(Sk);
      double m = -1e300, z = 0;
      for (std::int64_t j = 0; j < Sk; ++j) {
        double acc = 0;
        for (std::int64_t p = 0; p < D; ++p) acc += rq.v[(h * Sq + i) * D + p] * rk.v[(h * Sk + j) * D + p];
        sc[j] = acc / 8.0;
        m = std::max(m, sc[j]);
      }
      for (double& e : sc) z += (e = std::exp(e - m));
      for (std::int64_t e = 0; e < D; ++e) {
        double acc = 0;
        for (std::int64_t j = 0; j < Sk; ++j) acc += sc[j] / z * rv.v[(h * Sk + j) * D + e];
        att.v.push_back(acc);
      }
    }
  }
  expect_close(ops::scaled_dot_product_attention(q, k, v), att, 8.0);
  expect_replay_matches({q, k, v}, [](const std::vector<Tensor>& in) {
    return ops::scaled_dot_product_attention(in[0], in[1], in[2]);
  });
}

TEST_P(OpsTest, ShapeOpsMoveDataExactly) {
  Tensor a = random({2, 3, 4, 5}, 120);
  const Ref ra = read(a);
  // permute
  Tensor p = ops::permute(a, {3, 1, 0, 2});
  ASSERT_EQ(p.shape(), (Shape{5, 3, 2, 4}));
  const Ref rp = read(p);
  for (std::int64_t i = 0; i < rp.numel(); ++i) {
    const auto idx = unravel(i, rp.shape);  // [e, b, a0, c]
    const std::int64_t src = ((idx[2] * 3 + idx[1]) * 4 + idx[3]) * 5 + idx[0];
    ASSERT_EQ(rp.v[i], ra.v[src]);
  }
  EXPECT_EQ(read(ops::transpose(ops::transpose(a, 1, -1), 1, -1)).v, ra.v);
  // slice with a step, negative indices
  const Ref rs = read(ops::slice(a, 3, -4, 5, 2));  // columns 1 and 3
  ASSERT_EQ(rs.shape, (std::vector<std::int64_t>{2, 3, 4, 2}));
  for (std::int64_t i = 0; i < rs.numel(); ++i) {
    const auto idx = unravel(i, rs.shape);
    ASSERT_EQ(rs.v[i], ra.v[((idx[0] * 3 + idx[1]) * 4 + idx[2]) * 5 + 1 + 2 * idx[3]]);
  }
  // split / chunk / concat round trip
  const std::vector<std::int64_t> sizes{1, 2};
  std::vector<Tensor> pieces = ops::split(a, sizes, 1);
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 2, 4, 5}));
  EXPECT_EQ(read(ops::concat(pieces, 1)).v, ra.v);
  std::vector<Tensor> chunks = ops::chunk(a, 2, -1);
  EXPECT_EQ(chunks[0].shape(), (Shape{2, 3, 4, 3}));
  EXPECT_EQ(chunks[1].shape(), (Shape{2, 3, 4, 2}));
  EXPECT_EQ(read(ops::concat(chunks, -1)).v, ra.v);
  // reshape is a view
  Tensor r = ops::reshape(a, {6, -1});
  EXPECT_EQ(r.shape(), (Shape{6, 20}));
  EXPECT_EQ(r.address(), a.address());
  // to_layout round trip with padding
  Tensor t = ops::to_layout(a, Layout::tile);
  EXPECT_EQ(t.layout(), Layout::tile);
  EXPECT_EQ(t.nbytes(), 6u * 32 * 32 * dtype_size(dtype()));
  EXPECT_EQ(read(t).v, ra.v);  // to_vector untilizes on the host
  EXPECT_EQ(read(ops::to_layout(t, Layout::row_major)).v, ra.v);
  EXPECT_EQ(ops::to_layout(a, Layout::row_major).address(), a.address());
  expect_replay_matches({a}, [](const std::vector<Tensor>& in) {
    auto parts = ops::chunk(ops::permute(in[0], {0, 2, 1, 3}), 2, 1);
    return ops::to_layout(ops::concat(parts, 1), Layout::tile);
  });
}

TEST_P(OpsTest, Typecast) {
  Tensor a = random({3, 7}, 130, -100.0f, 100.0f);
  const Ref ra = read(a);
  Ref as_int{ra.shape, {}};
  for (double x : ra.v) as_int.v.push_back(std::trunc(x));
  EXPECT_EQ(read(ops::typecast(a, DType::int32)).v, as_int.v);
  Tensor other = ops::typecast(a, bf16() ? DType::float32 : DType::bfloat16);
  Ref rounded{ra.shape, {}};
  for (double x : ra.v) rounded.v.push_back(bfloat16::from_float(static_cast<float>(x)).to_float());
  EXPECT_EQ(read(other).v, rounded.v);
}

// Floats outside an integer type's range saturate to its lowest or highest value (infinities
// too), NaN becomes 0, the rest truncate toward zero: a defined result for every input (a C++
// conversion of an out-of-range float is undefined behaviour).
TEST_P(OpsTest, TypecastToIntegersSaturatesAndMapsNaNToZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<float> values{static_cast<float>(nan), static_cast<float>(inf),
                                  static_cast<float>(-inf), 3e9f, -3e9f, 1e20f, -1e20f,
                                  2.75f, -2.75f, 255.5f, 256.0f, -1.0f, -0.5f, 0.0f};
  const Tensor a = Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())},
                                       dtype()).to_device(device());
  const std::vector<double> stored = read(a).v;  // bfloat16 rounds some of them
  for (DType to : {DType::int32, DType::uint32, DType::uint8}) {
    const double lo = to == DType::int32 ? -2147483648.0 : 0.0;
    const double hi = to == DType::int32 ? 2147483647.0 : to == DType::uint32 ? 4294967295.0 : 255.0;
    std::vector<double> expected;
    for (double x : stored) expected.push_back(std::isnan(x) ? 0.0 : std::clamp(std::trunc(x), lo, hi));
    const Tensor got = ops::typecast(a, to);
    std::vector<double> converted;
    if (to == DType::int32) {
      for (auto v : got.to_vector<std::int32_t>()) converted.push_back(v);
    } else if (to == DType::uint32) {
      for (auto v : got.to_vector<std::uint32_t>()) converted.push_back(v);
    } else {
      for (auto v : got.to_vector<std::uint8_t>()) converted.push_back(v);
    }
    EXPECT_EQ(converted, expected) << dtype_name(to);
  }
  expect_replay_matches({a}, [](const std::vector<Tensor>& in) {
    return ops::typecast(in[0], DType::int32);
  });
}

// Every op in one traced function: replay equals eager bit for bit, before and after the inputs
// change.
TEST_P(OpsTest, EveryOpReplaysBitIdentical) {
  auto all_ops = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];  // [2, 4, 8, 16], positive
    const Tensor& w = in[1];  // [16]
    std::vector<Tensor> outs;
    outs.push_back(ops::sub(x, w));
    outs.push_back(ops::div(x, w));
    outs.push_back(ops::maximum(x, w));
    outs.push_back(ops::minimum(x, 0.5));
    using Unary = Tensor (*)(const Tensor&, QueueId);
    for (Unary unary : std::initializer_list<Unary>{ops::neg, ops::abs, ops::exp, ops::log,
                                                    ops::sqrt, ops::rsqrt, ops::tanh, ops::sigmoid,
                                                    ops::relu, ops::silu, ops::gelu,
                                                    ops::gelu_tanh}) {
      outs.push_back(unary(x, kDefaultQueue));
    }
    outs.push_back(ops::sum(x, ops::KeepDim::yes));
    outs.push_back(ops::mean(x, ops::KeepDim::yes));
    outs.push_back(ops::max(x, ops::KeepDim::yes));
    outs.push_back(ops::rms_norm(x, w));
    outs.push_back(ops::layer_norm(x, w));
    outs.push_back(ops::softmax(x));
    outs.push_back(ops::matmul(x, ops::reshape(ops::slice(x, 2, 0, 1), {2, 4, 16, 1})));
    outs.push_back(ops::matmul(x, x, ops::Transpose::no, ops::Transpose::yes));
    outs.push_back(ops::linear(x, ops::reshape(ops::slice(ops::slice(x, 0, 0, 1), 1, 0, 2), {16, 16}), w));
    outs.push_back(ops::scaled_dot_product_attention(x, x, x));
    outs.push_back(ops::typecast(ops::typecast(x, DType::int32), x.dtype()));
    outs.push_back(ops::transpose(ops::slice(x, 3, 1, 15, 3), 0, 2));
    std::vector<Tensor> flat;
    for (const Tensor& t : outs) flat.push_back(ops::reshape(t, {-1}));
    return ops::concat(flat, 0);
  };
  expect_replay_matches({random({2, 4, 8, 16}, 140, 0.1f, 2.0f), random({16}, 141, 0.5f, 1.5f)},
                        all_ops);
}

INSTANTIATE_TEST_SUITE_P(DTypes, OpsTest,
                         ::testing::Values(DType::float32, DType::bfloat16, DType::float16),
                         [](const auto& param_info) { return std::string(dtype_name(param_info.param)); });

TEST(OpsErrorTest, ShapeAndArgumentErrorsNameTheOp) {
  RETRACE_TEST_DEVICE(device);
  Tensor a = ops::full({2, 3}, 1.0, *device);
  EXPECT_RETRACE_ERROR((void)ops::matmul(a, a), invalid_argument,
                       "matmul: inner dimensions differ: a [2, 3] has 3 columns, b [2, 3] has 2 rows");
  EXPECT_RETRACE_ERROR((void)ops::matmul(ops::full({4}, 1.0, *device), a), invalid_argument,
                       "matmul: inner dimensions differ: a [4] has 4 columns, b [2, 3] has 2 rows");
  EXPECT_RETRACE_ERROR((void)ops::linear(a, ops::full({5, 4}, 1.0, *device)), invalid_argument,
                       "linear: weight [5, 4] expects 4 input features, x [2, 3] has 3");
  EXPECT_RETRACE_ERROR((void)ops::layer_norm(a, ops::full({4}, 1.0, *device)), invalid_argument,
                       "layer_norm: weight must hold 3 elements");
  EXPECT_RETRACE_ERROR((void)ops::softmax(ops::full({2, 3}, 1.0, *device, DType::int32)),
                       invalid_argument, "softmax: a has dtype int32; supported: float32, bfloat16, float16");
  EXPECT_RETRACE_ERROR((void)ops::sum(ops::full({2, 3}, 1.0, *device, DType::float32, Layout::tile)),
                       invalid_argument, "sum: a is in tile layout");
  EXPECT_RETRACE_ERROR((void)ops::permute(a, {0, 0}), invalid_argument,
                       "permute: dimension 0 appears twice");
  EXPECT_RETRACE_ERROR((void)ops::slice(a, 2, 0, 1), invalid_argument,
                       "slice: dimension 2 is out of range for a tensor of rank 2");
  const std::vector<std::int64_t> sizes{1, 1};
  EXPECT_RETRACE_ERROR((void)ops::split(a, sizes, 1), invalid_argument,
                       "split: sizes add up to 2 but dimension 1 of [2, 3] has 3");
  const std::vector<Tensor> mismatched{a, ops::full({3, 3}, 1.0, *device)};
  EXPECT_RETRACE_ERROR((void)ops::concat(mismatched, 1), invalid_argument,
                       "concat: tensors[1] has shape [3, 3], which differs from [2, 3]");
  EXPECT_RETRACE_ERROR((void)ops::reshape(a, {4, -1}), invalid_argument,
                       "reshape: cannot infer the -1 extent");
  Tensor q = ops::full({1, 2, 4, 8}, 1.0, *device);
  EXPECT_RETRACE_ERROR((void)ops::scaled_dot_product_attention(q, q, q, ops::full({3, 4}, 0.0, *device)),
                       invalid_argument, "mask [3, 4] does not broadcast to");
  EXPECT_RETRACE_ERROR((void)ops::scaled_dot_product_attention(q, ops::full({1, 2, 4, 7}, 1.0, *device), q),
                       invalid_argument, "shapes do not fit");
  EXPECT_RETRACE_ERROR((void)ops::exp(Tensor()), invalid_argument, "exp: a is a null tensor");
  EXPECT_RETRACE_ERROR(
      (void)ops::gelu(Tensor::from_vector<float>({1.0f}, {1}, DType::float32)), invalid_argument,
      "gelu: a is a host tensor");
}

}  // namespace
}  // namespace retrace
