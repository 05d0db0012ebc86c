// One malformed-input check of the safetensors reader, shared by the mutation test and the
// libFuzzer target: the reader either accepts the bytes (and every tensor it returns can be read
// in full) or throws retrace::Error of category invalid_argument. Anything else (another
// exception, a crash, an out-of-bounds read under ASan) is a bug.
#pragma once

#include <retrace/error.hpp>
#include <retrace/models/safetensors.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

namespace retrace::testing {

// Returns true when the bytes were accepted.
inline bool check_safetensors_bytes(std::span<const std::byte> bytes) {
  try {
    const models::SafetensorsFile file = models::SafetensorsFile::parse(bytes, "fuzz");
    for (const models::SafetensorsEntry& entry : file.entries()) {
      if (entry.bytes.data() < bytes.data() ||
          entry.bytes.data() + entry.bytes.size() > bytes.data() + bytes.size()) {
        throw std::logic_error("entry \"" + entry.name + "\" points outside the file");
      }
      const Tensor tensor = file.host_tensor(entry);
      if (tensor.shape() != entry.shape) throw std::logic_error("shape changed");
      volatile double sum = 0.0;
      for (float v : tensor.to_vector<float>()) sum = sum + static_cast<double>(v);
    }
    return true;
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::invalid_argument) throw;
    return false;
  }
}

}  // namespace retrace::testing
