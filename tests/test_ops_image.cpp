// pad, interpolate (nearest, nearest-exact, bilinear, bicubic, area) and conv2d against float64 references computed here (direct loops),
// in float32 and bfloat16, with strides, padding, dilation, groups (depthwise included), 1x1
// kernels, empty batches and size-1 extents; traced == eager bit for bit; errors.
#include "support.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <functional>
#include <limits>
#include <cmath>

namespace retrace {
namespace {

using testing::device_tensor;

class OpImageTest : public testing::DeviceTest {};

// The values as the dtype stores them (bfloat16 and float16 round), in double.
std::vector<double> stored(const std::vector<float>& v, DType dtype) {
  std::vector<double> out;
  for (float x : v) {
    out.push_back(dtype == DType::bfloat16  ? bfloat16::from_float(x).to_float()
                  : dtype == DType::float16 ? float16::from_float(x).to_float()
                                            : x);
  }
  return out;
}

// One resized size: [.., ih, iw] -> [.., oh, ow].
struct ResizeSize {
  std::int64_t ih, iw, oh, ow;
};
const std::vector<ResizeSize> kResizeSizes = {
    {2, 2, 4, 4}, {3, 5, 7, 4}, {8, 8, 16, 16}, {9, 6, 4, 3}, {1, 4, 3, 9},
    {5, 1, 5, 6}, {4, 4, 1, 7}, {13, 11, 32, 29}, {32, 32, 17, 45}};
// The float64 value of output (plane, i, j) from the stored input x (planes of ih x iw).
using ResizeReference = std::function<double(const std::vector<double>& x, const ResizeSize& s,
                                             std::int64_t plane, std::int64_t i, std::int64_t j)>;

// Resizes random [2, 2, ih, iw] inputs of every size in kResizeSizes and every float dtype with
// `options` and checks each output against `want` within tolerance[float32, bfloat16, float16].
void expect_resize_matches(Device& device, const ops::InterpolateOptions& options,
                           const std::array<double, 3>& tolerance, std::uint64_t salt,
                           const ResizeReference& want) {
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    const double tol = tolerance[dtype == DType::float32 ? 0 : dtype == DType::bfloat16 ? 1 : 2];
    for (const ResizeSize& z : kResizeSizes) {
      const std::int64_t planes = 4;
      const auto v = testing::random_floats(static_cast<std::size_t>(planes * z.ih * z.iw), ++salt);
      const std::vector<double> x = stored(v, dtype);
      const Tensor y = ops::interpolate(device_tensor(device, v, {2, 2, z.ih, z.iw}, dtype), z.oh,
                                        z.ow, options);
      ASSERT_EQ(y.shape(), (Shape{2, 2, z.oh, z.ow}));
      ASSERT_EQ(y.dtype(), dtype);
      const std::vector<double> got = y.to_vector<double>();
      for (std::int64_t m = 0; m < planes; ++m) {
        for (std::int64_t i = 0; i < z.oh; ++i) {
          for (std::int64_t j = 0; j < z.ow; ++j) {
            ASSERT_NEAR(got[static_cast<std::size_t>((m * z.oh + i) * z.ow + j)],
                        want(x, z, m, i, j), tol)
                << dtype_name(dtype) << " align_corners " << options.align_corners << " "
                << z.ih << "x" << z.iw << " -> " << z.oh << "x" << z.ow << " at " << m << ","
                << i << "," << j;
          }
        }
      }
    }
  }
}

struct ConvCase {
  std::int64_t n, c, h, w, o, kh, kw;
  ops::Conv2dOptions options;
  bool bias;
};

TEST_F(OpImageTest, Conv2dMatchesAFloat64Reference) {
  const std::vector<ConvCase> cases{
      {2, 3, 7, 6, 4, 3, 3, {}, true},
      {1, 4, 8, 8, 6, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, true},   // stride 2, padding 1
      {1, 2, 9, 7, 3, 3, 2, {{1, 2}, {2, 0}, {2, 1}, 1}, false},  // dilation, uneven
      {1, 3, 8, 9, 2, 2, 3, {{1, 1}, {1, 2}, {1, 2}, 1}, true},   // dilation along W
      {2, 4, 5, 5, 6, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 2}, true},   // 2 groups
      {1, 4, 6, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 4}, true},   // depthwise
      {3, 5, 4, 4, 2, 1, 1, {}, true},                            // 1x1 (a linear per pixel)
      {1, 1, 1, 1, 1, 1, 1, {}, false},                           // size 1 everywhere
      {0, 3, 5, 5, 2, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},   // empty batch
      {1, 4, 32, 32, 8, 2, 2, {{2, 2}, {0, 0}, {1, 1}, 1}, true}, // patch embedding
  };
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    std::uint64_t salt = 0;
    for (const ConvCase& k : cases) {
      const auto& [sh, sw] = k.options.stride;
      const auto& [ph, pw] = k.options.padding;
      const auto& [dh, dw] = k.options.dilation;
      const std::int64_t g = k.options.groups, cg = k.c / g, og = k.o / g;
      const auto xv = testing::random_floats(static_cast<std::size_t>(k.n * k.c * k.h * k.w), ++salt);
      const auto wv = testing::random_floats(static_cast<std::size_t>(k.o * cg * k.kh * k.kw), ++salt);
      const auto bv = testing::random_floats(static_cast<std::size_t>(k.o), ++salt);
      const Tensor x = device_tensor(device(), xv, {k.n, k.c, k.h, k.w}, dtype);
      const Tensor w = device_tensor(device(), wv, {k.o, cg, k.kh, k.kw}, dtype);
      const Tensor b = k.bias ? device_tensor(device(), bv, {k.o}, dtype) : Tensor{};
      const Tensor y = ops::conv2d(x, w, b, k.options);
      const std::int64_t ho = (k.h + 2 * ph - dh * (k.kh - 1) - 1) / sh + 1;
      const std::int64_t wo = (k.w + 2 * pw - dw * (k.kw - 1) - 1) / sw + 1;
      ASSERT_EQ(y.shape(), (Shape{k.n, k.o, ho, wo}));
      const auto xs = stored(xv, dtype), ws = stored(wv, dtype), bs = stored(bv, dtype);
      const std::vector<float> got = y.to_vector<float>();
      for (std::int64_t ni = 0; ni < k.n; ++ni) {
        for (std::int64_t oc = 0; oc < k.o; ++oc) {
          for (std::int64_t i = 0; i < ho; ++i) {
            for (std::int64_t j = 0; j < wo; ++j) {
              double ref = k.bias ? bs[static_cast<std::size_t>(oc)] : 0.0, magnitude = std::abs(ref);
              const std::int64_t group = oc / og;
              for (std::int64_t ci = 0; ci < cg; ++ci) {
                for (std::int64_t a = 0; a < k.kh; ++a) {
                  for (std::int64_t bb = 0; bb < k.kw; ++bb) {
                    const std::int64_t yi = i * sh + a * dh - ph, xj = j * sw + bb * dw - pw;
                    if (yi < 0 || yi >= k.h || xj < 0 || xj >= k.w) continue;
                    const double term =
                        xs[static_cast<std::size_t>(((ni * k.c + group * cg + ci) * k.h + yi) * k.w + xj)] *
                        ws[static_cast<std::size_t>(((oc * cg + ci) * k.kh + a) * k.kw + bb)];
                    ref += term;
                    magnitude += std::abs(term);
                  }
                }
              }
              const double v = got[static_cast<std::size_t>(((ni * k.o + oc) * ho + i) * wo + j)];
              // One output rounding of a float32 sum: 2^-8 or 2^-11 relative (float16 also
              // 2^-25 absolute in its subnormals).
              const double tol = dtype == DType::bfloat16  ? std::abs(ref) / 128.0 + 1e-5 * magnitude
                                 : dtype == DType::float16 ? std::abs(ref) / 1024.0 + 1e-5 * magnitude + 1e-7
                                                           : 1e-6 * magnitude + 1e-30;
              ASSERT_NEAR(v, ref, tol) << "case " << salt << " " << dtype_name(dtype) << " at ["
                                       << ni << ", " << oc << ", " << i << ", " << j << "]";
            }
          }
        }
      }
    }
  }
}

