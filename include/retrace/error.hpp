// retrace::Error — the one exception type the library throws.
//
// Every error carries a category (what kind of mistake it is) and a message that says what was
// expected, what was found, where (input path, device, queue, trace) and, where it helps, what
// to do. Tests match on the category and a fragment of the message.
//
//   try { tracer(x); } catch (const retrace::Error& e) {
//     if (e.category() == retrace::ErrorCategory::invalid_argument) ...
//   }
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace retrace {

enum class ErrorCategory {
  invalid_argument,     // the caller passed something wrong (shape, dtype, device, path ...)
  failed_precondition,  // the call is legal but not in this state (released trace, closed device)
  capture_violation,    // an operation that a trace capture forbids
  out_of_memory,        // device memory or the trace region is exhausted
  device_error,         // queued work failed on the device
  unimplemented,        // the device has no kernel for this (an op, a dtype, a size)
};

[[nodiscard]] std::string_view category_name(ErrorCategory category) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, std::string message,
        std::source_location location = std::source_location::current());

  [[nodiscard]] ErrorCategory category() const noexcept { return category_; }
  // The message without the category prefix.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  // Where in retrace the error was raised ("tensor.cpp:42").
  [[nodiscard]] const std::string& raised_at() const noexcept { return raised_at_; }

 private:
  ErrorCategory category_;
  std::string message_;
  std::string raised_at_;
};

namespace detail {
[[noreturn]] void throw_error(ErrorCategory category, std::string message,
                              std::source_location location);
[[noreturn]] void internal_assert_failed(const char* expression, std::string message,
                                         std::source_location location);
}  // namespace detail

}  // namespace retrace

// User-facing check: throws retrace::Error with a category and a formatted message.
#define RETRACE_CHECK(condition, category, ...)                                          \
  do {                                                                                   \
    if (!(condition)) [[unlikely]] {                                                     \
      ::retrace::detail::throw_error(::retrace::ErrorCategory::category,                 \
                                     ::fmt::format(__VA_ARGS__),                         \
                                     ::std::source_location::current());                 \
    }                                                                                    \
  } while (false)

#define RETRACE_FAIL(category, ...)                                                      \
  ::retrace::detail::throw_error(::retrace::ErrorCategory::category,                     \
                                 ::fmt::format(__VA_ARGS__), ::std::source_location::current())

// Internal invariant: checked in debug builds only, never on user input.
#ifdef NDEBUG
#define RETRACE_ASSERT(condition, ...) \
  do {                                 \
  } while (false)
#else
#define RETRACE_ASSERT(condition, ...)                                                   \
  do {                                                                                   \
    if (!(condition)) [[unlikely]] {                                                     \
      ::retrace::detail::internal_assert_failed(#condition, ::fmt::format(__VA_ARGS__),  \
                                                ::std::source_location::current());      \
    }                                                                                    \
  } while (false)
#endif
