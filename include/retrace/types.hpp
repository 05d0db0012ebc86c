// Small value types shared by every layer: element types, layouts, strong ids.
//
// DType names and sizes come from one table (dtype_info); ids are distinct types so a queue id
// can never be passed where a trace id is expected:
//
//   retrace::QueueId q{1};
//   device.execute_trace(trace, q, retrace::Blocking::yes);
#pragma once

// fmt cannot be compiled by nvcc's front end: CUDA translation units get the types without their
// formatters.
#ifndef __CUDACC__
#include <fmt/format.h>
#endif

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace retrace {

// bool_: one byte per element holding 0 or 1 (comparisons, where, masked_fill); stored as uint8.
// float16 (IEEE binary16) and int64 come last so the older values keep their numbers.
enum class DType : std::uint8_t { float32, bfloat16, int32, uint32, uint8, bool_, float16, int64 };

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::uint8_t size;  // bytes per element
  bool is_floating;
};

inline constexpr std::array<DTypeInfo, 8> kDTypeTable{{
    {DType::float32, "float32", 4, true},
    {DType::bfloat16, "bfloat16", 2, true},
    {DType::int32, "int32", 4, false},
    {DType::uint32, "uint32", 4, false},
    {DType::uint8, "uint8", 1, false},
    {DType::bool_, "bool", 1, false},
    {DType::float16, "float16", 2, true},
    {DType::int64, "int64", 8, false},
}};

[[nodiscard]] constexpr const DTypeInfo& dtype_info(DType dtype) noexcept {
  return kDTypeTable[static_cast<std::size_t>(dtype)];
}
[[nodiscard]] constexpr std::size_t dtype_size(DType dtype) noexcept {
  return dtype_info(dtype).size;
}
[[nodiscard]] constexpr std::string_view dtype_name(DType dtype) noexcept {
  return dtype_info(dtype).name;
}

// How a tensor's elements are arranged in its storage.
//  row_major: plain C order.
//  tile:      the last two dimensions are padded up to multiples of 32 and stored as 32x32
//             tiles in row-major tile order, each tile row-major inside (ttnn's TILE_LAYOUT
//             without the 16x16 faces).
enum class Layout : std::uint8_t { row_major, tile };
inline constexpr std::int64_t kTileSize = 32;

[[nodiscard]] constexpr std::string_view layout_name(Layout layout) noexcept {
  return layout == Layout::row_major ? "row_major" : "tile";
}

// Whether a call waits for the work it enqueues to finish.
enum class Blocking : bool { no = false, yes = true };

template <class Tag, class Rep>
struct StrongId {
  Rep value{};
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) noexcept : value(v) {}
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
};

using TraceId = StrongId<struct TraceIdTag, std::uint64_t>;
using QueueId = StrongId<struct QueueIdTag, std::uint32_t>;
using DeviceId = StrongId<struct DeviceIdTag, std::uint32_t>;

// Stands for the queue this thread is capturing on (for the device it captures on), else the
// queue of the innermost DefaultQueueScope on this thread, else queue 0 (see device.hpp).
inline constexpr QueueId kDefaultQueue{0xFFFFFFFFu};

}  // namespace retrace

#ifndef __CUDACC__
template <class Tag, class Rep>
struct fmt::formatter<retrace::StrongId<Tag, Rep>> : fmt::formatter<Rep> {
  auto format(retrace::StrongId<Tag, Rep> id, fmt::format_context& ctx) const {
    return fmt::formatter<Rep>::format(id.value, ctx);
  }
};
template <>
struct fmt::formatter<retrace::DType> : fmt::formatter<std::string_view> {
  auto format(retrace::DType d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(retrace::dtype_name(d), ctx);
  }
};
template <>
struct fmt::formatter<retrace::Layout> : fmt::formatter<std::string_view> {
  auto format(retrace::Layout l, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(retrace::layout_name(l), ctx);
  }
};
#endif  // __CUDACC__
