// The main of every test program: GoogleTest's, except that a run with RETRACE_CPU_ISA naming
// a kernel variant this CPU cannot run is skipped as a whole (exit status 77, CTest's
// SKIP_RETURN_CODE for the per-variant runs), with the reason.
#include "support.hpp"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* isa = std::getenv("RETRACE_CPU_ISA");
  if (isa != nullptr && *isa != '\0') {
    if (const std::string reason = retrace::testing::cpu_isa_skip_reason(); !reason.empty()) {
      std::printf("skipped: %s\n", reason.c_str());
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
