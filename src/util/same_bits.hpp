// Bitwise equality of float results, shared by the CLI's demos and the benchmarks: a traced run
// must reproduce the eager one exactly.
#pragma once

#include <cstring>
#include <vector>

namespace retrace::util {

// Equal bit for bit: a NaN (say, from weights holding one) equals itself, and -0 is not +0.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace retrace::util
