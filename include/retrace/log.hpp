// Logging: one small facility for the whole library.
//
// The level comes from the environment variable RETRACE_LOG_LEVEL (trace, debug, info, warning,
// error, off; default warning) and can be changed with set_log_level. Messages go to stderr as
// "[retrace] [warning] ..." unless a sink is installed (tests install one to check messages).
//
//   retrace::log(retrace::LogLevel::debug, "captured trace {} on {}", id, device.name());
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace retrace {

enum class LogLevel : int { trace, debug, info, warning, error, off };

[[nodiscard]] LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
// Parses "debug", "warning", ... (case-sensitive); returns fallback for anything else.
[[nodiscard]] LogLevel parse_log_level(std::string_view text, LogLevel fallback) noexcept;

using LogSink = std::function<void(LogLevel, std::string_view)>;
// Replaces the sink (an empty function restores stderr); returns the previous one.
LogSink set_log_sink(LogSink sink);

namespace detail {
void emit_log(LogLevel level, std::string_view message);
}

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  detail::emit_log(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace retrace
