// Input/output trees: lockstep traversal, structure checks and path labels.
#include "support.hpp"

#include <map>
#include <optional>
#include <unordered_map>

namespace retrace_tree_test {

struct Conditioning {
  retrace::Tensor embedding;
  std::vector<float> weights;
  std::optional<std::string> label;
};
RETRACE_FIELDS(Conditioning, embedding, weights, label)

}  // namespace retrace_tree_test

namespace retrace {
namespace {

using retrace_tree_test::Conditioning;

TEST(TreePathTest, FormatsIndicesKeysAndFields) {
  const TreePath root = TreePath::root("args", "input");
  const TreePath a = root.at(1);
  const TreePath b = a.key("latents");
  const TreePath c = b.at(2);
  const TreePath d = c.field("weights");
  EXPECT_EQ(c.to_string(), "args[1][\"latents\"][2]");
  EXPECT_EQ(d.to_string(), "args[1][\"latents\"][2].weights");
  EXPECT_EQ(c.describe(), "input args[1][\"latents\"][2]");
}

TEST(TreeTest, VisitsEveryLeafInOrderWithPaths) {
  using Tree = std::tuple<int, std::vector<float>, std::map<std::string, std::string>,
                          std::optional<bool>, std::pair<None, double>, std::array<int, 2>>;
  Tree tree{1, {2.0f, 3.0f}, {{"b", "x"}, {"a", "y"}}, true, {none, 4.5}, {6, 7}};
  std::vector<std::string> seen;
  visit_leaves(
      [&](const TreePath& path, const auto& leaf) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        if constexpr (std::is_same_v<L, None>) {
          seen.push_back(path.to_string() + "=none");
        } else {
          seen.push_back(fmt::format("{}={}", path.to_string(), leaf));
        }
      },
      TreePath::root("t", ""), tree);
  EXPECT_EQ(seen, (std::vector<std::string>{"t[0]=1", "t[1][0]=2", "t[1][1]=3", "t[2][\"a\"]=y",
                                            "t[2][\"b\"]=x", "t[3]=true", "t[4][0]=none",
                                            "t[4][1]=4.5", "t[5][0]=6", "t[5][1]=7"}));
}

TEST(TreeTest, StructFieldsAreVisitedByName) {
  Conditioning a{Tensor(), {1.0f, 2.0f}, std::string("cat")};
  Conditioning b{Tensor(), {3.0f, 4.0f}, std::string("dog")};
  std::vector<std::string> seen;
  visit_leaves(
      [&](const TreePath& path, const auto& x, const auto& y) {
        using L = std::remove_cvref_t<decltype(x)>;
        if constexpr (std::is_same_v<L, Tensor>) {
          seen.push_back(path.to_string() + " tensor");
        } else {
          seen.push_back(fmt::format("{} {}/{}", path.to_string(), x, y));
        }
      },
      TreePath::root("args", "input").at(0), a, b);
  EXPECT_EQ(seen, (std::vector<std::string>{"args[0].embedding tensor", "args[0].weights[0] 1/3",
                                            "args[0].weights[1] 2/4", "args[0].label cat/dog"}));
}

TEST(TreeTest, StructureMismatchesNameThePath) {
  auto noop = [](const TreePath&, const auto&, const auto&) {};
  const TreePath root = TreePath::root("args", "input");
  std::vector<int> v3{1, 2, 3}, v2{1, 2};
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root.at(0), v3, v2), invalid_argument,
                       "input args[0]: has 2 elements, expected 3");
  std::map<std::string, int> m1{{"a", 1}, {"b", 2}}, m2{{"a", 1}, {"c", 2}};
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root.at(1), m1, m2), invalid_argument,
                       "input args[1]: keys {a, c} do not match the expected keys {a, b}");
  std::unordered_map<std::string, int> u1{{"a", 1}}, u2{};
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root, u1, u2), invalid_argument,
                       "keys {} do not match the expected keys {a}");
  std::optional<int> some = 1, empty;
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root.at(2), some, empty), invalid_argument,
                       "input args[2]: is empty, expected a value");
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root.at(2), empty, some), invalid_argument,
                       "has a value, expected none");
  Conditioning a{Tensor(), {1.0f}, std::nullopt}, b{Tensor(), {1.0f, 2.0f}, std::nullopt};
  EXPECT_RETRACE_ERROR(visit_leaves(noop, root.at(3), a, b), invalid_argument,
                       "input args[3].weights: has 2 elements, expected 1");
}

}  // namespace
}  // namespace retrace
