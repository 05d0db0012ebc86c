#include "cpu/program.hpp"

#include "retrace/backend.hpp"
#include "retrace/error.hpp"

#include <chrono>
#include <cstring>
#include <new>

namespace retrace::cpu {

namespace {
std::size_t slots_for(std::size_t bytes) {
  return (bytes + sizeof(CommandSlot) - 1) / sizeof(CommandSlot);
}
}  // namespace

void Program::append(KernelFn fn, const char* op, const void* params, std::size_t params_size,
                     std::span<const Buffer* const> marks) {
  const std::size_t param_slots = slots_for(params_size);
  const std::size_t mark_slots = slots_for(marks.size_bytes());
  const std::size_t at = stream.size();
  stream.resize(at + 1 + param_slots + mark_slots);
  new (&stream[at]) CommandHeader{fn, static_cast<std::uint32_t>(1 + param_slots + mark_slots),
                                  static_cast<std::uint32_t>(marks.size())};
  if (params_size > 0) std::memcpy(&stream[at + 1], params, params_size);
  if (!marks.empty()) std::memcpy(&stream[at + 1 + param_slots], marks.data(), marks.size_bytes());
  ops.push_back(op);
}

void Program::skip_collectives(std::size_t first, std::string_view reason) const noexcept {
  for (const CollectiveRef& c : collectives) {
    if (c.command < first) continue;
    CollectiveParams params;
    std::memcpy(&params, &stream[c.slot], sizeof(params));
    detail::skip_host_collective(params, reason);
  }
}

namespace {

// Calls every command from `slot` on, counting them in `index` (so a throw leaves the index of
// the failing command); Timed adds each command's nanoseconds to command_ns[index]. Two
// instantiations keep the untimed replay loop free of clock reads and branches.
template <bool Timed>
void run_commands(const CommandSlot* slot, const CommandSlot* end, std::size_t& index,
                  [[maybe_unused]] std::uint64_t* command_ns) {
  for (; slot != end; ++index) {
    const auto* header = std::launder(reinterpret_cast<const CommandHeader*>(slot));
    if (header->marks != 0) [[unlikely]] {
      // After the parameters: the buffers the command writes.
      const CommandSlot* marks = slot + header->slots - slots_for(header->marks * sizeof(Buffer*));
      for (std::uint32_t i = 0; i < header->marks; ++i) {
        const Buffer* buffer;
        std::memcpy(&buffer, reinterpret_cast<const std::byte*>(marks) + i * sizeof buffer,
                    sizeof buffer);
        buffer->mark_written();
      }
    }
    if constexpr (Timed) {
      const auto t0 = std::chrono::steady_clock::now();
      header->fn(reinterpret_cast<const std::byte*>(slot + 1));
      command_ns[index] += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
              .count());
    } else {
      header->fn(reinterpret_cast<const std::byte*>(slot + 1));
    }
    slot += header->slots;
  }
}

}  // namespace

std::size_t Program::run(std::string& error, std::uint64_t* command_ns) const noexcept {
  const CommandSlot* const begin = stream.data();
  const CommandSlot* const end = begin + stream.size();
  std::size_t index = 0;
  try {
    if (command_ns != nullptr) {
      run_commands<true>(begin, end, index, command_ns);
    } else {
      run_commands<false>(begin, end, index, nullptr);
    }
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  return index;
}

}  // namespace retrace::cpu
