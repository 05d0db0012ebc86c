#include "device/arena.hpp"
#include "retrace/backend.hpp"

#include "retrace/error.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace retrace::detail {

namespace {
constexpr std::byte kGuardPattern{0xA5};

constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

}  // namespace

std::string human_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.2f} MiB", bytes / 1048576.0);
  if (bytes >= 1024) return fmt::format("{:.2f} KiB", bytes / 1024.0);
  return fmt::format("{} bytes", bytes);
}

Arena::Arena(std::string device_name, std::byte* base, std::size_t capacity,
             std::size_t trace_region, std::size_t guard_bytes, std::size_t alignment)
    : device_name_(std::move(device_name)),
      capacity_(capacity / alignment * alignment),
      trace_region_(trace_region),
      guard_(round_up(std::min(guard_bytes, capacity), alignment)),
      alignment_(alignment),
      base_(base) {
  RETRACE_ASSERT(base != nullptr && alignment >= 64 && (alignment & (alignment - 1)) == 0,
                 "arena of {}: bad region or alignment", device_name_);
  RETRACE_CHECK(capacity_ > 0, invalid_argument, "{}: memory_bytes must be positive", device_name_);
  RETRACE_CHECK(guard_bytes <= capacity_ / 4, invalid_argument,
                "{}: guard_bytes ({}) must be at most a quarter of the device memory ({})",
                device_name_, guard_bytes, human_bytes(capacity_));
  free_.emplace(0, capacity_);
}

std::size_t Arena::round_capacity(std::size_t bytes, std::size_t alignment) {
  // Rounds down near the top of the range instead of wrapping to a tiny capacity.
  return bytes > SIZE_MAX - alignment ? bytes / alignment * alignment : round_up(bytes, alignment);
}

std::size_t Arena::span_for(std::size_t bytes) const noexcept {
  return round_up(std::max<std::size_t>(bytes, 1), alignment_) + 2 * guard_;
}

BlockInfo Arena::describe(std::size_t offset, const Block& block) const noexcept {
  std::byte* data = base_ + offset + guard_;
  return BlockInfo{data, reinterpret_cast<std::uintptr_t>(data), block.size, block.pool};
}

BlockInfo Arena::allocate(std::size_t bytes, std::optional<TraceId> capture) {
  // Checked before any rounding, so a huge request can never wrap to a small span.
  RETRACE_CHECK(bytes <= capacity_, out_of_memory,
                "{} is out of memory: cannot allocate {} ({} bytes), more than the whole device "
                "({})",
                device_name_, human_bytes(bytes), bytes, human_bytes(capacity_));
  const std::size_t span = span_for(bytes);
  std::lock_guard lock(mutex_);
  Pool* pool = nullptr;
  if (capture) {
    pool = &pools_.at(capture->value);
    if (auto offset = reuse_from_pool(*pool, span)) {
      Block& block = blocks_.at(*offset);
      block.size = bytes;
      block.extent = std::max(block.extent, bytes);
      block.held = true;
      write_guards(*offset, block);
      return describe(*offset, block);
    }
    RETRACE_CHECK(trace_bytes_ + span <= trace_region_, out_of_memory,
                  "{}: capturing trace {} needs {} more trace memory, but the trace region "
                  "({}) has {} left ({} held by traces); raise trace_region_bytes in the device "
                  "options or release traces",
                  device_name_, *capture, human_bytes(span), human_bytes(trace_region_),
                  human_bytes(trace_region_ - trace_bytes_), human_bytes(trace_bytes_));
  }
  const std::size_t offset = carve(span, bytes);
  Block& block = blocks_.emplace(offset, Block{span, bytes, bytes, capture, true}).first->second;
  in_use_ += span;
  peak_ = std::max(peak_, in_use_);
  if (pool != nullptr) {
    pool->offsets.push_back(offset);
    pool->bytes += span;
    trace_bytes_ += span;
  }
  write_guards(offset, block);
  return describe(offset, block);
}

std::optional<std::size_t> Arena::reuse_from_pool(Pool& pool, std::size_t span) {
  // Best fit among blocks this capture already freed, wasting at most half the block.
  auto it = pool.reusable.lower_bound(span);
  if (it == pool.reusable.end() || it->first > 2 * span) return std::nullopt;
  const std::size_t offset = it->second;
  pool.reusable.erase(it);
  return offset;
}

