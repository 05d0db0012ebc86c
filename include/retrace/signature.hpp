// InputSignature: what a trace depends on in its inputs, leaf by leaf — tensor shapes, dtypes,
// layouts and devices, scalar and string values, the size (and keys) of every container, and
// where each sits in the tree (so a changed map key or vector length changes the signature,
// even for containers without leaves). Equal inputs give equal signatures whatever the
// iteration order of an unordered_map; a NaN scalar matches NaN. Traced functions with automatic
// keys select a trace by it, and explain a new capture by the first leaf that differs from the
// nearest existing trace.
#pragma once

#include "retrace/tree.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace retrace {

struct LeafSignature {
  // container: a vector, array, map or optional (its size, and for maps its keys, count too,
  // so an empty container that changes size or keys changes the signature).
  enum class Kind : std::uint8_t { tensor, integer, floating, boolean, string, none_value, container };
  Kind kind = Kind::none_value;
  std::size_t path_hash = 0;
  // tensor
  DType dtype = DType::float32;
  Layout layout = Layout::row_major;
  Shape shape;
  std::uint64_t device_uid = 0;                     // Device::uid(); 0: host
  const detail::DeviceLink* device_link = nullptr;  // for its name in descriptions only
  // scalars (integer also holds a container's size)
  std::int64_t integer = 0;
  double floating = 0.0;
  std::string text;  // strings; a map's keys

  // Floating values compare as the Tracer compares scalars: NaN equals NaN, 0.0 equals -0.0.
  friend bool operator==(const LeafSignature& a, const LeafSignature& b) noexcept;
  // "[1, 64] float32 row_major on cpu:0", "0.5", "\"euler\"", "a container of 3 elements".
  [[nodiscard]] std::string describe() const;
};

struct InputSignature {
  std::vector<LeafSignature> leaves;
  std::size_t hash = 0;

  friend bool operator==(const InputSignature& a, const InputSignature& b) {
    return a.hash == b.hash && a.leaves == b.leaves;
  }
  // How many leaves match position by position (the "distance" to another signature).
  [[nodiscard]] std::size_t matching_leaves(const InputSignature& other) const noexcept;
};

namespace detail {
std::size_t hash_path(const TreePath& path) noexcept;
LeafSignature tensor_signature(const Tensor& tensor, const Device* host_device);
LeafSignature container_signature(const ContainerInfo& info);
void finish_signature(InputSignature& signature) noexcept;
}  // namespace detail

// host_device stands in for the device of host tensors (they are moved there), so a host
// tensor and a device tensor of the same shape select the same trace.
template <class T>
LeafSignature leaf_signature(const T& leaf, const Device* host_device) {
  using K = LeafSignature::Kind;
  LeafSignature s;
  if constexpr (std::is_same_v<T, Tensor>) {
    s = detail::tensor_signature(leaf, host_device);
  } else if constexpr (std::is_same_v<T, bool>) {
    s.kind = K::boolean;
    s.integer = leaf ? 1 : 0;
  } else if constexpr (std::is_integral_v<T>) {
    s.kind = K::integer;
    s.integer = static_cast<std::int64_t>(leaf);
  } else if constexpr (std::is_floating_point_v<T>) {
    s.kind = K::floating;
    s.floating = static_cast<double>(leaf);
  } else if constexpr (std::is_same_v<T, std::string>) {
    s.kind = K::string;
    s.text = leaf;
  } else {
    s.kind = K::none_value;
  }
  return s;
}

namespace detail {
struct SignatureVisitor {
  InputSignature& signature;
  const Device* host_device;
  template <class T>
  void operator()(const TreePath& path, const T& leaf) const {
    push(path, leaf_signature(leaf, host_device));
  }
  void operator()(ContainerTag, const TreePath& path, const ContainerInfo& info) const {
    push(path, container_signature(info));
  }
  void push(const TreePath& path, LeafSignature s) const {
    s.path_hash = hash_path(path);
    signature.leaves.push_back(std::move(s));
  }
};

struct PathFinder {
  std::size_t& leaf;
  std::size_t wanted;
  std::string& found;
  template <class T>
  void operator()(const TreePath& path, const T&) const {
    note(path);
  }
  void operator()(ContainerTag, const TreePath& path, const ContainerInfo&) const { note(path); }
  void note(const TreePath& path) const {
    if (leaf++ == wanted) found = path.to_string();
  }
};
}  // namespace detail

// The signature of a call's arguments (root label "args"); `positions` gives each argument's
// index in the caller's parameter list (empty: 0, 1, 2, ...).
template <class... Args>
InputSignature make_signature(const Device* host_device, std::span<const std::size_t> positions,
                              const Args&... args) {
  InputSignature signature;
  const TreePath root = TreePath::root("args", "input");
  std::size_t index = 0;
  auto position = [&](std::size_t i) { return i < positions.size() ? positions[i] : i; };
  auto visit_arg = [&](const auto& arg) {
    visit_leaves(detail::SignatureVisitor{signature, host_device}, root.at(position(index++)), arg);
  };
  (visit_arg(args), ...);
  detail::finish_signature(signature);
  return signature;
}

// The path of leaf (or container) `wanted` of the arguments ("args[1]["latents"]"), for explanations.
template <class... Args>
std::string leaf_path(std::size_t wanted, std::span<const std::size_t> positions,
                      const Args&... args) {
  std::string found;
  std::size_t leaf = 0, index = 0;
  const TreePath root = TreePath::root("args", "input");
  auto position = [&](std::size_t i) { return i < positions.size() ? positions[i] : i; };
  auto visit_arg = [&](const auto& arg) {
    visit_leaves(detail::PathFinder{leaf, wanted, found}, root.at(position(index++)), arg);
  };
  (visit_arg(args), ...);
  return found;
}

}  // namespace retrace
