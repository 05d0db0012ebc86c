// Generator and the random ops (rand, randn): one "random" kernel launch per draw.
#include "retrace/random.hpp"

#include "ops/checks.hpp"
#include "retrace/device.hpp"

#include <array>

namespace retrace {

using ops::detail::check_dtype_in;
using ops::detail::kFloatTypes;
using ops::detail::data_of;
using ops::detail::device_of;

Generator::Generator(Device& device, std::uint64_t seed, QueueId queue)
    : state_(Tensor::empty({4}, DType::uint32, device)) {
  write(seed, 0, queue);
}

Device& Generator::device() const { return device_of(state_, "Generator", "state"); }

void Generator::write(std::uint64_t seed, std::uint64_t offset, QueueId queue) {
  const std::array<std::uint32_t, 4> words{
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
      static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32)};
  const Tensor host = Tensor::from_vector<std::uint32_t>(words, {4}, DType::uint32);
  ops::copy(host, state_, queue);
}

void Generator::manual_seed(std::uint64_t seed, QueueId queue) { write(seed, 0, queue); }

void Generator::set_offset(std::uint64_t offset, QueueId queue) {
  write(this->seed(queue), offset, queue);
}

namespace {
std::uint64_t join(std::uint32_t lo, std::uint32_t hi) { return lo | (std::uint64_t{hi} << 32); }
}  // namespace

std::uint64_t Generator::seed(QueueId queue) const {
  const std::vector<std::uint32_t> words = state_.to_vector<std::uint32_t>(queue);
  return join(words[0], words[1]);
}

std::uint64_t Generator::offset(QueueId queue) const {
  const std::vector<std::uint32_t> words = state_.to_vector<std::uint32_t>(queue);
  return join(words[2], words[3]);
}

namespace ops {

namespace {

void draw(const char* op, Generator& gen, const Tensor& out, RandomDist dist, QueueId queue) {
  Device& device = device_of(out, op, "out");
  Device& home = device_of(gen.state(), op, "generator");
  RETRACE_CHECK(&device == &home, invalid_argument,
                "{}: out is on {} but the generator on {}", op, device.name(), home.name());
  check_dtype_in(out, op, "out", kFloatTypes);
  RETRACE_CHECK(out.layout() == Layout::row_major, invalid_argument,
                "{}: out must be row-major, got {}", op, out.layout());
  ops::detail::check_dense_out(out, op);
  // An empty draw still advances the generator, so the offsets do not depend on shapes. A
  // tracer's prep run draws without advancing: the capture then draws what an eager call would.
  RandomParams params{static_cast<std::uint32_t*>(data_of(gen.state())), data_of(out),
                      out.shape().numel(), out.dtype(), dist, !retrace::detail::in_prep_run()};
  Buffer* buffers[] = {gen.state().buffer().get(), out.buffer().get()};
  device.enqueue(queue, make_launch(op, params, buffers));
}

Tensor draw_new(const char* op, const Shape& shape, Generator& gen, DType dtype,
                RandomDist dist, QueueId queue) {
  RETRACE_CHECK(dtype_info(dtype).is_floating, invalid_argument,
                "{}: dtype must be float32, bfloat16 or float16, got {}", op, dtype);
  Tensor out = Tensor::empty(shape, dtype, device_of(gen.state(), op, "generator"));
  draw(op, gen, out, dist, queue);
  return out;
}

}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype, QueueId queue) {
  return draw_new("randn", shape, gen, dtype, RandomDist::normal, queue);
}
void randn(Generator& gen, const Tensor& out, QueueId queue) {
  draw("randn", gen, out, RandomDist::normal, queue);
}
Tensor rand(const Shape& shape, Generator& gen, DType dtype, QueueId queue) {
  return draw_new("rand", shape, gen, dtype, RandomDist::uniform, queue);
}
void rand(Generator& gen, const Tensor& out, QueueId queue) {
  draw("rand", gen, out, RandomDist::uniform, queue);
}

}  // namespace ops

}  // namespace retrace
