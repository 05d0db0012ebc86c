// On AVX-512 the softmax rows and the float unary loops of exp, sigmoid, silu and gelu_tanh run
// 16 lanes at a time (vector_exp16, with vscalefps); a loop's tail, the other dtypes and the
// other variants use the per-element forms. They must agree bit for bit, or a result would
// depend on where an element falls in a loop. Checked on every variant this CPU runs that has
// the 16-lane forms: all float bit patterns near the clamps, the overflow and subnormal
// thresholds and zero, and every 251st pattern over all 2^32.
#include "cpu/isa.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#define RETRACE_CPU_VARIANT_ROW(entry, name, march)                                       \
  extern "C" std::int64_t entry(int, std::uint32_t, std::uint32_t, std::uint64_t,          \
                                std::uint32_t*, float*, float*) noexcept;
#include "retrace_test_exp_lanes_variants.inc"
#undef RETRACE_CPU_VARIANT_ROW

namespace {

struct Row {
  std::string_view name;
  std::int64_t (*entry)(int, std::uint32_t, std::uint32_t, std::uint64_t, std::uint32_t*,
                        float*, float*) noexcept;
};
constexpr Row kRows[] = {
#define RETRACE_CPU_VARIANT_ROW(entry, name, march) {name, &entry},
#include "retrace_test_exp_lanes_variants.inc"
#undef RETRACE_CPU_VARIANT_ROW
};

TEST(ExpLanesTest, SixteenLaneFormsMatchThePerElementFormsBitForBit) {
  int checked = 0;
  for (const Row& row : kRows) {
    const std::string why = retrace::cpu::unsupported_reason(row.name, retrace::cpu::this_cpu());
    if (!why.empty()) continue;  // this CPU cannot run the variant
    struct Range {
      std::uint32_t first, step;
      std::uint64_t count;
    };
    std::vector<Range> ranges{{0u, 251u, (std::uint64_t{1} << 32) / 251}};
    // 2^16 consecutive patterns on each side of: the clamps (-104, 89), where exp leaves the
    // float range (88.72) and the normal range (-87.34), the subnormal end (-103.28), 0, +-inf.
    for (float edge : {-104.0f, 89.0f, 88.7228391f, -87.3365448f, -103.278929f, 0.0f, -0.0f,
                       1e-30f, -1e-30f, std::bit_cast<float>(0x7f800000u),
                       std::bit_cast<float>(0xff800000u)}) {
      ranges.push_back({std::bit_cast<std::uint32_t>(edge) - (1u << 16), 1u, 1u << 17});
    }
    constexpr const char* kOps[] = {"exp", "sigmoid", "silu", "gelu_tanh"};
    for (int op = 0; op < 4; ++op) {
      for (const Range& r : ranges) {
        std::uint32_t input = 0;
        float scalar = 0, lanes = 0;
        const std::int64_t differ =
            row.entry(op, r.first, r.step, r.count, &input, &scalar, &lanes);
        if (differ == -1) break;  // no 16-lane forms in this variant
        EXPECT_EQ(differ, 0) << row.name << " " << kOps[op] << ": first at input bits 0x"
                             << std::hex << input << std::dec << " ("
                             << std::bit_cast<float>(input) << "): per element " << scalar
                             << ", 16 lanes " << lanes;
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no kernel variant with the 16-lane forms runs on this CPU";
}

// The bfloat16 loops round their float32 results in blocks (vectorised on AVX2 and AVX-512
// variants, by vcvtneps2bf16 where the CPU has AVX512-BF16): the same bits as
// bfloat16::from_float on every float, NaN, infinity and subnormals included.
TEST(ExpLanesTest, BlockRoundingToBFloat16MatchesFromFloat) {
  int checked = 0;
  for (const Row& row : kRows) {
    if (!retrace::cpu::unsupported_reason(row.name, retrace::cpu::this_cpu()).empty()) continue;
    struct Range {
      std::uint32_t first, step;
      std::uint64_t count;
    };
    std::vector<Range> ranges{{0u, 97u, (std::uint64_t{1} << 32) / 97}};
    // Around ties, the largest finite floats, infinities, NaNs and zeros of both signs.
    for (std::uint32_t edge : {0x3f808000u, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                               0xffc00001u, 0x00000000u, 0x80000000u, 0x00008000u, 0x00800000u,
                               0x80800000u}) {
      ranges.push_back({edge - (1u << 14), 1u, 1u << 15});
    }
    for (const Range& r : ranges) {
      std::uint32_t input = 0;
      float want = 0, got = 0;
      EXPECT_EQ(row.entry(4, r.first, r.step, r.count, &input, &want, &got), 0)
          << row.name << ": first at input bits 0x" << std::hex << input << std::dec
          << ": from_float " << want << ", block " << got;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
