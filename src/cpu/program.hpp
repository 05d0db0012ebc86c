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
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace retrace::cpu {

using KernelFn = void (*)(const std::byte* params);

// Commands are stored back to back in 16-byte slots: a header, then the kernel's parameters
// (an add of 1024 floats takes 64 bytes), so replaying walks a compact array.
struct alignas(16) CommandSlot {
  std::byte bytes[16];
};
struct CommandHeader {
  KernelFn fn;
  std::uint32_t slots;  // header, parameters and marks
  // Buffers the command writes whose write counts it raises as it starts (Buffer::
  // mark_written): their pointers follow the parameters. Only buffers from outside a trace's
  // pool: the device derives data (packed weights) from those alone.
  std::uint32_t marks;
};
static_assert(sizeof(CommandHeader) <= sizeof(CommandSlot));

struct Program {
  std::vector<CommandSlot> stream;
  std::vector<const char*> ops;  // op name of each command, for errors and listings
  // Buffers an eager batch uses, kept alive until it ran (a trace's are kept by the device).
  std::vector<std::shared_ptr<Buffer>> retained;
  // Host data staged for writes.
  std::vector<std::unique_ptr<std::byte[]>> staging;
  std::optional<TraceId> trace;  // set for traces
  // The collectives among the commands: index of the command and slot of its parameters. They
  // run on the queue's worker (never on a thread that may be the one their peers wait for),
  // and a queue that skips them tells their peers (see retrace/backend.hpp).
  struct CollectiveRef {
    std::size_t command;
    std::size_t slot;
  };
  std::vector<CollectiveRef> collectives;

  void append(KernelFn fn, const char* op, const void* params, std::size_t params_size,
              std::span<const Buffer* const> marks = {});
  [[nodiscard]] std::size_t size() const noexcept { return ops.size(); }
  // Runs every command; returns the index of the one that threw (with its message) or size().
  // With `command_ns` (size() entries), each command's time is added to its entry.
  std::size_t run(std::string& error, std::uint64_t* command_ns = nullptr) const noexcept;
  // Tells the peers of the collectives from command `first` on that this queue skips them.
  void skip_collectives(std::size_t first, std::string_view reason) const noexcept;
};

// Maps a launch to the CPU kernel that runs it (specialised by dtype and operation), from the
// CPU device's kernel table (one entry per kernel of RETRACE_KERNEL_LIST).
[[nodiscard]] KernelFn resolve_kernel(const KernelLaunch& launch);
[[nodiscard]] bool cpu_supports(KernelId kernel) noexcept;

}  // namespace retrace::cpu
