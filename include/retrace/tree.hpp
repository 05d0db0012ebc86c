// Input and output trees of traced functions.
//
// A tree is a leaf — Tensor, an integer, a floating point number, bool, std::string or
// retrace::None — or a container of trees: std::tuple, std::pair, std::vector, std::array,
// std::map / std::unordered_map with std::string keys, std::optional, or a user struct whose
// fields are declared with RETRACE_FIELDS:
//
//   struct StepInputs { Tensor latents; float timestep; std::vector<Tensor> context; };
//   RETRACE_FIELDS(StepInputs, latents, timestep, context)   // all fields, in order
//
// visit_leaves(f, path, a, b...) walks several trees of the same type in lockstep, checking that
// their structure matches (vector lengths, map keys, optionals engaged) and calling
// f(path, leaf_a, leaf_b...) on every leaf. A visitor of one tree that is also invocable as
// f(container_tag, path, ContainerInfo) hears of every vector, array, map and optional as well
// (empty ones included). Unordered maps are walked in key order. Paths ("args[1]["latents"].context[2]") live on the
// stack as a chain of nodes and become strings only when an error is reported. Any other type
// is a compile error that names it.
#pragma once

#include "retrace/error.hpp"
#include "retrace/tensor.hpp"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace retrace {

// The "none" leaf (Python's None).
struct None {
  friend constexpr bool operator==(None, None) noexcept { return true; }
};
inline constexpr None none{};

// Declares every field of a struct, in declaration order, so trees can traverse it. Use it at
// namespace scope, in the struct's namespace.
#define RETRACE_FIELDS(Type, ...)                                                          \
  [[maybe_unused]] inline auto retrace_tie(Type& value) {                               \
    auto& [__VA_ARGS__] = value;                                                           \
    return std::tie(__VA_ARGS__);                                                          \
  }                                                                                        \
  [[maybe_unused]] inline auto retrace_tie(const Type& value) {                           \
    const auto& [__VA_ARGS__] = value;                                                     \
    return std::tie(__VA_ARGS__);                                                          \
  }                                                                                        \
  [[maybe_unused]] constexpr std::string_view retrace_field_names(const Type*) noexcept { \
    return #__VA_ARGS__;                                                                   \
  }

// A position in a tree: a chain of nodes on the stack, formatted only for error messages.
struct TreePath {
  enum class Kind : std::uint8_t { root, index, key, field, literal };
  const TreePath* parent = nullptr;
  Kind kind = Kind::root;
  std::size_t index = 0;
  std::string_view name;  // root label, map key or field name
  std::string_view role;  // root only: "input", "output"

  [[nodiscard]] static TreePath root(std::string_view label, std::string_view role) noexcept {
    return TreePath{nullptr, Kind::root, 0, label, role};
  }
  [[nodiscard]] TreePath at(std::size_t i) const noexcept { return {this, Kind::index, i, {}, {}}; }
  [[nodiscard]] TreePath key(std::string_view k) const noexcept {
    return {this, Kind::key, 0, k, {}};
  }
  [[nodiscard]] TreePath field(std::string_view f) const noexcept {
    return {this, Kind::field, 0, f, {}};
  }
  // A map key that is not a string, as its literal ("3", "None"): args[0][3].
  [[nodiscard]] TreePath literal(std::string_view text) const noexcept {
    return {this, Kind::literal, 0, text, {}};
  }
  // "args[1]["latents"].context[2]"
  [[nodiscard]] std::string to_string() const;
  // "input args[1]" — the role and the path, the way error messages start.
  [[nodiscard]] std::string describe() const;
};

// What visit_leaves tells a visitor that asks for containers too (see visit_leaves): a vector,
// array, map or optional, with its size and, for maps, its keys in sorted order.
struct ContainerInfo {
  enum class Kind : std::uint8_t { sequence, map, optional };
  Kind kind = Kind::sequence;
  std::size_t size = 0;  // elements, keys, or 0/1 for an optional
  const std::vector<std::string_view>* keys = nullptr;  // maps only
};
// Tag of the container callback: f(container_tag, path, info).
struct ContainerTag {};
inline constexpr ContainerTag container_tag{};

// Throws invalid_argument: "<role> <path>: <what>".
[[noreturn]] void throw_tree_error(const TreePath& path, std::string_view what);