// The im2col columns made a chunk at a time (one output row, a third of an image, one image,
// all at once): traced == eager bit for bit at each chunk size, and the values those of the
// whole product up to rounding (a GEMM library may block a shorter product differently).
TEST_F(OpImageTest, Conv2dChunksOfColumnsReplayBitForBitAndAgreeWithTheWhole) {
  struct Restore {
    std::size_t bytes = ops::conv2d_column_bytes();
    ~Restore() { ops::set_conv2d_column_bytes(bytes); }
  } restore;
  const std::vector<ConvCase> cases{
      {2, 3, 7, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {3, 4, 9, 8, 6, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, true},
      {2, 2, 9, 7, 3, 3, 2, {{1, 2}, {2, 0}, {2, 1}, 1}, false},
      {2, 4, 5, 5, 6, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 2}, true},
      {2, 64, 20, 19, 48, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
  };
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    std::uint64_t salt = 50;
    for (const ConvCase& k : cases) {
      const std::int64_t cg = k.c / k.options.groups;
      const Tensor x = device_tensor(
          device(), testing::random_floats(static_cast<std::size_t>(k.n * k.c * k.h * k.w), ++salt),
          {k.n, k.c, k.h, k.w}, dtype);
      const Tensor w = device_tensor(
          device(), testing::random_floats(static_cast<std::size_t>(k.o * cg * k.kh * k.kw), ++salt),
          {k.o, cg, k.kh, k.kw}, dtype);
      const Tensor b = k.bias ? device_tensor(device(), testing::random_floats(static_cast<std::size_t>(k.o), ++salt),
                                              {k.o}, dtype)
                              : Tensor{};
      ops::set_conv2d_column_bytes(std::size_t{1} << 30);
      const auto whole = ops::conv2d(x, w, b, k.options).to_vector<float>();
      const std::size_t image = static_cast<std::size_t>(k.h * k.w * cg * k.kh * k.kw) *
                                dtype_info(dtype).size;
      for (std::size_t bytes : {std::size_t{1}, image / 3, image, 2 * image}) {
        ops::set_conv2d_column_bytes(bytes);
        const Tensor eager = ops::conv2d(x, w, b, k.options);
        const auto got = eager.to_vector<float>();
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          worst = std::max(worst, std::abs(static_cast<double>(got[i]) - whole[i]));
          scale = std::max(scale, std::abs(static_cast<double>(whole[i])));
        }
        EXPECT_LE(worst, (dtype == DType::float32 ? 1e-5 : 1e-2) * scale)
            << dtype_name(dtype) << " " << k.c << " channels, chunks of " << bytes << " bytes";
        auto traced = make_tracer(
            [&](const Tensor& xx) { return ops::conv2d(xx, w, b, k.options); }, device());
        const auto bits = testing::float_bits(eager);
        EXPECT_EQ(testing::float_bits(traced(x)), bits) << "capture, " << bytes;
        EXPECT_EQ(testing::float_bits(traced(x)), bits) << "replay, " << bytes;
      }
    }
  }
}

// The float64 convolution of stored float32 values (3x3 and any padding, stride 1, one group):
// values and, per output, the sum of the terms' magnitudes.
struct Conv3x3Reference {
  std::vector<double> value, magnitude;
};
Conv3x3Reference conv3x3_reference(const std::vector<float>& x, const std::vector<float>& w,
                                   const std::vector<float>& b, std::int64_t n, std::int64_t c,
                                   std::int64_t h, std::int64_t wd, std::int64_t o,
                                   std::int64_t ph, std::int64_t pw) {
  const std::int64_t ho = h + 2 * ph - 2, wo = wd + 2 * pw - 2;
  Conv3x3Reference r;
  for (std::int64_t ni = 0; ni < n; ++ni) {
    for (std::int64_t oc = 0; oc < o; ++oc) {
      for (std::int64_t i = 0; i < ho; ++i) {
        for (std::int64_t j = 0; j < wo; ++j) {
          double sum = b.empty() ? 0.0 : b[static_cast<std::size_t>(oc)];
          double magnitude = std::abs(sum);
          for (std::int64_t ci = 0; ci < c; ++ci) {
            for (std::int64_t a = 0; a < 3; ++a) {
              for (std::int64_t bb = 0; bb < 3; ++bb) {
                const std::int64_t yi = i + a - ph, xj = j + bb - pw;
                if (yi < 0 || yi >= h || xj < 0 || xj >= wd) continue;
                const double term =
                    static_cast<double>(x[static_cast<std::size_t>(((ni * c + ci) * h + yi) * wd + xj)]) *
                    w[static_cast<std::size_t>(((oc * c + ci) * 3 + a) * 3 + bb)];
                sum += term;
                magnitude += std::abs(term);
              }
            }
          }
          r.value.push_back(sum);
          r.magnitude.push_back(magnitude);
        }
      }
    }
  }
  return r;
}

