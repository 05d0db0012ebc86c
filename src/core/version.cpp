#include "retrace/version.hpp"

namespace retrace {

const char* version() noexcept {
  return RETRACE_VERSION_STRING;
}

}  // namespace retrace
