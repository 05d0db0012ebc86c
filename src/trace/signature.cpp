#include "retrace/signature.hpp"

#include <fmt/ranges.h>

#include <cmath>
#include <functional>

namespace retrace {

namespace {
void combine(std::size_t& seed, std::size_t value) noexcept {
  seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}
}  // namespace

namespace {
bool same_floating(double a, double b) noexcept {
  return a == b || (std::isnan(a) && std::isnan(b));
}
// One hash for values that compare equal: every NaN alike, -0.0 like 0.0.
std::size_t hash_floating(double v) noexcept {
  if (std::isnan(v)) return 0x7ff8000000000000ULL;
  if (v == 0.0) return 0;
  return std::hash<double>{}(v);
}
}  // namespace

bool operator==(const LeafSignature& a, const LeafSignature& b) noexcept {
  return a.kind == b.kind && a.path_hash == b.path_hash && a.dtype == b.dtype &&
         a.layout == b.layout && a.shape == b.shape && a.device_uid == b.device_uid &&
         a.integer == b.integer && same_floating(a.floating, b.floating) && a.text == b.text;
}

std::string LeafSignature::describe() const {
  switch (kind) {
    case Kind::tensor:
      return fmt::format("{} {} {} on {}", shape, dtype, layout,
                         device_link != nullptr ? device_link->name : "the host");
    case Kind::container:
      switch (static_cast<ContainerInfo::Kind>(dtype)) {
        case ContainerInfo::Kind::sequence: return fmt::format("a sequence of {} elements", integer);
        case ContainerInfo::Kind::map: return fmt::format("a map with keys {{{}}}", text);
        case ContainerInfo::Kind::optional: return integer != 0 ? "a value" : "no value";
      }
      return "a container";
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
  if (tensor.on_device()) {
    s.device_link = &tensor.buffer()->link();
  } else if (host_device != nullptr) {
    s.device_link = host_device->link().get();
  }
  s.device_uid = s.device_link != nullptr ? s.device_link->uid : 0;
  return s;
}

LeafSignature container_signature(const ContainerInfo& info) {
  LeafSignature s;
  s.kind = LeafSignature::Kind::container;
  s.integer = static_cast<std::int64_t>(info.size);
  s.dtype = static_cast<DType>(info.kind);  // sequences, maps and optionals differ
  if (info.keys != nullptr) s.text = fmt::format("{}", fmt::join(*info.keys, ", "));
  return s;
}

void finish_signature(InputSignature& signature) noexcept {
  std::size_t seed = signature.leaves.size();
  for (const LeafSignature& leaf : signature.leaves) {
    combine(seed, leaf.path_hash);
    combine(seed, static_cast<std::size_t>(leaf.kind));
    combine(seed, static_cast<std::size_t>(leaf.dtype) * 31 + static_cast<std::size_t>(leaf.layout));
    for (std::int64_t d : leaf.shape.dims()) combine(seed, static_cast<std::size_t>(d));
    combine(seed, static_cast<std::size_t>(leaf.device_uid));
    combine(seed, static_cast<std::size_t>(leaf.integer));
    combine(seed, hash_floating(leaf.floating));
    combine(seed, std::hash<std::string>{}(leaf.text));
  }
  signature.hash = seed;
}

}  // namespace detail
}  // namespace retrace
