// Commands and programs of the CPU device.
//
// A Command is a kernel function pointer, the op's name and a copy of the kernel's parameter
// struct: plain data, replayed by calling fn(params) in a loop (no allocation, lock or virtual
// call per command). A Program is a run of commands with what they need kept alive: an eager
// batch, a host write, or a sealed trace.
#pragma once

#include "retrace/device.hpp"
#include "retrace/kernels.hpp"

#include <cstddef>
#include <memory>
#include <vector>

namespace retrace::cpu {

using KernelFn = void (*)(const std::byte* params);

struct Command {
  KernelFn fn;
  const char* op;
  alignas(16) std::byte params[kMaxKernelParamsBytes];
};
static_assert(sizeof(Command) == 256);

struct Program {
  std::vector<Command> commands;
  // Buffers the commands use that the program must keep alive (for a trace: those outside its
  // private pool).
  std::vector<std::shared_ptr<Buffer>> retained;
  // Host data staged for writes.
  std::vector<std::unique_ptr<std::byte[]>> staging;
  std::optional<TraceId> trace;  // set for traces
};

// Maps a launch to the CPU kernel that runs it (specialised by dtype and operation).
[[nodiscard]] KernelFn resolve_kernel(const KernelLaunch& launch);

}  // namespace retrace::cpu