struct Restore3x3 {
  std::size_t bytes = ops::conv2d_column_bytes();
  bool winograd = ops::conv2d_winograd();
  ~Restore3x3() {
    ops::set_conv2d_column_bytes(bytes);
    ops::set_conv2d_winograd(winograd);
  }
};

// float32 3x3 convolutions with at least 16 channels each side go through the CPU device's
// Winograd kernel (F(4x4, 3x3)): against float64, at image sizes that are and are not multiples
// of the 4x4 tile (1 pixel wide, a last partial tile, padding 0, 1 and 2, batches), with the
// transformed input made a row of tiles at a time and all at once; traced == eager bit for bit.
// The tolerance: 4e-6 of the largest term magnitude sum in the output (the transforms mix the
// values of a 6x6 block, so an output's error follows its neighbours' sizes, not its own).
TEST_F(OpImageTest, Conv2dWinogradMatchesAFloat64Reference) {
  Restore3x3 restore;
  struct Case {
    std::int64_t n, c, h, w, o, ph, pw;
    bool bias;
  };
  const std::vector<Case> cases{
      {1, 16, 4, 4, 16, 1, 1, true},    {2, 24, 7, 9, 17, 1, 1, true},
      {1, 16, 6, 7, 32, 0, 0, false},   {1, 16, 17, 1, 16, 1, 1, true},
      {1, 20, 9, 10, 20, 2, 1, true},   {1, 64, 33, 35, 48, 1, 1, true},
      {3, 16, 12, 12, 16, 1, 1, false}, {1, 32, 1, 40, 16, 1, 1, true},
  };
  std::uint64_t salt = 700;
  for (const Case& k : cases) {
    const auto xv = testing::random_floats(static_cast<std::size_t>(k.n * k.c * k.h * k.w), ++salt);
    const auto wv = testing::random_floats(static_cast<std::size_t>(k.o * k.c * 9), ++salt);
    const auto bv = k.bias ? testing::random_floats(static_cast<std::size_t>(k.o), ++salt)
                           : std::vector<float>{};
    const Tensor x = device_tensor(device(), xv, {k.n, k.c, k.h, k.w});
    const Tensor w = device_tensor(device(), wv, {k.o, k.c, 3, 3});
    const Tensor b = k.bias ? device_tensor(device(), bv, {k.o}) : Tensor{};
    const ops::Conv2dOptions options{{1, 1}, {k.ph, k.pw}, {1, 1}, 1};
    const Conv3x3Reference want = conv3x3_reference(xv, wv, bv, k.n, k.c, k.h, k.w, k.o, k.ph, k.pw);
    const double scale = *std::max_element(want.magnitude.begin(), want.magnitude.end());
    for (std::size_t bytes : {std::size_t{1}, std::size_t{32} << 20}) {
      ops::set_conv2d_column_bytes(bytes);
      ops::set_conv2d_winograd(true);
      const Tensor y = ops::conv2d(x, w, b, options);
      ASSERT_EQ(y.shape(), (Shape{k.n, k.o, k.h + 2 * k.ph - 2, k.w + 2 * k.pw - 2}));
      const auto got = y.to_vector<float>();
      ASSERT_EQ(got.size(), want.value.size());
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - want.value[i]));
      }
      EXPECT_LE(worst, 4e-6 * scale) << k.c << "->" << k.o << " " << k.h << "x" << k.w
                                     << " padding " << k.ph << "," << k.pw << " chunk " << bytes;
      auto traced = make_tracer([&](const Tensor& xx) { return ops::conv2d(xx, w, b, options); },
                                device());
      const auto bits = testing::float_bits(y);
      EXPECT_EQ(testing::float_bits(traced(x)), bits) << "capture";
      EXPECT_EQ(testing::float_bits(traced(x)), bits) << "replay";
      // The im2col path: the same values up to rounding.
      ops::set_conv2d_winograd(false);
      const auto direct = ops::conv2d(x, w, b, options).to_vector<float>();
      double apart = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        apart = std::max(apart, std::abs(static_cast<double>(got[i]) - direct[i]));
      }
      EXPECT_LE(apart, 8e-6 * scale);
    }
  }
}

