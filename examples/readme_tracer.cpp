#include <retrace/retrace.hpp>

#include <cstdio>
#include <vector>

using retrace::Tensor;
namespace ops = retrace::ops;

// One denoising step: the model predicts a velocity from the latents and the timestep,
// and the Euler update moves the latents along it.
Tensor euler_step(const Tensor& latents, const Tensor& timestep, float dt) {
  Tensor velocity = ops::mul(ops::add(latents, 1.0), timestep);
  return ops::add(latents, ops::mul(velocity, dt));
}

int main() {
  auto device = retrace::open_cpu_device();
  auto step = retrace::make_tracer(euler_step, *device, {.name = "euler_step"});

  retrace::StateTensor timestep;  // same buffer for every step: the trace reads it in place
  Tensor latents = ops::full({1, 64}, 0.5, *device);
  for (int i = 0; i < 20; ++i) {
    const float t = 1.0f - 0.05f * static_cast<float>(i);
    timestep.update(std::vector<float>(64, t), {1, 64}, retrace::Traced::yes, *device,
                    retrace::DType::float32);
    // First call: capture (and run once). Later calls: replay. The input slot from
    // inputs() is passed back, so it costs no copy; the output is the same object each
    // call and is overwritten by the next replay, so copy it into the slot.
    const Tensor& next = step(step.trace_captured() ? std::get<0>(step.inputs()) : latents,
                              timestep.data(), -0.05f);
    ops::copy(next, std::get<0>(step.inputs()));
  }
  const float first = std::get<0>(step.inputs()).to_vector<float>()[0];
  std::printf("after 20 steps: %.6f (%llu capture, %llu replays)\n", static_cast<double>(first),
              static_cast<unsigned long long>(step.stats().captures),
              static_cast<unsigned long long>(step.stats().replays));
}
