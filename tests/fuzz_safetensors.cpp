// libFuzzer entry point for the safetensors reader (see RETRACE_BUILD_FUZZERS in
// tests/CMakeLists.txt). The same check runs in the test suite over structured mutations.
#include "safetensors_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)retrace::testing::check_safetensors_bytes(
      std::span(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