namespace detail {

template <class T>
inline constexpr bool always_false = false;

template <class T>
concept FieldStruct = requires(T& v) {
  retrace_tie(v);
  retrace_field_names(static_cast<const T*>(nullptr));
};

template <class T>
concept ScalarLeaf = std::integral<T> || std::floating_point<T>;

template <class T>
concept Leaf = std::same_as<T, Tensor> || ScalarLeaf<T> || std::same_as<T, std::string> ||
               std::same_as<T, None>;

template <class T>
struct IsStringMap : std::false_type {};
template <class V, class C, class A>
struct IsStringMap<std::map<std::string, V, C, A>> : std::true_type {};
template <class V, class H, class E, class A>
struct IsStringMap<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};

template <class T>
struct IsOrderedMap : std::false_type {};
template <class V, class C, class A>
struct IsOrderedMap<std::map<std::string, V, C, A>> : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class V, class A>
struct IsVector<std::vector<V, A>> : std::true_type {};

template <class T>
struct IsArray : std::false_type {};
template <class V, std::size_t N>
struct IsArray<std::array<V, N>> : std::true_type {};

template <class T>
struct IsOptional : std::false_type {};
template <class V>
struct IsOptional<std::optional<V>> : std::true_type {};

template <class T>
struct IsTupleLike : std::false_type {};
template <class... Ts>
struct IsTupleLike<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct IsTupleLike<std::pair<A, B>> : std::true_type {};

std::string_view field_name(std::string_view names, std::size_t index) noexcept;
std::string describe_keys(const std::vector<std::string_view>& keys);

// A map's entries in key order (unordered maps are sorted, so every walk, and every signature
// made from one, is the same whatever the bucket layout or insertion order).
template <class Map>
auto sorted_entries(Map& map) {
  std::vector<decltype(&*map.begin())> entries;
  entries.reserve(map.size());
  for (auto& entry : map) entries.push_back(&entry);
  std::sort(entries.begin(), entries.end(),
            [](const auto* x, const auto* y) { return x->first < y->first; });
  return entries;
}

template <class F>
inline constexpr bool wants_containers_v =
    std::is_invocable_v<F&, ContainerTag, const TreePath&, const ContainerInfo&>;

template <class Map, class... Maps>
void check_same_keys(const TreePath& path, const Map& a, const Maps&... others) {
  auto same = [&](const Map& b) {
    if (b.size() != a.size()) return false;
    for (const auto& [key, value] : a) {
      if (!b.contains(key)) return false;
    }
    return true;
  };
  if ((same(others) && ...)) return;
  auto keys_of = [](const Map& m) {
    std::vector<std::string_view> keys;
    for (const auto& [key, value] : m) keys.emplace_back(key);
    return describe_keys(keys);
  };
  const Map* mismatch = nullptr;
  ((mismatch == nullptr && !same(others) ? (mismatch = &others, 0) : 0), ...);
  throw_tree_error(path, fmt::format("keys {} do not match the expected keys {}",
                                     keys_of(*mismatch), keys_of(a)));
}

}  // namespace detail

namespace detail {
template <class T>
constexpr bool tree_type_value();
}  // namespace detail

// True when T (cv-ref stripped) can be part of a tree, checked recursively.
template <class T>
inline constexpr bool is_tree_v = detail::tree_type_value<std::remove_cvref_t<T>>();

namespace detail {
template <class T>
constexpr bool tree_type_value() {
  if constexpr (Leaf<T>) {
    return true;
  } else if constexpr (IsVector<T>::value || IsArray<T>::value || IsOptional<T>::value) {
    return tree_type_value<std::remove_cvref_t<typename T::value_type>>();
  } else if constexpr (IsStringMap<T>::value) {
    return tree_type_value<std::remove_cvref_t<typename T::mapped_type>>();
  } else if constexpr (IsTupleLike<T>::value) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (tree_type_value<std::remove_cvref_t<std::tuple_element_t<I, T>>>() && ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (FieldStruct<T>) {
    using Fields = decltype(retrace_tie(std::declval<T&>()));
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (tree_type_value<std::remove_cvref_t<std::tuple_element_t<I, Fields>>>() && ...);
    }(std::make_index_sequence<std::tuple_size_v<Fields>>{});
  } else {
    return false;
  }
}
}  // namespace detail

template <class F, class T, class... Ts>
void visit_leaves(F&& f, const TreePath& path, T& a, Ts&... others);

