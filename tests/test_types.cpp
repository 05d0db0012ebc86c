// Unit tests for the core value types: DType table, bfloat16, Shape, strong ids, Error.
#include "support.hpp"

#include <cmath>
#include <limits>

namespace retrace {
namespace {

TEST(DTypeTest, TableGivesNamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::float32), 4u);
  EXPECT_EQ(dtype_size(DType::bfloat16), 2u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::uint32), 4u);
  EXPECT_EQ(dtype_size(DType::uint8), 1u);
  EXPECT_EQ(dtype_name(DType::bfloat16), "bfloat16");
  for (const DTypeInfo& info : kDTypeTable) EXPECT_EQ(dtype_info(info.dtype).name, info.name);
  EXPECT_EQ(fmt::format("{}", DType::int32), "int32");
  EXPECT_EQ(fmt::format("{}", Layout::tile), "tile");
}

TEST(BFloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(bfloat16::from_float(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bfloat16 values: ties go to the even one (1.0).
  EXPECT_EQ(bfloat16::from_float(1.00390625f).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway too: rounds up to the even neighbour.
  EXPECT_EQ(bfloat16::from_float(1.01171875f).bits, 0x3f82);
  EXPECT_EQ(bfloat16::from_float(-2.5f).to_float(), -2.5f);
  EXPECT_TRUE(std::isinf(bfloat16::from_float(std::numeric_limits<float>::infinity()).to_float()));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(bfloat16::from_float(nan).to_float()));
  // A NaN whose payload sits only in the low bits must not turn into infinity.
  const float low_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bfloat16::from_float(low_nan).to_float()));
}

TEST(ShapeTest, BasicsAndPrinting) {
  Shape s{1, 32, 64};
  EXPECT_EQ(s.rank(), 3u);
  EXPECT_EQ(s.numel(), 2048);
  EXPECT_EQ(s[-1], 64);
  EXPECT_EQ(s[0], 1);
  EXPECT_EQ(s.to_string(), "[1, 32, 64]");
  EXPECT_EQ(fmt::format("{}", s), "[1, 32, 64]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(Shape{}.to_string(), "[]");
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{2, 3}), (Shape{2, 3, 1}));
}

TEST(ShapeTest, RejectsBadShapes) {
  EXPECT_RETRACE_ERROR((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), invalid_argument,
                       "rank 9, more than the maximum rank 8");
  EXPECT_RETRACE_ERROR((Shape{2, -1}), invalid_argument, "negative extent at axis 1");
  Shape s{4, 5};
  EXPECT_RETRACE_ERROR((void)s[2], invalid_argument, "axis 2 is out of range for shape [4, 5]");
  EXPECT_RETRACE_ERROR((void)s[-3], invalid_argument, "out of range");
}

TEST(StrongIdTest, DistinctTypesCompareAndFormat) {
  static_assert(!std::is_convertible_v<QueueId, TraceId>);
  static_assert(!std::is_convertible_v<std::uint32_t, QueueId>);
  EXPECT_LT(TraceId{1}, TraceId{2});
  EXPECT_EQ(QueueId{1}, QueueId{1});
  EXPECT_EQ(fmt::format("{}", TraceId{7}), "7");
}

TEST(ErrorTest, CarriesCategoryMessageAndLocation) {
  try {
    RETRACE_FAIL(capture_violation, "reading {} during capture", "x");
    FAIL() << "did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::capture_violation);
    EXPECT_EQ(e.message(), "reading x during capture");
    EXPECT_STREQ(e.what(), "capture violation: reading x during capture");
    EXPECT_NE(e.raised_at().find("test_types.cpp:"), std::string::npos);
  }
  EXPECT_EQ(category_name(ErrorCategory::out_of_memory), "out of memory");
}

}  // namespace
}  // namespace retrace
