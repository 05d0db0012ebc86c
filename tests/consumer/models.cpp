// A program of someone else's project using retrace::models, built against retrace through
// find_package(retrace) or add_subdirectory: it writes a small DiT checkpoint in the reference
// layout, loads it back and samples a class with a traced DDIM step (docs/models.md shows the
// loop), then checks the traced result against an eager run of the same steps.
#include <retrace/models/dit.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/retrace.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using retrace::Tensor;

namespace {

Tensor upload(const std::vector<float>& values, const retrace::Shape& shape,
              retrace::Device& device) {
  return Tensor::from_vector<float>(values, shape, retrace::DType::float32).to_device(device);
}

std::vector<float> standard_normal(std::size_t count) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

}  // namespace

int main() {
  auto device = retrace::open_device("cpu");
  const std::string path =
      (std::filesystem::temp_directory_path() / "retrace_consumer_dit.safetensors").string();
  retrace::models::DiTConfig small;
  small.input_size = 8;
  small.hidden = 64;
  small.depth = 1;
  small.heads = 1;
  small.num_classes = 10;
  retrace::models::write_safetensors(path, retrace::models::DiT(small, *device).weights());
  const std::int64_t steps = 5;
  const std::vector<float> noise = standard_normal(4 * 8 * 8);

  // docs-snippet: sample
  auto weights = retrace::models::load_safetensors(path, *device);
  retrace::models::DiT model(retrace::models::infer_dit_config(weights), *device, weights);
  const retrace::models::DdimSchedule schedule(steps);
  const retrace::models::DiTConfig& c = model.config();
  const double cfg_scale = 4.0;  // guidance: class 7 and the null class in one batch of 2
  auto step = retrace::make_tracer(
      [&](const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& ab) {
        return model.sample_step(x, t, labels, ab, cfg_scale);
      },
      *device);
  const std::vector<std::int64_t> classes{7, c.num_classes};  // the last row is the null class
  const Tensor labels = upload(model.label_rows(classes), {2, c.num_classes + 1}, *device);
  const Tensor latents = upload(noise, {1, c.in_channels, c.input_size, c.input_size}, *device);
  retrace::StateTensor t, ab;  // one buffer each, refreshed in place before every replay
  for (std::size_t i = 0; i < schedule.timesteps.size(); ++i) {
    t.update(model.timestep_frequencies({&schedule.timesteps[i], 1}), {1, c.frequency_size},
             retrace::Traced::yes, *device, retrace::DType::float32);
    ab.update(schedule.coefficients(i), {2}, retrace::Traced::yes, *device,
              retrace::DType::float32);
    // The latents go back into the trace's input slot: the next replay reads them there.
    const Tensor& x = step.trace_captured() ? std::get<0>(step.inputs()) : latents;
    const Tensor& next = step(x, t.data(), labels, ab.data());  // capture once, then replays
    retrace::ops::copy(next, std::get<0>(step.inputs()));
  }
  const std::vector<float> sample = std::get<0>(step.inputs()).to_vector<float>();
  // docs-snippet-end

  Tensor x = upload(noise, {1, c.in_channels, c.input_size, c.input_size}, *device);
  for (std::size_t i = 0; i < schedule.timesteps.size(); ++i) {
    const Tensor tf = upload(model.timestep_frequencies({&schedule.timesteps[i], 1}),
                             {1, c.frequency_size}, *device);
    x = model.sample_step(x, tf, labels, upload(schedule.coefficients(i), {2}, *device), cfg_scale);
  }
  const std::vector<float> eager = x.to_vector<float>();
  std::filesystem::remove(path);
  const bool identical = std::memcmp(sample.data(), eager.data(), sample.size() * 4) == 0;
  std::printf("consumer models: DiT depth %lld, hidden %lld: %lld traced DDIM steps, %s eager\n",
              static_cast<long long>(c.depth), static_cast<long long>(c.hidden),
              static_cast<long long>(steps), identical ? "identical to" : "DIFFERENT from");
  return identical ? 0 : 1;
}
