// The host inputs of one DiT sampler step that the mesh benchmarks time (no guidance, DDIM step 3
// of 10, latents of 0.5, label 1): the same for the one-device and the mesh runs.
#pragma once

#include <retrace/models/dit.hpp>
#include <retrace/tensor.hpp>

#include <cstdint>
#include <vector>

namespace retrace::bench {

struct StepInputs {
  Tensor latents, t, labels, ab;
};

inline StepInputs step_inputs(const models::DiT& model) {
  const models::DiTConfig& c = model.config();
  const models::DdimSchedule schedule(10);
  const Shape shape{1, c.in_channels, c.input_size, c.input_size};
  const std::vector<std::int64_t> label{1};
  return {Tensor::from_vector<float>(
              std::vector<float>(static_cast<std::size_t>(shape.numel()), 0.5f), shape, c.dtype),
          Tensor::from_vector<float>(model.timestep_frequencies({&schedule.timesteps[3], 1}),
                                     {1, c.frequency_size}, c.dtype),
          Tensor::from_vector<float>(model.label_rows(label), {1, c.num_classes + 1}, c.dtype),
          Tensor::from_vector<float>(schedule.coefficients(3), {2}, c.dtype)};
}

}  // namespace retrace::bench
