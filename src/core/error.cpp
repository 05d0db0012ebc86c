#include "retrace/error.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace retrace {

std::string_view category_name(ErrorCategory category) noexcept {
  switch (category) {
    case ErrorCategory::invalid_argument: return "invalid argument";
    case ErrorCategory::failed_precondition: return "failed precondition";
    case ErrorCategory::capture_violation: return "capture violation";
    case ErrorCategory::out_of_memory: return "out of memory";
    case ErrorCategory::device_error: return "device error";
    case ErrorCategory::unimplemented: return "unimplemented";
  }
  return "unknown";
}

namespace {
std::string short_location(const std::source_location& location) {
  return fmt::format("{}:{}", std::filesystem::path(location.file_name()).filename().string(),
                     location.line());
}
}  // namespace

Error::Error(ErrorCategory category, std::string message, std::source_location location)
    : std::runtime_error(fmt::format("{}: {}", category_name(category), message)),
      category_(category),
      message_(std::move(message)),
      raised_at_(short_location(location)) {}

namespace detail {

void throw_error(ErrorCategory category, std::string message, std::source_location location) {
  throw Error(category, std::move(message), location);
}

void internal_assert_failed(const char* expression, std::string message,
                            std::source_location location) {
  std::fprintf(stderr, "retrace internal error at %s: %s (%s)\n",
               short_location(location).c_str(), message.c_str(), expression);
  std::abort();
}

}  // namespace detail
}  // namespace retrace
