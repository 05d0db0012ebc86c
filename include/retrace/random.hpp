// Random numbers inside traces: a counter-based generator (Philox4x32-10) whose state lives on
// the device, so a draw is an ordinary device op. Captured into a trace, the draw reads the
// generator's state when the replay runs and advances it, so every replay draws new numbers,
// and eager runs and replays from the same seed and offset give the same numbers bit for bit.
//
//   retrace::Generator noise(device, /*seed=*/42);
//   Tensor z = retrace::ops::randn({1, 4, 32, 32}, noise);   // N(0, 1), float32
//   Tensor u = retrace::ops::rand({16}, noise);              // uniform in [0, 1)
//
// Each draw uses one offset: element i of the draw at offset k is a function of (seed, k, i)
// alone, whatever the shape, the backend's thread count or the kernel variant (the CPU and
// CUDA devices compute the same bits up to the last bit of a normal value's cos/log).
//
// A tracer's prep run (TraceOptions::prep_run) draws without advancing the generator, so the
// first traced call leaves it where one eager call would, and draws the same numbers.
//
// A traced function that draws must see the generator as part of its state, not as an input
// tensor (an input is copied into the trace's slot, and the copy would advance instead): use it
// from the traced code (a member of the traced object, a captured reference) or pass it as a
// bound argument (Generator is a TraceOwner: the traces that baked in its state are released
// when it is destroyed). Draws on one generator are ordered by the queue they are enqueued on;
// use one queue per generator (or order the queues with events).
#pragma once

#include "retrace/tensor.hpp"
#include "retrace/traced_function.hpp"

#include <cstdint>

namespace retrace {

class Generator : public TraceOwner {
 public:
  // A generator on `device` seeded with `seed`, at offset 0 (a host write to the device:
  // not during a capture on this thread).
  explicit Generator(Device& device, std::uint64_t seed = 0, QueueId queue = kDefaultQueue);
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  [[nodiscard]] Device& device() const;
  // The state: uint32 [4] = {seed low, seed high, offset low, offset high}, on the device.
  [[nodiscard]] const Tensor& state() const noexcept { return state_; }

  // Reseeds (offset back to 0) or moves to another offset: host writes, ordered after the
  // draws already enqueued on `queue`; not during a capture on this thread.
  void manual_seed(std::uint64_t seed, QueueId queue = kDefaultQueue);
  void set_offset(std::uint64_t offset, QueueId queue = kDefaultQueue);
  // Read back from the device (waits for the draws enqueued on `queue`).
  [[nodiscard]] std::uint64_t seed(QueueId queue = kDefaultQueue) const;
  [[nodiscard]] std::uint64_t offset(QueueId queue = kDefaultQueue) const;

 private:
  void write(std::uint64_t seed, std::uint64_t offset, QueueId queue);
  Tensor state_;
};

namespace ops {

// Standard normal values (mean 0, variance 1), float32, bfloat16 or float16, from one draw of `gen`
// (on gen's device). The out= form fills an existing tensor of gen's device (row-major).
[[nodiscard]] Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::float32,
                           QueueId queue = kDefaultQueue);
void randn(Generator& gen, const Tensor& out, QueueId queue = kDefaultQueue);
// Uniform values in [0, 1) (24 random bits for float32, 11 for float16, 8 for bfloat16).
[[nodiscard]] Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::float32,
                          QueueId queue = kDefaultQueue);
void rand(Generator& gen, const Tensor& out, QueueId queue = kDefaultQueue);

}  // namespace ops

}  // namespace retrace