// A NaN or infinity in a 6x6 input block spreads to the whole 4x4 output tile in Winograd's
// transforms; the kernel then computes the output directly, so NaN and infinity land where the
// im2col path puts them and every other output stays finite. The same for values so large that
// the transforms overflow while the direct sums do not, and for a non-finite weight.
TEST_F(OpImageTest, Conv2dWinogradKeepsNaNAndInfinityWhereTheDirectSumPutsThem) {
  Restore3x3 restore;
  const std::int64_t n = 1, c = 16, h = 12, w = 13, o = 16;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto xv = testing::random_floats(static_cast<std::size_t>(n * c * h * w), 11);
  auto wv = testing::random_floats(static_cast<std::size_t>(o * c * 9), 12);
  const auto bv = testing::random_floats(static_cast<std::size_t>(o), 13);
  std::vector<std::vector<float>> xs, ws;
  auto x_inf = xv;
  x_inf[static_cast<std::size_t>((3 * h + 5) * w + 6)] = inf;
  xs.push_back(x_inf);
  ws.push_back(wv);
  auto x_nan = xv;
  x_nan[static_cast<std::size_t>((0 * h + 0) * w + 12)] = nan;
  xs.push_back(x_nan);
  ws.push_back(wv);
  auto x_big = xv;
  for (float& v : x_big) v *= 2e36f;  // direct sums stay below float32's limit (~3.4e38)
  xs.push_back(x_big);
  ws.push_back(wv);
  auto w_inf = wv;
  w_inf[static_cast<std::size_t>((5 * c + 2) * 9 + 4)] = -inf;
  xs.push_back(xv);
  ws.push_back(w_inf);
  const ops::Conv2dOptions options{{1, 1}, {1, 1}, {1, 1}, 1};
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const Tensor x = device_tensor(device(), xs[k], {n, c, h, w});
    const Tensor wt = device_tensor(device(), ws[k], {o, c, 3, 3});
    const Tensor b = device_tensor(device(), bv, {o});
    ops::set_conv2d_winograd(true);
    const Tensor y = ops::conv2d(x, wt, b, options);
    const auto got = y.to_vector<float>();
    auto traced = make_tracer([&](const Tensor& xx) { return ops::conv2d(xx, wt, b, options); },
                              device());
    EXPECT_EQ(testing::float_bits(traced(x)), testing::float_bits(y)) << "case " << k;
    ops::set_conv2d_winograd(false);
    const auto want = ops::conv2d(x, wt, b, options).to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    std::size_t non_finite = 0;
    float largest = 0.0f;
    for (float v : want) {
      if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
    }
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "case " << k << " at " << i;
      ASSERT_EQ(std::isinf(got[i]), std::isinf(want[i])) << "case " << k << " at " << i;
      if (!std::isfinite(want[i])) {
        ++non_finite;
        if (std::isinf(want[i])) {
          EXPECT_EQ(got[i], want[i]) << "case " << k << " at " << i;
        }
        continue;
      }
      EXPECT_NEAR(got[i], want[i], 1e-5 * largest) << "case " << k << " at " << i;
    }
    // An interior infinity reaches the 3x3 outputs around it in every output channel, a NaN in
    // a corner the 2x2 there, an infinite weight its whole output channel; large values none.
    const std::size_t expected[] = {static_cast<std::size_t>(9 * o), static_cast<std::size_t>(4 * o),
                                    0, static_cast<std::size_t>(h * w)};
    EXPECT_EQ(non_finite, expected[k]) << "case " << k;
  }
}

// The Winograd kernel's products run one per thread and its transforms element by element, so
// a device with one kernel thread gives the bits of one with all of them.
TEST(Conv2dWinogradThreads, TheKernelThreadsGiveTheBitsOfOneThread) {
  if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's kernel threads";
  Restore3x3 restore;
  ops::set_conv2d_winograd(true);
  auto split = open_cpu_device(CpuDeviceOptions{.id = DeviceId{13}});
  auto whole = open_cpu_device(CpuDeviceOptions{.id = DeviceId{14}, .kernel_threads = 1});
  const auto xv = testing::random_floats(2 * 48 * 21 * 22, 31);
  const auto wv = testing::random_floats(40 * 48 * 9, 32);
  const auto bv = testing::random_floats(40, 33);
  auto run = [&](Device& device) {
    const Tensor y = ops::conv2d(device_tensor(device, xv, {2, 48, 21, 22}),
                                 device_tensor(device, wv, {40, 48, 3, 3}),
                                 device_tensor(device, bv, {40}), {{1, 1}, {1, 1}, {1, 1}, 1});
    return testing::float_bits(y);
  };
  EXPECT_EQ(run(*split), run(*whole));
}

TEST_F(OpImageTest, PadPlacesTheTensorInsideAConstantFrame) {
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  const Tensor a = device_tensor(device(), v, {2, 3});
  EXPECT_EQ(ops::pad(a, {1, 2}, -1.0).to_vector<float>(),
            (std::vector<float>{-1, 1, 2, 3, -1, -1, -1, 4, 5, 6, -1, -1}));
  const Tensor both = ops::pad(a, {0, 1, 1, 0});
  EXPECT_EQ(both.shape(), (Shape{3, 4}));
  EXPECT_EQ(both.to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 1, 2, 3, 0, 4, 5, 6, 0}));
  EXPECT_EQ(ops::pad(a, std::span<const std::int64_t>{}).to_vector<float>(), v);
  EXPECT_EQ(ops::pad(ops::full({0, 2}, 1.0, device()), {1, 1, 1, 1}).to_vector<float>(),
            std::vector<float>(2 * 4, 0.0f));
  const Tensor ints = device_tensor(device(), v, {6}, DType::int32);
  EXPECT_EQ(ops::pad(ints, {1, 0}, 7.0).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{7, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ops::pad(device_tensor(device(), v, {2, 3}, DType::bfloat16), {1, 0}, 0.5)
                .to_vector<float>()[0],
            0.5f);
}

TEST_F(OpImageTest, InterpolateNearestRepeatsOrSkipsElements) {
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  const Tensor a = device_tensor(device(), v, {1, 2, 3});  // one 2x3 image
  EXPECT_EQ(ops::interpolate_nearest(a, 4, 6).to_vector<float>(),
            (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3,
                                4, 4, 5, 5, 6, 6, 4, 4, 5, 5, 6, 6}));
  EXPECT_EQ(ops::interpolate_nearest(a, 1, 3).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ops::interpolate_nearest(a, 2, 1).to_vector<float>(), (std::vector<float>{1, 4}));
  EXPECT_EQ(ops::interpolate_nearest(a, 6, 3).to_vector<float>(),  // up in H only
            (std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6}));
  // torch's rule, i -> floor(i * in / out), checked on a 4x4 -> 8x2 resize.
  const auto src = testing::random_floats(2 * 4 * 4, 3);
  const Tensor b = device_tensor(device(), src, {2, 4, 4});
  const std::vector<float> got = ops::interpolate_nearest(b, 8, 2).to_vector<float>();
  for (std::int64_t m = 0; m < 2; ++m) {
    for (std::int64_t i = 0; i < 8; ++i) {
      for (std::int64_t j = 0; j < 2; ++j) {
        EXPECT_EQ(got[static_cast<std::size_t>((m * 8 + i) * 2 + j)],
                  src[static_cast<std::size_t>((m * 4 + i * 4 / 8) * 4 + j * 4 / 2)]);
      }
    }
  }
  EXPECT_EQ(ops::interpolate_nearest(ops::full({0, 2, 2}, 1.0, device()), 4, 4).shape(),
            (Shape{0, 4, 4}));
}

