// The short code fragments of the documentation, each in a function of a program that CTest
// builds and runs (example_snippets): docs/*.md show the regions between `docs-snippet: NAME`
// and `docs-snippet-end`, and scripts/docs.py checks that they match. Each function checks
// what its fragment promises and throws if it does not hold.
#include <retrace/retrace.hpp>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using retrace::Blocking;
using retrace::Tensor;
using retrace::TraceId;
namespace ops = retrace::ops;

void expect(bool holds, const std::string& what) {
  if (!holds) throw std::runtime_error("snippet check failed: " + what);
}

void opening_devices() {
  // docs-snippet: open_device
  auto cpu = retrace::open_device("cpu");  // cpu:0
  for (const retrace::BackendStatus& b : retrace::available_backends()) {
    std::printf("backend %s: %s\n", b.name.c_str(), b.available ? "available" : b.reason.c_str());
  }
  auto options = retrace::default_device_options("cpu:1");  // the backend's defaults, changed
  options.memory_bytes = std::size_t{256} << 20;
  auto second = retrace::open_device("cpu:1", options);
  // docs-snippet-end
  expect(cpu->name() == "cpu:0" && second->name() == "cpu:1", "device names");
}

void capture_and_replay() {
  auto device_owner = retrace::open_device("cpu");
  retrace::Device* device = device_owner.get();
  const std::vector<float> values(256, 1.0f), new_values_on_host(256, 3.0f);
  // docs-snippet: device_direct
  Tensor x =
      Tensor::from_vector<float>(values, {1, 256}, retrace::DType::float32).to_device(*device);

  device->begin_trace_capture(retrace::kDefaultQueue);  // queue 0 records instead of running
  Tensor y = ops::add(ops::mul(x, 2.0), 1.0);
  TraceId trace = device->end_trace_capture(retrace::kDefaultQueue);

  ops::copy(Tensor::from_vector<float>(new_values_on_host, {1, 256}, retrace::DType::float32),
            x);  // refresh the input in place
  device->execute_trace(trace, retrace::kDefaultQueue, Blocking::yes);
  std::vector<float> result = y.to_vector<float>();  // 2 * 3 + 1 = 7 everywhere
  device->release_trace(trace);
  // docs-snippet-end
  expect(result.front() == 7.0f && result.back() == 7.0f, "the replay read the new input");
}

Tensor euler_step(const Tensor& latents, const Tensor& timestep, float dt) {
  return ops::add(latents, ops::mul(ops::mul(latents, timestep), dt));
}

void tracer_call() {
  auto device = retrace::open_device("cpu");
  Tensor latents = ops::full({1, 4}, 1.0, *device);
  retrace::StateTensor timestep;
  timestep.update(std::vector<float>{0.5f}, {1}, retrace::Traced::yes, *device,
                  retrace::DType::float32);
  const float dt = 0.1f;
  // docs-snippet: make_tracer
  auto step = retrace::make_tracer(euler_step, *device, {.name = "euler_step"});
  const Tensor& next = step(latents, timestep.data(), dt);  // captures; later calls replay
  // docs-snippet-end
  expect(std::fabs(next.to_vector<float>()[0] - 1.05f) < 1e-6f, "the traced step's value");
}

void random_numbers() {
  auto device = retrace::open_device("cpu");
  Tensor x = ops::full({2, 8}, 0.0, *device);
  // docs-snippet: generator
  retrace::Generator noise(*device, /*seed=*/42);
  auto step = retrace::make_tracer(
      [&](const Tensor& in) { return ops::add(in, ops::mul(ops::randn(in.shape(), noise), 0.1)); },
      *device);
  const std::vector<float> first = step(x).to_vector<float>();   // captures; draws at offset 0
  const std::vector<float> second = step(x).to_vector<float>();  // replays; draws at offset 1
  noise.manual_seed(42);  // (outside a capture) the next call draws offset 0's numbers again
  const std::vector<float> again = step(x).to_vector<float>();  // == first
  // docs-snippet-end
  expect(first != second && again == first, "draws advance per replay and follow the seed");
}

}  // namespace

int main() {
  opening_devices();
  capture_and_replay();
  tracer_call();
  random_numbers();
  std::printf("snippets: all checks hold\n");
  return 0;
}