namespace detail {
template <std::size_t I, class F, class T, class... Ts>
void visit_element(F& f, const TreePath& path, T& a, Ts&... others) {
  visit_leaves(f, path.at(I), std::get<I>(a), std::get<I>(others)...);
}
template <std::size_t I, class F, class T, class... Ts>
void visit_field(F& f, const TreePath& path, std::string_view names, T& a, Ts&... others) {
  visit_leaves(f, path.field(field_name(names, I)), std::get<I>(a), std::get<I>(others)...);
}
}  // namespace detail

// visit_leaves(f, path, a, others...): a and others have the same type T.
template <class F, class T, class... Ts>
void visit_leaves(F&& f, const TreePath& path, T& a, Ts&... others) {
  using U = std::remove_cvref_t<T>;
  static_assert((std::is_same_v<U, std::remove_cvref_t<Ts>> && ...),
                "visit_leaves walks trees of one type");
  if constexpr (detail::Leaf<U>) {
    f(path, a, others...);
  } else if constexpr (detail::IsTupleLike<U>::value) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::visit_element<I>(f, path, a, others...), ...);
    }(std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (detail::IsVector<U>::value || detail::IsArray<U>::value) {
    if constexpr (detail::IsVector<U>::value) {
      const std::size_t n = a.size();
      if (((others.size() != n) || ...)) {
        std::size_t other = 0;
        ((other = others.size() != n ? others.size() : other), ...);
        throw_tree_error(path, fmt::format("has {} elements, expected {}", other, n));
      }
    }
    if constexpr (detail::wants_containers_v<F>) {
      f(container_tag, path, ContainerInfo{ContainerInfo::Kind::sequence, a.size(), nullptr});
    }
    for (std::size_t i = 0; i < a.size(); ++i) visit_leaves(f, path.at(i), a[i], others[i]...);
  } else if constexpr (detail::IsOptional<U>::value) {
    const bool engaged = a.has_value();
    if (((others.has_value() != engaged) || ...)) {
      throw_tree_error(path, engaged ? "is empty, expected a value" : "has a value, expected none");
    }
    if constexpr (detail::wants_containers_v<F>) {
      f(container_tag, path,
        ContainerInfo{ContainerInfo::Kind::optional, engaged ? 1u : 0u, nullptr});
    }
    if (engaged) visit_leaves(f, path, *a, *others...);
  } else if constexpr (detail::IsStringMap<U>::value) {
    if constexpr (sizeof...(Ts) > 0) detail::check_same_keys(path, a, others...);
    auto visit_entry = [&](auto& entry) {
      visit_leaves(f, path.key(entry.first), entry.second, others.find(entry.first)->second...);
    };
    if constexpr (detail::IsOrderedMap<U>::value) {
      if constexpr (detail::wants_containers_v<F>) {
        std::vector<std::string_view> keys;
        for (const auto& entry : a) keys.emplace_back(entry.first);
        f(container_tag, path, ContainerInfo{ContainerInfo::Kind::map, a.size(), &keys});
      }
      for (auto& entry : a) visit_entry(entry);
    } else {
      const auto entries = detail::sorted_entries(a);
      if constexpr (detail::wants_containers_v<F>) {
        std::vector<std::string_view> keys;
        for (const auto* entry : entries) keys.emplace_back(entry->first);
        f(container_tag, path, ContainerInfo{ContainerInfo::Kind::map, a.size(), &keys});
      }
      for (auto* entry : entries) visit_entry(*entry);
    }
  } else if constexpr (detail::FieldStruct<U>) {
    constexpr std::string_view names = retrace_field_names(static_cast<const U*>(nullptr));
    auto fields = retrace_tie(a);
    constexpr std::size_t count = std::tuple_size_v<decltype(fields)>;
    auto others_fields = std::make_tuple(retrace_tie(others)...);
    std::apply(
        [&](auto&... other_fields) {
          [&]<std::size_t... I>(std::index_sequence<I...>) {
            (detail::visit_field<I>(f, path, names, fields, other_fields...), ...);
          }(std::make_index_sequence<count>{});
        },
        others_fields);
  } else {
    static_assert(detail::always_false<U>,
                  "retrace: this type cannot be part of a traced input or output. Leaves are "
                  "Tensor, integers, floating point, bool, std::string and retrace::None; "
                  "containers are std::tuple, std::pair, std::vector, std::array, std::optional, "
                  "std::map/std::unordered_map with std::string keys, and structs declared with "
                  "RETRACE_FIELDS. See the 'required from' lines for the offending type.");
  }
}

}  // namespace retrace