// torch's source coordinates (float32 arithmetic, as torch computes them for float inputs;
// checked against torch 2.15's CPU kernels).
// torch's area_pixel_compute_scale: `factor` is interpolate's scale_factor (0: none given).
float torch_scale(std::int64_t in, std::int64_t out, bool aligned, double factor = 0.0) {
  if (aligned) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  if (factor > 0.0) return static_cast<float>(1.0 / factor);
  return static_cast<float>(in) / static_cast<float>(out);
}

// torch's nearest_idx / nearest_exact_idx (only the former copies an unchanged extent and halves
// a doubled one whatever the factor).
std::int64_t torch_nearest(std::int64_t in, std::int64_t out, std::int64_t i, bool exact,
                           double factor = 0.0) {
  if (!exact && in == out) return i;
  if (!exact && out == 2 * in) return i >> 1;
  const float scale = torch_scale(in, out, false, factor);
  const float at = exact ? (static_cast<float>(i) + 0.5f) * scale : static_cast<float>(i) * scale;
  return std::min(static_cast<std::int64_t>(std::floor(at)), in - 1);
}

// The source elements and weights of one output element along one axis.
template <int N>
struct Taps {
  std::int64_t index[N];
  double weight[N];
};

// sum over taps r, q of h.weight[r] * w.weight[q] * x[m, h.index[r], w.index[q]], summed along W
// first (a float64 reference for separable resizing of image m of x).
template <int N>
double separable_sum(const std::vector<double>& x, std::int64_t ih, std::int64_t iw,
                     std::int64_t m, const Taps<N>& h, const Taps<N>& w) {
  double sum = 0;
  for (int r = 0; r < N; ++r) {
    double row = 0;
    for (int q = 0; q < N; ++q) {
      row += w.weight[q] * x[static_cast<std::size_t>((m * ih + h.index[r]) * iw + w.index[q])];
    }
    sum += h.weight[r] * row;
  }
  return sum;
}

// (i0, i1) and (lambda0, lambda1) of torch's upsample_bilinear2d for output i.
Taps<2> torch_linear(std::int64_t in, std::int64_t out, std::int64_t i, bool aligned,
                     double factor = 0.0) {
  if (in == out) return {{i, i}, {1.0, 0.0}};  // whatever the factor, as torch's
  const float scale = torch_scale(in, out, aligned, factor);
  // One rounding of scale * (i + 0.5) - 0.5: torch's kernels compute it as a fused multiply-add.
  float src = aligned ? scale * static_cast<float>(i)
                      : static_cast<float>(static_cast<double>(scale) *
                                               (static_cast<double>(i) + 0.5) -
                                           0.5);
  if (!aligned && src < 0) src = 0;
  const std::int64_t i0 = std::min(static_cast<std::int64_t>(std::floor(src)), in - 1);
  const float l1 = std::clamp(src - static_cast<float>(i0), 0.0f, 1.0f);
  return {{i0, std::min(i0 + 1, in - 1)}, {1.0f - l1, l1}};
}

