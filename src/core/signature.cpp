#include "retrace/signature.hpp"

#include <functional>

namespace retrace {

namespace {
void combine(std::size_t& seed, std::size_t value) noexcept {
  seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}
}  // namespace

std::string LeafSignature::describe() const {
  switch (kind) {
    case Kind::tensor:
      return fmt::format("{} {} {} on {}", shape, dtype, layout,
                         device != nullptr ? device->name() : "the host");
    case Kind::integer: return fmt::format("{}", integer);
    case Kind::floating: return fmt::format("{}", floating);
    case Kind::boolean: return integer != 0 ? "true" : "false";
    case Kind::string: return fmt::format("\"{}\"", text);
    case Kind::none_value: return "none";
  }
  return "?";
}

std::size_t InputSignature::matching_leaves(const InputSignature& other) const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < leaves.size() && i < other.leaves.size(); ++i) {
    if (leaves[i] == other.leaves[i]) ++n;
  }
  return n;
}

namespace detail {

std::size_t hash_path(const TreePath& path) noexcept {
  std::size_t seed = 0;
  for (const TreePath* node = &path; node != nullptr; node = node->parent) {
    combine(seed, static_cast<std::size_t>(node->kind));
    combine(seed, node->index);
    combine(seed, std::hash<std::string_view>{}(node->name));
  }
  return seed;
}

LeafSignature tensor_signature(const Tensor& tensor, const Device* host_device) {
  LeafSignature s;
  s.kind = LeafSignature::Kind::tensor;
  s.dtype = tensor.dtype();
  s.layout = tensor.layout();
  s.shape = tensor.shape();
  s.device = tensor.on_host() ? host_device : tensor.device();
  return s;
}

void finish_signature(InputSignature& signature) noexcept {
  std::size_t seed = signature.leaves.size();
  for (const LeafSignature& leaf : signature.leaves) {
    combine(seed, leaf.path_hash);
    combine(seed, static_cast<std::size_t>(leaf.kind));
    combine(seed, static_cast<std::size_t>(leaf.dtype) * 31 + static_cast<std::size_t>(leaf.layout));
    for (std::int64_t d : leaf.shape.dims()) combine(seed, static_cast<std::size_t>(d));
    combine(seed, reinterpret_cast<std::uintptr_t>(leaf.device));
    combine(seed, static_cast<std::size_t>(leaf.integer));
    combine(seed, std::hash<double>{}(leaf.floating));
    combine(seed, std::hash<std::string>{}(leaf.text));
  }
  signature.hash = seed;
}

}  // namespace detail
}  // namespace retrace
