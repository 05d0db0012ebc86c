// Automatic trace keys: the signature of equal inputs is equal (whatever an unordered_map's
// iteration order), a NaN scalar matches NaN, and containers without tensor leaves count.
#include "support.hpp"

#include <map>
#include <unordered_map>

namespace retrace {
namespace {

using Extras = std::map<std::string, std::vector<Tensor>>;

Tensor with_extras(const Tensor& x, const Extras& extras) {
  Tensor out = ops::mul(x, 1.0);
  for (const auto& [name, tensors] : extras) {
    for (const Tensor& t : tensors) out = ops::add(out, t);
  }
  return out;
}

Tensor with_table(const Tensor& x, const std::unordered_map<std::string, double>& table) {
  double total = 0.0;
  for (const auto& [key, value] : table) total += value;
  return ops::add(x, total);
}

Tensor shifted(const Tensor& x, double shift) { return ops::add(x, shift); }

TEST(SignatureTest, UnorderedMapsWithEqualContentsHaveEqualSignatures) {
  std::unordered_map<std::string, double> a, b(64);
  const std::vector<std::string> keys{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"};
  for (const auto& k : keys) a.emplace(k, 1.0);
  for (auto it = keys.rbegin(); it != keys.rend(); ++it) b.emplace(*it, 1.0);
  const InputSignature sa = make_signature(nullptr, {}, a);
  const InputSignature sb = make_signature(nullptr, {}, b);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(sa.hash, sb.hash);
}

TEST(SignatureTest, NaNMatchesNaNAndZeroMatchesNegativeZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(make_signature(nullptr, {}, nan), make_signature(nullptr, {}, -nan));
  EXPECT_EQ(make_signature(nullptr, {}, nan).hash, make_signature(nullptr, {}, -nan).hash);
  EXPECT_EQ(make_signature(nullptr, {}, 0.0), make_signature(nullptr, {}, -0.0));
  EXPECT_EQ(make_signature(nullptr, {}, 0.0).hash, make_signature(nullptr, {}, -0.0).hash);
  EXPECT_FALSE(make_signature(nullptr, {}, nan) == make_signature(nullptr, {}, 1.0));
}

TEST(SignatureTest, ContainersWithoutLeavesCount) {
  const std::vector<Tensor> none;
  EXPECT_FALSE(make_signature(nullptr, {}, Extras{{"a", {}}}) ==
               make_signature(nullptr, {}, Extras{{"b", {}}}));
  EXPECT_FALSE(make_signature(nullptr, {}, Extras{}) == make_signature(nullptr, {}, Extras{{"a", {}}}));
  EXPECT_FALSE(make_signature(nullptr, {}, std::vector<std::vector<Tensor>>{}) ==
               make_signature(nullptr, {}, std::vector<std::vector<Tensor>>{{}}));
  EXPECT_FALSE(make_signature(nullptr, {}, std::optional<std::vector<Tensor>>{}) ==
               make_signature(nullptr, {}, std::optional<std::vector<Tensor>>{none}));
  EXPECT_EQ(make_signature(nullptr, {}, Extras{{"a", {}}}),
            make_signature(nullptr, {}, Extras{{"a", {}}}));
}

using AutoKeyTest = testing::DeviceTest;

TEST_F(AutoKeyTest, UnorderedMapInsertionOrderReusesTheTrace) {
  auto traced = traced_function_injected(with_table, {.auto_key = true});
  Tensor x = ops::full({4}, 1.0, device());
  std::unordered_map<std::string, double> a, b(128);
  for (int i = 0; i < 12; ++i) a.emplace(fmt::format("k{}", i), 0.5);
  for (int i = 11; i >= 0; --i) b.emplace(fmt::format("k{}", i), 0.5);
  EXPECT_EQ(traced(device(), x, a).to_vector<float>(), std::vector<float>(4, 7.0f));
  EXPECT_EQ(traced(device(), x, b).to_vector<float>(), std::vector<float>(4, 7.0f));
  EXPECT_EQ(traced.stats().captures, 1u);
  EXPECT_EQ(traced.stats().replays, 1u);
}

TEST_F(AutoKeyTest, NaNScalarReusesItsTrace) {
  auto traced = traced_function_injected(shifted, {.auto_key = true});
  Tensor x = ops::full({4}, 1.0, device());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  (void)traced(device(), x, nan);
  const std::vector<float> out = traced(device(), x, nan).to_vector<float>();
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(traced.stats().captures, 1u);
  EXPECT_EQ(traced.stats().replays, 1u);
}

TEST_F(AutoKeyTest, ANewStructureWithoutLeavesCapturesInsteadOfFailing) {
  auto traced = traced_function_injected(with_extras, {.auto_key = true});
  Tensor x = ops::full({4}, 1.0, device());
  EXPECT_EQ(traced(device(), x, Extras{{"a", {}}}).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(traced(device(), x, Extras{{"b", {}}}).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(traced(device(), x, Extras{}).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(traced(device(), x, Extras{{"a", {}}}).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(traced.stats().captures, 3u);
  EXPECT_EQ(traced.stats().replays, 1u);
}

}  // namespace
}  // namespace retrace
