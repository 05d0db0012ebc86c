#include "retrace/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace retrace {

namespace {

std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{[] {
    const char* env = std::getenv("RETRACE_LOG_LEVEL");
    return env != nullptr ? parse_log_level(env, LogLevel::warning) : LogLevel::warning;
  }()};
  return level;
}

std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}

LogSink& sink_storage() {
  static LogSink sink;
  return sink;
}

std::string_view level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

}  // namespace

LogLevel log_level() noexcept { return level_storage().load(std::memory_order_relaxed); }

void set_log_level(LogLevel level) noexcept { level_storage().store(level); }

LogLevel parse_log_level(std::string_view text, LogLevel fallback) noexcept {
  for (LogLevel level : {LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::warning,
                         LogLevel::error, LogLevel::off}) {
    if (text == level_name(level)) return level;
  }
  if (text == "warn") return LogLevel::warning;
  return fallback;
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lock(sink_mutex());
  std::swap(sink_storage(), sink);
  return sink;
}

namespace detail {
void emit_log(LogLevel level, std::string_view message) {
  std::lock_guard lock(sink_mutex());
  if (sink_storage()) {
    sink_storage()(level, message);
    return;
  }
  std::fprintf(stderr, "[retrace] [%.*s] %.*s\n", static_cast<int>(level_name(level).size()),
               level_name(level).data(), static_cast<int>(message.size()), message.data());
}
}  // namespace detail

}  // namespace retrace
