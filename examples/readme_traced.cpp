#include <retrace/retrace.hpp>

#include <cstdio>

using retrace::Device;
using retrace::Tensor;
namespace ops = retrace::ops;

// 1. Context-bound: the device comes from the object; traces belong to the object.
struct Denoiser : retrace::TraceOwner {
  Device* device = nullptr;
  Tensor step(const Tensor& latents, float t) { return ops::add(ops::mul(latents, t), 1.0); }
};

// 2. Device parameter: found by its type. The non-tree parameter (a manager) is bound, and the
//    trace is chosen by its identity and the device's.
struct Communicator : retrace::TraceOwner {
  double scale = 0.5;
};
Tensor all_reduce_mean(const Tensor& x, Device& device, const Communicator& comm) {
  (void)device;
  return ops::mul(x, comm.scale);
}

// 3. Injected device: the function never sees one.
Tensor residual(const Tensor& x, const Tensor& h) { return ops::add(x, h); }

int main() {
  auto device = retrace::open_cpu_device();
  Tensor x = ops::full({1, 64}, 1.0, *device);

  auto step = retrace::traced_method(&Denoiser::step,
                                     [](Denoiser& d) -> Device& { return *d.device; });
  Denoiser denoiser;
  denoiser.device = device.get();
  Tensor eager = step.untraced(denoiser, x, 0.5f);  // a plain call
  const Tensor& traced = step(denoiser, x, 0.5f);   // captured (later calls replay)

  auto reduce = retrace::traced_function(all_reduce_mean);
  Communicator comm;
  const Tensor& reduced = reduce(x, *device, comm);

  auto add = retrace::traced_function_injected(residual);
  const Tensor& sum = add(*device, x, x);

  // Keyed traces: one per resolution, each replayed with its own shape.
  for (std::int64_t tokens : {64, 256, 64, 256}) {
    Tensor latents = ops::full({1, tokens}, 2.0, *device);
    step.call({.key = std::to_string(tokens)}, denoiser, latents, 0.5f);
  }

  // Automatic keys: a new input signature captures a new trace (and logs why).
  auto auto_add = retrace::traced_function_injected(
      residual, {.auto_key = true, .max_traces = 4, .name = "residual"});
  for (std::int64_t tokens : {16, 32, 16}) {
    Tensor t = ops::full({tokens}, 1.0, *device);
    auto_add(*device, t, t);
  }

  std::printf("eager %.2f traced %.2f reduced %.2f sum %.2f\n",
              static_cast<double>(eager.to_vector<float>()[0]),
              static_cast<double>(traced.to_vector<float>()[0]),
              static_cast<double>(reduced.to_vector<float>()[0]),
              static_cast<double>(sum.to_vector<float>()[0]));
  std::printf("denoiser traces: %zu, residual traces: %zu\n", step.live_traces(denoiser),
              auto_add.stats().live_traces);
}