TEST_F(OpImageTest, InterpolateNearestPicksTorchsElementsForEveryRatio) {
  std::uint64_t salt = 100;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::int32, DType::int64}) {
    for (bool exact : {false, true}) {
      const ops::InterpolateOptions options{
          exact ? ops::InterpolateMode::nearest_exact : ops::InterpolateMode::nearest, false};
      for (std::int64_t ih : {1, 2, 3, 5, 7}) {
        for (std::int64_t oh : {1, 2, 3, 4, 6, 7, 10, 15}) {
          const std::int64_t iw = 1 + (ih * 3 + oh) % 6, ow = 1 + (oh * 5 + ih) % 13;
          std::vector<float> v = testing::random_floats(static_cast<std::size_t>(2 * ih * iw),
                                                        ++salt, -100.0f, 100.0f);
          for (float& x : v) x = std::round(x);
          const Tensor a = device_tensor(device(), v, {2, ih, iw}, dtype);
          const Tensor y = ops::interpolate(a, oh, ow, options);
          ASSERT_EQ(y.shape(), (Shape{2, oh, ow}));
          const std::vector<double> got = y.to_vector<double>();
          for (std::int64_t m = 0; m < 2; ++m) {
            for (std::int64_t i = 0; i < oh; ++i) {
              for (std::int64_t j = 0; j < ow; ++j) {
                const std::int64_t si = torch_nearest(ih, oh, i, exact);
                const std::int64_t sj = torch_nearest(iw, ow, j, exact);
                ASSERT_EQ(got[static_cast<std::size_t>((m * oh + i) * ow + j)],
                          v[static_cast<std::size_t>((m * ih + si) * iw + sj)])
                    << dtype_name(dtype) << " exact " << exact << " " << ih << "x" << iw << " -> " << oh
                    << "x" << ow << " at " << m << "," << i << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

// interpolate_scaled: torch's interpolate(scale_factor=...): floor(in * factor) outputs read
// through 1 / factor (not in / out), so where in * factor is not whole it picks other elements
// and weights than interpolate to the same size does, as torch's kernels do.
TEST_F(OpImageTest, InterpolateByScaleFactorReadsThroughOneOverTheFactor) {
  using M = ops::InterpolateMode;
  std::uint64_t salt = 900;
  for (double factor : {2.0, 1.5, 0.5, 1.09, 2.3, 0.7, 3.0, 0.34}) {
    for (std::int64_t ih : {1, 3, 5, 10}) {
      const std::int64_t iw = 1 + (ih * 7 + static_cast<std::int64_t>(factor * 10)) % 9;
      const auto oh = static_cast<std::int64_t>(std::floor(static_cast<double>(ih) * factor));
      const auto ow = static_cast<std::int64_t>(std::floor(static_cast<double>(iw) * factor));
      const auto v = testing::random_floats(static_cast<std::size_t>(2 * ih * iw), ++salt);
      const Tensor a = device_tensor(device(), v, {2, ih, iw});
      const std::vector<double> x(v.begin(), v.end());
      const std::string where = fmt::format("{}x{} by {}", ih, iw, factor);
      for (bool exact : {false, true}) {
        const Tensor y = ops::interpolate_scaled(a, factor, factor,
                                                 {exact ? M::nearest_exact : M::nearest});
        ASSERT_EQ(y.shape(), (Shape{2, oh, ow})) << where;
        const std::vector<float> got = y.to_vector<float>();
        for (std::int64_t m = 0; m < 2; ++m) {
          for (std::int64_t i = 0; i < oh; ++i) {
            for (std::int64_t j = 0; j < ow; ++j) {
              const std::int64_t si = torch_nearest(ih, oh, i, exact, factor);
              const std::int64_t sj = torch_nearest(iw, ow, j, exact, factor);
              ASSERT_EQ(got[static_cast<std::size_t>((m * oh + i) * ow + j)],
                        v[static_cast<std::size_t>((m * ih + si) * iw + sj)])
                  << where << " exact " << exact << " at " << m << "," << i << "," << j;
            }
          }
        }
      }
      for (bool aligned : {false, true}) {
        const std::vector<double> got =
            ops::interpolate_scaled(a, factor, factor, {M::bilinear, aligned}).to_vector<double>();
        for (std::int64_t m = 0; m < 2; ++m) {
          for (std::int64_t i = 0; i < oh; ++i) {
            for (std::int64_t j = 0; j < ow; ++j) {
              const double want =
                  separable_sum(x, ih, iw, m, torch_linear(ih, oh, i, aligned, factor),
                                torch_linear(iw, ow, j, aligned, factor));
              ASSERT_NEAR(got[static_cast<std::size_t>((m * oh + i) * ow + j)], want, 4e-7)
                  << where << " bilinear, align_corners " << aligned << " at " << m << "," << i
                  << "," << j;
            }
          }
        }
        // align_corners reads through the sizes: the same as interpolate to them.
        if (aligned) {
          EXPECT_EQ(ops::interpolate(a, oh, ow, {M::bilinear, true}).to_vector<float>(),
                    ops::interpolate_scaled(a, factor, factor, {M::bilinear, true})
                        .to_vector<float>())
              << where;
        }
      }
      // area is adaptive pooling to the sizes, as torch's.
      if (oh > 0 && ow > 0) {
        EXPECT_EQ(ops::interpolate(a, oh, ow, {M::area}).to_vector<float>(),
                  ops::interpolate_scaled(a, factor, factor, {M::area}).to_vector<float>())
            << where;
      }
    }
  }
  // recompute_scale_factor: the sizes decide, as interpolate to them.
  const Tensor c = device_tensor(device(), testing::random_floats(5 * 4, 980), {1, 5, 4});
  ops::InterpolateOptions recompute{M::bilinear};
  recompute.recompute_scale_factor = true;
  EXPECT_EQ(ops::interpolate_scaled(c, 1.5, 1.3, recompute).to_vector<float>(),
            ops::interpolate(c, 7, 5, {M::bilinear}).to_vector<float>());
  EXPECT_NE(ops::interpolate_scaled(c, 1.5, 1.3, {M::bilinear}).to_vector<float>(),
            ops::interpolate(c, 7, 5, {M::bilinear}).to_vector<float>());
  // Different factors per dimension; a whole ratio gives interpolate's result.
  const Tensor b = device_tensor(device(), testing::random_floats(2 * 4 * 6, 990), {2, 4, 6});
  EXPECT_EQ(ops::interpolate_scaled(b, 2.0, 0.5, {M::bilinear}).shape(), (Shape{2, 8, 3}));
  EXPECT_EQ(ops::interpolate_scaled(b, 2.0, 0.5, {M::bilinear}).to_vector<float>(),
            ops::interpolate(b, 8, 3, {M::bilinear}).to_vector<float>());
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    EXPECT_RETRACE_ERROR((void)ops::interpolate_scaled(b, 1.0, bad), invalid_argument,
                         "interpolate: scale_factor for the width is");
  }
  EXPECT_RETRACE_ERROR((void)ops::interpolate_scaled(b, 1e30, 1.0), invalid_argument,
                       "interpolate: the height 4 scaled by 1e+30 is too large");
  EXPECT_RETRACE_ERROR((void)ops::interpolate_scaled(ops::full({3}, 1.0, device()), 2.0, 2.0),
                       invalid_argument, "interpolate: a has rank 1");
}

TEST_F(OpImageTest, InterpolateKnownValues) {
  const Tensor a = device_tensor(device(), {1, 2, 3, 4}, {1, 1, 2, 2});
  using M = ops::InterpolateMode;
  EXPECT_EQ(ops::interpolate(a, 4, 4, {M::bilinear}).to_vector<float>(),
            (std::vector<float>{1.0f, 1.25f, 1.75f, 2.0f, 1.5f, 1.75f, 2.25f, 2.5f,  //
                                2.5f, 2.75f, 3.25f, 3.5f, 3.0f, 3.25f, 3.75f, 4.0f}));
  const std::vector<float> aligned = ops::interpolate(a, 4, 4, {M::bilinear, true}).to_vector<float>();
  const double third = 1.0 / 3.0;
  const std::vector<double> want{1, 1 + third, 2 - third, 2,           //
                                 2 - third, 2, 2 + third, 3 - third,  //
                                 2 + third, 3 - third, 3, 3 + third,  //
                                 3, 3 + third, 4 - third, 4};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(aligned[i], want[i], 1e-6) << i;
  EXPECT_EQ(ops::interpolate(a, 3, 3).to_vector<float>(),
            (std::vector<float>{1, 1, 2, 1, 1, 2, 3, 3, 4}));
  EXPECT_EQ(ops::interpolate(a, 3, 3, {M::nearest_exact}).to_vector<float>(),
            (std::vector<float>{1, 2, 2, 3, 4, 4, 3, 4, 4}));
  // Down to one pixel: half-pixel centres read the middle; aligned corners the first element.
  EXPECT_EQ(ops::interpolate(a, 1, 1, {M::bilinear}).to_vector<float>(), std::vector<float>{2.5f});
  EXPECT_EQ(ops::interpolate(a, 1, 1, {M::bilinear, true}).to_vector<float>(),
            std::vector<float>{1.0f});
  // Unchanged sizes copy, infinities and NaN included (no 0 * inf).
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor b = device_tensor(device(), {inf, -inf, 1, 2}, {1, 1, 2, 2});
  const Tensor same = ops::interpolate(b, 2, 2, {M::bilinear});
  EXPECT_NE(same.buffer(), b.buffer());
  EXPECT_EQ(same.to_vector<float>(), (std::vector<float>{inf, -inf, 1, 2}));
  EXPECT_EQ(ops::interpolate(ops::full({0, 3, 2, 2}, 1.0, device()), 5, 5, {M::bilinear}).shape(),
            (Shape{0, 3, 5, 5}));
  EXPECT_EQ(ops::interpolate(a, 0, 3, {M::bilinear}).shape(), (Shape{1, 1, 0, 3}));
}

TEST_F(OpImageTest, InterpolateBilinearMatchesAFloat64Reference) {
  for (bool aligned : {false, true}) {
    expect_resize_matches(
        device(), {ops::InterpolateMode::bilinear, aligned}, {4e-7, 8e-3, 1e-3},
        aligned ? 300 : 400,
        [aligned](const std::vector<double>& x, const ResizeSize& z, std::int64_t m,
                  std::int64_t i, std::int64_t j) {
          return separable_sum(x, z.ih, z.iw, m, torch_linear(z.ih, z.oh, i, aligned),
                               torch_linear(z.iw, z.ow, j, aligned));
        });
  }
}

// The four taps (clamped to the edges) and Keys' weights (A = -0.75) of torch's bicubic for
// output i, in float64 from torch's float32 source position.
// `factor`: interpolate's scale_factor (0: none given); an unchanged extent is copied only
// without one (or with 1), as torch's.
Taps<4> torch_cubic(std::int64_t in, std::int64_t out, std::int64_t i, bool aligned,
                    double factor = 0.0) {
  Taps<4> taps{};
  const float scale = torch_scale(in, out, aligned, factor);
  if (in == out && (factor == 0.0 || scale == 1.0f || aligned)) {
    taps.index[0] = taps.index[1] = taps.index[2] = taps.index[3] = i;
    taps.weight[1] = 1.0;
    return taps;
  }
  const float src = aligned ? scale * static_cast<float>(i)
                            : static_cast<float>(static_cast<double>(scale) *
                                                     (static_cast<double>(i) + 0.5) -
                                                 0.5);  // not clamped at 0
  const double whole = std::floor(static_cast<double>(src)), t = src - whole;
  constexpr double A = -0.75;
  auto near = [](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto far = [](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  const double w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
  for (int j = 0; j < 4; ++j) {
    taps.index[j] = std::clamp(static_cast<std::int64_t>(whole) - 1 + j, std::int64_t{0}, in - 1);
    taps.weight[j] = w[j];
  }
  return taps;
}

TEST_F(OpImageTest, InterpolateBicubicMatchesAFloat64Reference) {
  // float32: the rounding of ~10 products and sums of terms up to ~1.3x the input's range (the
  // cubic's negative lobes overshoot), as torch's own float32 result differs.
  for (bool aligned : {false, true}) {
    expect_resize_matches(
        device(), {ops::InterpolateMode::bicubic, aligned}, {2e-6, 1e-2, 2e-3},
        aligned ? 700 : 800,
        [aligned](const std::vector<double>& x, const ResizeSize& z, std::int64_t m,
                  std::int64_t i, std::int64_t j) {
          return separable_sum(x, z.ih, z.iw, m, torch_cubic(z.ih, z.oh, i, aligned),
                               torch_cubic(z.iw, z.ow, j, aligned));
        });
  }
  // A constant image stays constant within rounding (the weights sum to 1); align_corners with
  // nearest is refused.
  const Tensor ones = ops::full({1, 1, 3, 4}, 2.5, device());
  for (float v : ops::interpolate(ones, 7, 5, {ops::InterpolateMode::bicubic}).to_vector<float>()) {
    EXPECT_NEAR(v, 2.5f, 4e-6f);
  }
  EXPECT_RETRACE_ERROR(
      (void)ops::interpolate(ones, 2, 2, {ops::InterpolateMode::nearest, true}), invalid_argument,
      "interpolate: align_corners applies to modes bilinear and bicubic, not nearest");
  EXPECT_RETRACE_ERROR((void)ops::interpolate(ops::full({1, 2, 2}, 1.0, device(), DType::int32), 3,
                                              3, {ops::InterpolateMode::bicubic}),
                       invalid_argument, "interpolate");
}

// interpolate_scaled with bicubic: through 1 / factor, an unchanged extent resampled too.
TEST_F(OpImageTest, InterpolateBicubicByScaleFactorMatchesAFloat64Reference) {
  std::uint64_t salt = 950;
  for (double factor : {1.5, 0.7, 1.09, 2.0, 0.34}) {
    for (std::int64_t ih : {1, 4, 10}) {
      const std::int64_t iw = 2 + ih % 5;
      const auto oh = static_cast<std::int64_t>(std::floor(static_cast<double>(ih) * factor));
      const auto ow = static_cast<std::int64_t>(std::floor(static_cast<double>(iw) * factor));
      const auto v = testing::random_floats(static_cast<std::size_t>(ih * iw), ++salt);
      const std::vector<double> x(v.begin(), v.end());
      for (bool aligned : {false, true}) {
        const std::vector<double> got =
            ops::interpolate_scaled(device_tensor(device(), v, {1, ih, iw}), factor, factor,
                                    {ops::InterpolateMode::bicubic, aligned})
                .to_vector<double>();
        ASSERT_EQ(got.size(), static_cast<std::size_t>(oh * ow));
        for (std::int64_t i = 0; i < oh; ++i) {
          for (std::int64_t j = 0; j < ow; ++j) {
            ASSERT_NEAR(got[static_cast<std::size_t>(i * ow + j)],
                        separable_sum(x, ih, iw, 0, torch_cubic(ih, oh, i, aligned, factor),
                                      torch_cubic(iw, ow, j, aligned, factor)),
                        2e-6)
                << ih << "x" << iw << " by " << factor << ", align_corners " << aligned
                << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST_F(OpImageTest, InterpolateAreaAveragesTorchsWindows) {
  expect_resize_matches(
      device(), {ops::InterpolateMode::area}, {4e-7, 8e-3, 1e-3}, 900,
      [](const std::vector<double>& x, const ResizeSize& z, std::int64_t m, std::int64_t i,
         std::int64_t j) {
        const std::int64_t h0 = i * z.ih / z.oh, h1 = ((i + 1) * z.ih + z.oh - 1) / z.oh;
        const std::int64_t w0 = j * z.iw / z.ow, w1 = ((j + 1) * z.iw + z.ow - 1) / z.ow;
        double sum = 0;
        for (std::int64_t r = h0; r < h1; ++r) {
          for (std::int64_t q = w0; q < w1; ++q) {
            sum += x[static_cast<std::size_t>((m * z.ih + r) * z.iw + q)];
          }
        }
        return sum / static_cast<double>((h1 - h0) * (w1 - w0));
      });
  // An infinity stays in its own windows (no inf * 0 elsewhere); align_corners is refused.
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor b = device_tensor(device(), {inf, 1, 2, 3, 4, 5}, {1, 1, 1, 6});
  EXPECT_EQ(ops::interpolate(b, 1, 3, {ops::InterpolateMode::area}).to_vector<float>(),
            (std::vector<float>{inf, 2.5f, 4.5f}));
  EXPECT_RETRACE_ERROR((void)ops::interpolate(b, 1, 3, {ops::InterpolateMode::area, true}),
                       invalid_argument, "align_corners applies to modes bilinear and bicubic");
}

TEST_F(OpImageTest, InterpolateTracedEqualsEagerBitForBit) {
  using M = ops::InterpolateMode;
  auto f = [&](const Tensor& x) {
    const Tensor a = ops::interpolate(x, 11, 7, {M::bilinear});
    const Tensor b = ops::interpolate(a, 5, 9, {M::bilinear, true});
    const Tensor c = ops::add(ops::interpolate(b, 3, 4), ops::interpolate(b, 3, 4, {M::nearest_exact}));
    return ops::add(ops::add(ops::interpolate(c, 6, 6, {M::bicubic}),
                             ops::interpolate(c, 6, 6, {M::bicubic, true})),
                    ops::interpolate(x, 6, 6, {M::area}));
  };
  testing::expect_traced_equals_eager(device(), f, Shape{2, 3, 6, 5}, 40);
}

TEST_F(OpImageTest, TracedEqualsEagerBitForBit) {
  const Tensor w = device_tensor(device(), testing::random_floats(8 * 4 * 9, 1), {8, 4, 3, 3});
  const Tensor bias = device_tensor(device(), testing::random_floats(8, 2), {8});
  // A VAE decoder's upsampling block: nearest 2x, padded 3x3 convolution, silu.
  auto f = [&](const Tensor& x) {
    const Tensor up = ops::interpolate_nearest(x, x.shape()[2] * 2, x.shape()[3] * 2);
    return ops::silu(ops::conv2d(ops::pad(up, {1, 1, 1, 1}), w, bias));
  };
  testing::expect_traced_equals_eager(device(), f, Shape{2, 4, 5, 5}, 10);
}

using testing::expect_error;

TEST_F(OpImageTest, BadInputIsRefusedWithTheOpsName) {
  const Tensor x = ops::full({1, 4, 5, 5}, 1.0, device());
  const Tensor w = ops::full({2, 3, 3, 3}, 1.0, device());
  const auto E = ErrorCategory::invalid_argument;
  expect_error([&] { (void)ops::conv2d(x, w); }, E, "conv2d: weight [2, 3, 3, 3] expects 3 input channels");
  expect_error([&] { (void)ops::conv2d(x, ops::full({2, 4, 7, 7}, 1.0, device())); }, E,
               "conv2d: the kernel spans 7x7");
  expect_error([&] { (void)ops::conv2d(x, ops::full({3, 2, 3, 3}, 1.0, device()), {},
                                       {{1, 1}, {0, 0}, {1, 1}, 2}); },
               E, "conv2d: 4 input and 3 output channels do not split into 2 groups");
  expect_error([&] { (void)ops::conv2d(x, ops::full({2, 4, 3, 3}, 1.0, device()), {},
                                       {{0, 1}, {0, 0}, {1, 1}, 1}); },
               E, "conv2d: stride (0, 1) must be >= 1");
  expect_error([&] { (void)ops::conv2d(ops::full({4, 5, 5}, 1.0, device()), w); }, E,
               "conv2d: x has shape [4, 5, 5]");
  expect_error([&] { (void)ops::conv2d(x, ops::full({2, 4, 3, 3}, 1.0, device()),
                                       ops::full({3}, 1.0, device())); },
               E, "conv2d: bias is [3] float32; expected [2] float32");
  // A bias left on the host, at a shape the Winograd kernel would take.
  expect_error([&] { (void)ops::conv2d(ops::full({1, 16, 8, 8}, 1.0, device()),
                                       ops::full({16, 16, 3, 3}, 1.0, device()),
                                       Tensor::from_vector<float>(std::vector<float>(16, 1.0f), Shape{16},
                                                                  DType::float32),
                                       {{1, 1}, {1, 1}, {1, 1}, 1}); },
               E, "conv2d");
  expect_error([&] { (void)ops::pad(x, {1}); }, E, "pad: 1 padding values");
  expect_error([&] { (void)ops::pad(x, {-1, 0}); }, E, "pad: padding of dimension 3 is (-1, 0)");
  expect_error([&] { (void)ops::pad(ops::full({3}, 1.0, device(), DType::int32), {1, 1}, 0.5); },
               E, "pad");
  expect_error([&] { (void)ops::interpolate_nearest(x, -1, 5); }, E,
               "interpolate_nearest: output height is -1");
  expect_error([&] { (void)ops::interpolate(x, 7, 5, {ops::InterpolateMode::nearest, true}); }, E,
               "interpolate: align_corners applies to modes bilinear and bicubic, not nearest");
  expect_error([&] { (void)ops::interpolate(ops::full({1, 1, 2, 2}, 1.0, device(), DType::int32),
                                            3, 3, {ops::InterpolateMode::bilinear}); },
               E, "interpolate");
  expect_error([&] { (void)ops::interpolate(ops::full({1, 0, 2}, 1.0, device()), 3, 3); }, E,
               "interpolate: cannot resize an empty height of 0 to 3");
  expect_error([&] { (void)ops::interpolate_nearest(ops::full({5}, 1.0, device()), 2, 2); }, E,
               "interpolate_nearest: a has rank 1");
}

}  // namespace
}  // namespace retrace
