#include "retrace/trace_key.hpp"

#include <fmt/format.h>

#include <functional>

namespace retrace {

std::size_t TraceKey::hash() const noexcept {
  std::size_t seed = atoms_.size();
  for (const Atom& atom : atoms_) {
    const std::size_t h = atom.kind == Kind::string ? std::hash<std::string>{}(atom.text)
                                                    : std::hash<std::int64_t>{}(atom.value);
    seed ^= h + static_cast<std::size_t>(atom.kind) + 0x9e3779b97f4a7c15ULL + (seed << 6) +
            (seed >> 2);
  }
  return seed;
}

std::string TraceKey::to_string() const {
  if (atoms_.empty()) return "\"\"";
  std::string out;
  bool after_value = false;  // a separator goes between two values of one tuple
  for (const Atom& atom : atoms_) {
    if (atom.kind == Kind::close) {
      out += ')';
      after_value = true;
      continue;
    }
    if (after_value) out += ", ";
    switch (atom.kind) {
      case Kind::string: out += fmt::format("\"{}\"", atom.text); break;
      case Kind::integer: out += fmt::format("{}", atom.value); break;
      case Kind::large_unsigned: out += fmt::format("{}", static_cast<std::uint64_t>(atom.value)); break;
      case Kind::boolean: out += atom.value != 0 ? "true" : "false"; break;
      case Kind::open: out += '('; break;
      case Kind::close: break;
    }
    after_value = atom.kind != Kind::open;
  }
  return out;
}

}  // namespace retrace
