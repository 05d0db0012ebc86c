// The device-neutral kernel interface between ops and backends.
//
// An op checks its inputs, allocates its outputs and then describes the work as a KernelLaunch:
// a kernel id plus a plain parameter struct holding resolved buffer pointers and sizes. The
// backend turns it into its own command (the CPU device: a function pointer and a copy of the
// parameters; the CUDA device: a kernel launch on a stream). Parameter structs are trivially
// copyable and at most kMaxKernelParamsBytes big, so a recorded command needs no heap memory.
#pragma once

#include "retrace/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

namespace retrace {

class Buffer;

enum class KernelId : std::uint16_t {
  fill,           // FillParams
  copy,           // CopyParams
  binary,         // BinaryParams
  binary_scalar,  // BinaryScalarParams
  assert_finite,  // AssertFiniteParams
  count_,
};

[[nodiscard]] std::string_view kernel_name(KernelId id) noexcept;

inline constexpr std::size_t kMaxKernelParamsBytes = 240;

enum class BinaryOp : std::uint8_t { add, mul };

struct FillParams {
  void* out;
  std::int64_t count;  // elements
  DType dtype;
  double value;
};

struct CopyParams {
  const void* src;
  void* dst;
  std::int64_t bytes;
};

struct BinaryParams {
  const void* a;
  const void* b;
  void* out;
  std::int64_t count;
  DType dtype;
  BinaryOp op;
};

struct BinaryScalarParams {
  const void* a;
  void* out;
  std::int64_t count;
  DType dtype;
  BinaryOp op;
  double scalar;
};

// Fails the queue (a sticky device error naming the op) if any element is NaN or infinite.
struct AssertFiniteParams {
  const void* data;
  std::int64_t count;
  DType dtype;
};

struct KernelLaunch {
  KernelId kernel;
  const char* op;  // the op's name ("add"), a string literal; errors and trace listings use it
  const void* params;
  std::size_t params_size;
  // Every buffer the kernel reads or writes. The device keeps them alive until the work has run
  // (and, for a trace, until the trace is released), so no queued work can see freed memory.
  std::span<Buffer* const> buffers;
};

template <class Params>
[[nodiscard]] KernelLaunch make_launch(KernelId id, const char* op, const Params& params,
                                       std::span<Buffer* const> buffers) noexcept {
  static_assert(std::is_trivially_copyable_v<Params>, "kernel params must be trivially copyable");
  static_assert(sizeof(Params) <= kMaxKernelParamsBytes, "kernel params too large");
  return KernelLaunch{id, op, &params, sizeof(Params), buffers};
}

}  // namespace retrace
