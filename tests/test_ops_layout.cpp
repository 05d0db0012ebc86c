// stack, expand, repeat and flip against references computed here (index arithmetic on the
// host), in every dtype class (float32, bfloat16, float16, int32, int64), with empty and
// size-1 dimensions; traced == eager bit for bit; errors that name the op.
#include "support.hpp"

#include <bit>
#include <numeric>

namespace retrace {
namespace {

using testing::device_tensor;

class OpLayoutTest : public testing::DeviceTest {};

// Row-major multi-index of `flat` in `shape`.
std::vector<std::int64_t> unflatten(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.rank());
  for (auto d = static_cast<std::int64_t>(shape.rank()) - 1; d >= 0; --d) {
    idx[static_cast<std::size_t>(d)] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::int64_t flatten(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) flat = flat * shape.dims()[d] + idx[d];
  return flat;
}

std::vector<float> iota_values(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

constexpr DType kDTypes[] = {DType::float32, DType::bfloat16, DType::float16, DType::int32,
                             DType::int64};

TEST_F(OpLayoutTest, ExpandBroadcastsExtentsOfOne) {
  for (DType dtype : kDTypes) {
    for (const auto& [from, to] : std::vector<std::pair<Shape, std::vector<std::int64_t>>>{
             {Shape{3, 1}, {3, 4}},
             {Shape{1, 4}, {2, 5, -1}},
             {Shape{1}, {0}},
             {Shape{2, 1, 3}, {2, 0, 3}},
             {Shape{}, {2, 3}},
             {Shape{1, 1}, {1, 1}}}) {
      const std::vector<float> v = iota_values(from.numel());
      const Tensor y = ops::expand(device_tensor(device(), v, from, dtype), to);
      std::vector<std::int64_t> want_dims = to;
      const std::size_t lead = to.size() - from.rank();
      for (std::size_t i = lead; i < to.size(); ++i) {
        if (to[i] == -1) want_dims[i] = from.dims()[i - lead];
      }
      const Shape want_shape{std::span<const std::int64_t>(want_dims)};
      ASSERT_EQ(y.shape(), want_shape) << dtype_name(dtype);
      const std::vector<float> got = y.to_vector<float>();
      for (std::int64_t i = 0; i < want_shape.numel(); ++i) {
        std::vector<std::int64_t> idx = unflatten(i, want_shape);
        std::vector<std::int64_t> src(idx.begin() + static_cast<std::ptrdiff_t>(lead), idx.end());
        for (std::size_t d = 0; d < src.size(); ++d) {
          if (from.dims()[d] == 1) src[d] = 0;
        }
        ASSERT_EQ(got[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(flatten(src, from))])
            << dtype_name(dtype) << " " << from.to_string() << " at " << i;
      }
    }
  }
}

TEST_F(OpLayoutTest, RepeatTilesAsTorch) {
  // torch.tensor([[1, 2], [3, 4]]).repeat(2, 3) and with a new leading dimension.
  const Tensor a = device_tensor(device(), {1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(ops::repeat(a, {2, 3}).to_vector<float>(),
            (std::vector<float>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,
                                1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  EXPECT_EQ(ops::repeat(a, {2, 1, 1}).shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(ops::repeat(a, {2, 1, 1}).to_vector<float>(),
            (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(ops::repeat(a, {0, 2}).shape(), (Shape{0, 4}));
  for (DType dtype : kDTypes) {
    const Shape from{2, 1, 3};
    const std::vector<float> v = iota_values(from.numel());
    const std::vector<std::int64_t> reps{2, 3, 4, 1};
    const Tensor y = ops::repeat(device_tensor(device(), v, from, dtype), reps);
    const Shape want{2, 6, 4, 3};
    ASSERT_EQ(y.shape(), want);
    const std::vector<float> got = y.to_vector<float>();
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      const std::vector<std::int64_t> idx = unflatten(i, want);
      const std::vector<std::int64_t> src{idx[1] % 2, idx[2] % 1, idx[3] % 3};
      ASSERT_EQ(got[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(flatten(src, from))])
          << dtype_name(dtype) << " at " << i;
    }
  }
}

TEST_F(OpLayoutTest, FlipReversesTheGivenDimensions) {
  const Tensor a = device_tensor(device(), {1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(ops::flip(a, {0}).to_vector<float>(), (std::vector<float>{4, 5, 6, 1, 2, 3}));
  EXPECT_EQ(ops::flip(a, {-1}).to_vector<float>(), (std::vector<float>{3, 2, 1, 6, 5, 4}));
  EXPECT_EQ(ops::flip(a, {0, 1}).to_vector<float>(), (std::vector<float>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(ops::flip(a, std::span<const std::int64_t>{}).to_vector<float>(),
            (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ops::flip(ops::full({0, 3}, 1.0, device()), {0, 1}).shape(), (Shape{0, 3}));
  for (DType dtype : kDTypes) {
    const Shape shape{3, 1, 4, 5};
    const std::vector<float> v = iota_values(shape.numel());
    const std::vector<float> got =
        ops::flip(device_tensor(device(), v, shape, dtype), {2, 0, 1}).to_vector<float>();
    for (std::int64_t i = 0; i < shape.numel(); ++i) {
      std::vector<std::int64_t> idx = unflatten(i, shape);
      idx[0] = 2 - idx[0];
      idx[2] = 3 - idx[2];
      ASSERT_EQ(got[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(flatten(idx, shape))])
          << dtype_name(dtype) << " at " << i;
    }
  }
}

TEST_F(OpLayoutTest, StackAddsADimension) {
  const Tensor a = device_tensor(device(), {1, 2, 3}, {3});
  const Tensor b = device_tensor(device(), {4, 5, 6}, {3});
  const std::vector<Tensor> both{a, b};
  EXPECT_EQ(ops::stack(both, 0).shape(), (Shape{2, 3}));
  EXPECT_EQ(ops::stack(both, 0).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ops::stack(both, 1).shape(), (Shape{3, 2}));
  EXPECT_EQ(ops::stack(both, -1).to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const std::vector<Tensor> one{a};
  EXPECT_EQ(ops::stack(one, 0).shape(), (Shape{1, 3}));
  const std::vector<Tensor> scalars{ops::full({}, 2.0, device()), ops::full({}, 3.0, device())};
  EXPECT_EQ(ops::stack(scalars, 0).to_vector<float>(), (std::vector<float>{2, 3}));
  const std::vector<Tensor> empties{ops::full({0, 2}, 1.0, device()),
                                    ops::full({0, 2}, 1.0, device())};
  EXPECT_EQ(ops::stack(empties, 1).shape(), (Shape{0, 2, 2}));
}

TEST_F(OpLayoutTest, TracedEqualsEagerBitForBit) {
  auto f = [&](const Tensor& x) {
    const Tensor e = ops::expand(ops::reshape(x, {1, 4, 1, 6}), {3, 4, 2, 6});
    const Tensor r = ops::repeat(ops::flip(x, {0, 1}), {3, 2, 1});
    const std::vector<Tensor> parts{ops::reshape(e, {3, 8, 6}), r};
    return ops::stack(parts, 1);
  };
  testing::expect_traced_equals_eager(device(), f, Shape{4, 6}, 60);
}

TEST_F(OpLayoutTest, ErrorsNameTheOp) {
  const Tensor a = ops::full({2, 3}, 1.0, device());
  EXPECT_RETRACE_ERROR((void)ops::expand(a, {4, 3}), invalid_argument,
                       "expand: dimension 0 of [2, 3] has extent 2; only extent 1 expands (to 4)");
  EXPECT_RETRACE_ERROR((void)ops::expand(a, {3}), invalid_argument,
                       "expand: 1 extents given for a tensor of rank 2");
  EXPECT_RETRACE_ERROR((void)ops::expand(a, {-1, 2, 3}), invalid_argument,
                       "expand: new leading dimension 0 is -1");
  EXPECT_RETRACE_ERROR((void)ops::expand(a, {1, 1, 1, 1, 1, 1, 1, 2, 3}), invalid_argument,
                       "expand: the result would have rank 9");
  EXPECT_RETRACE_ERROR((void)ops::repeat(a, {2}), invalid_argument,
                       "repeat: 1 repeats given for a tensor of rank 2");
  EXPECT_RETRACE_ERROR((void)ops::repeat(a, {-1, 2}), invalid_argument,
                       "repeat: repeats[0] is -1");
  EXPECT_RETRACE_ERROR((void)ops::repeat(a, {INT64_MAX / 2, 2}), invalid_argument,
                       "repeat: the result's shape");
  EXPECT_RETRACE_ERROR((void)ops::repeat(a, {INT64_MAX, 1}), invalid_argument,
                       "repeat: dimension 0 of extent 2 repeated 9223372036854775807 times "
                       "overflows");
  EXPECT_RETRACE_ERROR((void)ops::flip(a, {1, -1}), invalid_argument,
                       "flip: dimension 1 appears twice");
  EXPECT_RETRACE_ERROR((void)ops::flip(a, {2}), invalid_argument, "flip");
  const std::vector<Tensor> mixed{a, ops::full({3, 2}, 1.0, device())};
  EXPECT_RETRACE_ERROR((void)ops::stack(mixed, 0), invalid_argument,
                       "stack: tensors[1] is [3, 2] float32; tensors[0] is [2, 3] float32");
  EXPECT_RETRACE_ERROR((void)ops::stack(std::span<const Tensor>{}, 0), invalid_argument,
                       "stack: no tensors given");
  const std::vector<Tensor> two{a, a};
  EXPECT_RETRACE_ERROR((void)ops::stack(two, 3), invalid_argument, "stack");
  EXPECT_RETRACE_ERROR((void)ops::expand(Tensor{}, {1}), invalid_argument,
                       "expand: a is a null tensor");
}

}  // namespace
}  // namespace retrace
