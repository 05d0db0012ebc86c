// TraceKey: which of a traced wrapper's traces a call selects — any value a user would hash:
// a string, an integer, a bool, or a tuple or pair of them (nested). Compared by value.
//
//   step.call({.key = "1024x1024"}, ...);
//   step.call({.key = 256}, ...);
//   step.call({.key = std::tuple{cfg_enabled, tokens}}, ...);
//
// The default key is the empty string. Integers compare by value whatever their type (256 and
// 256u are the same key); a bool is not an integer (true and 1 are different keys).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace retrace {

class TraceKey {
 public:
  TraceKey() = default;  // the default key, "" (no allocation: every call without a key has one)
  TraceKey(const char* text) : TraceKey(std::string(text)) {}  // NOLINT: implicit by design
  TraceKey(std::string_view text) : TraceKey(std::string(text)) {}
  TraceKey(std::string text) {
    if (!text.empty()) atoms_.push_back(Atom{Kind::string, 0, std::move(text)});
  }
  TraceKey(bool value) { atoms_.push_back(Atom{Kind::boolean, value ? 1 : 0, {}}); }
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  TraceKey(I value) {
    if constexpr (std::is_unsigned_v<I>) {
      const bool fits = static_cast<std::uint64_t>(value) <= INT64_MAX;
      atoms_.push_back(Atom{fits ? Kind::integer : Kind::large_unsigned,
                            static_cast<std::int64_t>(value), {}});
    } else {
      atoms_.push_back(Atom{Kind::integer, static_cast<std::int64_t>(value), {}});
    }
  }
  template <class... T>
  TraceKey(const std::tuple<T...>& values) {
    atoms_.push_back(Atom{Kind::open, 0, {}});
    std::apply([&](const auto&... v) { (append(TraceKey(v)), ...); }, values);
    atoms_.push_back(Atom{Kind::close, 0, {}});
  }
  template <class A, class B>
  TraceKey(const std::pair<A, B>& values) : TraceKey(std::tuple<const A&, const B&>(values.first, values.second)) {}

  friend bool operator==(const TraceKey&, const TraceKey&) = default;
  [[nodiscard]] bool is_default() const noexcept { return atoms_.empty(); }
  [[nodiscard]] std::size_t hash() const noexcept;
  // "\"1024x1024\"", "256", "(true, 256)".
  [[nodiscard]] std::string to_string() const;

 private:
  enum class Kind : std::uint8_t { string, integer, large_unsigned, boolean, open, close };
  struct Atom {
    Kind kind;
    std::int64_t value;
    std::string text;
    friend bool operator==(const Atom&, const Atom&) = default;
  };
  void append(const TraceKey& other) { atoms_.insert(atoms_.end(), other.atoms_.begin(), other.atoms_.end()); }

  std::vector<Atom> atoms_;
};

struct TraceKeyHash {
  std::size_t operator()(const TraceKey& key) const noexcept { return key.hash(); }
};

}  // namespace retrace