std::size_t Arena::carve(std::size_t span, std::size_t request) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < span) continue;
    const std::size_t offset = it->first;
    const std::size_t rest = it->second - span;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + span, rest);
    return offset;
  }
  RETRACE_FAIL(out_of_memory,
               "{} is out of memory: cannot allocate {} ({} bytes); {} of {} free, largest free "
               "block {}, {} held by traces",
               device_name_, human_bytes(request), request, human_bytes(capacity_ - in_use_),
               human_bytes(capacity_), human_bytes(largest_free_locked()),
               human_bytes(trace_bytes_));
}

void Arena::give_back(std::size_t offset, std::size_t span) noexcept {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + span == next->first) {
    span += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += span;
      return;
    }
  }
  free_.emplace(offset, span);
}

std::optional<std::string> Arena::free(const BlockInfo& info) noexcept {
  const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(info.data) - base_) - guard_;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(offset);
  if (it == blocks_.end()) return std::nullopt;
  Block& block = it->second;
  std::optional<std::string> damage = check_guards(offset, block);
  block.held = false;
  if (block.pool) {
    Pool& pool = pools_.at(block.pool->value);
    if (!pool.sealed) pool.reusable.emplace(block.span, offset);
    return damage;  // reserved until the trace is released
  }
  in_use_ -= block.span;
  give_back(offset, block.span);
  blocks_.erase(it);
  return damage;
}

void Arena::begin_pool(TraceId trace) {
  std::lock_guard lock(mutex_);
  pools_.emplace(trace.value, Pool{});
}

std::pair<std::size_t, std::size_t> Arena::seal_pool(TraceId trace) {
  std::lock_guard lock(mutex_);
  Pool& pool = pools_.at(trace.value);
  pool.sealed = true;
  pool.reusable.clear();
  return {pool.bytes, pool.offsets.size()};
}

void Arena::release_pool(TraceId trace) noexcept {
  std::lock_guard lock(mutex_);
  auto found = pools_.find(trace.value);
  if (found == pools_.end()) return;
  for (std::size_t offset : found->second.offsets) {
    Block& block = blocks_.at(offset);
    trace_bytes_ -= block.span;
    block.pool.reset();
    if (block.held) continue;  // now an ordinary allocation, freed with its last handle
    in_use_ -= block.span;
    give_back(offset, block.span);
    blocks_.erase(offset);
  }
  pools_.erase(found);
}

void Arena::write_guards(std::size_t offset, const Block& block) noexcept {
  if (guard_ == 0) return;
  std::byte* start = base_ + offset;
  std::memset(start, static_cast<int>(kGuardPattern), guard_);
  const std::size_t tail = guard_ + block.extent;
  std::memset(start + tail, static_cast<int>(kGuardPattern), block.span - tail);
}

std::optional<std::string> Arena::check_guards(std::size_t offset,
                                               const Block& block) const noexcept {
  if (guard_ == 0) return std::nullopt;
  const std::byte* start = base_ + offset;
  const std::size_t tail = guard_ + block.extent;
  auto damaged = [&](std::size_t from, std::size_t to) {
    return std::any_of(start + from, start + to, [](std::byte b) { return b != kGuardPattern; });
  };
  const bool before = damaged(0, guard_);
  const bool after = damaged(tail, block.span);
  if (!before && !after) return std::nullopt;
  try {
    return fmt::format("{}: a kernel wrote {} the {}-byte buffer at 0x{:x}", device_name_,
                       before ? "before the start of" : "past the end of", block.extent,
                       reinterpret_cast<std::uintptr_t>(start + guard_));
  } catch (...) {
    return std::string("guard bytes damaged");
  }
}

std::size_t Arena::largest_free_locked() const noexcept {
  std::size_t largest = 0;
  for (const auto& [offset, span] : free_) largest = std::max(largest, span);
  return largest;
}

void Arena::fill_stats(DeviceStats& stats) const {
  std::lock_guard lock(mutex_);
  stats.capacity_bytes = capacity_;
  stats.bytes_in_use = in_use_;
  stats.peak_bytes_in_use = peak_;
  stats.trace_bytes = trace_bytes_;
  stats.trace_region_bytes = trace_region_;
  stats.live_buffers = static_cast<std::size_t>(
      std::count_if(blocks_.begin(), blocks_.end(), [](const auto& b) { return b.second.held; }));
}

}  // namespace retrace::detail

namespace retrace {

std::size_t device_memory_capacity(std::size_t bytes, std::size_t alignment) {
  return detail::Arena::round_capacity(bytes, alignment);
}

}  // namespace retrace
