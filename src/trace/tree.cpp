#include "retrace/tree.hpp"

#include <fmt/ranges.h>

#include <algorithm>

namespace retrace {

std::string TreePath::to_string() const {
  std::vector<const TreePath*> chain;
  for (const TreePath* node = this; node != nullptr; node = node->parent) chain.push_back(node);
  std::string out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const TreePath& node = **it;
    switch (node.kind) {
      case Kind::root: out += node.name; break;
      case Kind::index: out += fmt::format("[{}]", node.index); break;
      case Kind::key: out += fmt::format("[\"{}\"]", node.name); break;
      case Kind::field: out += fmt::format(".{}", node.name); break;
      case Kind::literal: out += fmt::format("[{}]", node.name); break;
    }
  }
  return out;
}

std::string TreePath::describe() const {
  const TreePath* root = this;
  while (root->parent != nullptr) root = root->parent;
  return root->role.empty() ? to_string() : fmt::format("{} {}", root->role, to_string());
}

void throw_tree_error(const TreePath& path, std::string_view what) {
  RETRACE_FAIL(invalid_argument, "{}: {}", path.describe(), what);
}

namespace detail {

std::string_view field_name(std::string_view names, std::size_t index) noexcept {
  std::size_t start = 0;
  for (std::size_t i = 0; i < index; ++i) {
    const std::size_t comma = names.find(',', start);
    if (comma == std::string_view::npos) return "?";
    start = comma + 1;
  }
  std::string_view name = names.substr(start, names.find(',', start) - start);
  while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
  while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
  return name;
}

std::string describe_keys(const std::vector<std::string_view>& keys) {
  std::vector<std::string_view> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  return fmt::format("{{{}}}", fmt::join(sorted, ", "));
}

}  // namespace detail
}  // namespace retrace
