// StateTensor: rebinding, in-place traced updates, and the timestep pattern of a denoising loop.
#include "support.hpp"

namespace retrace {
namespace {

TEST(StateTensorTest, UntracedRebindsTracedCopiesInPlace) {
  RETRACE_TEST_DEVICE(device);
  StateTensor state;
  EXPECT_FALSE(state.has_value());
  Tensor a = ops::full({2}, 1.0, *device);
  state.update(a, Traced::yes);  // first update: rebinds even when traced
  EXPECT_EQ(state.data().address(), a.address());
  Tensor b = ops::full({2}, 2.0, *device);
  state.update(b, Traced::no);
  EXPECT_EQ(state.data().address(), b.address());
  const std::uint64_t address = state.data().address();
  state.update(ops::full({2}, 3.0, *device), Traced::yes);
  EXPECT_EQ(state.data().address(), address);
  EXPECT_EQ(state.value().to_vector<float>(), std::vector<float>(2, 3.0f));
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(2, 3.0f));  // b is the state's buffer
}

TEST(StateTensorTest, HostValuesAreUploadedAsBFloat16ByDefault) {
  RETRACE_TEST_DEVICE(device);
  StateTensor state;
  state.update(std::vector<float>{0.1f, 0.2f}, {2}, Traced::yes, *device);
  EXPECT_EQ(state.data().dtype(), DType::bfloat16);
  EXPECT_EQ(state.data().device(), device.get());
  const std::uint64_t address = state.data().address();
  state.update(std::vector<float>{0.5f, 0.25f}, {2}, Traced::yes, *device);
  EXPECT_EQ(state.data().address(), address);
  EXPECT_EQ(state.data().to_vector<float>(), (std::vector<float>{0.5f, 0.25f}));
  state.update(std::vector<float>{1.0f}, {1}, Traced::no, *device, DType::float32);
  EXPECT_EQ(state.data().dtype(), DType::float32);
}

TEST(StateTensorTest, TracedUpdateMustKeepShapeAndDType) {
  RETRACE_TEST_DEVICE(device);
  StateTensor state;
  state.update(std::vector<float>{1.0f, 2.0f}, {2}, Traced::no, *device);
  EXPECT_RETRACE_ERROR(state.update(std::vector<float>{1.0f}, {1}, Traced::yes, *device),
                       invalid_argument, "must keep the state's shape, dtype and layout ([2] "
                                         "bfloat16 row_major), got [1] bfloat16 row_major");
  EXPECT_RETRACE_ERROR(
      state.update(std::vector<float>{1.0f, 2.0f}, {2}, Traced::yes, *device, DType::float32),
      invalid_argument, "got [2] float32");
  EXPECT_RETRACE_ERROR(state.update(Tensor(), Traced::yes), invalid_argument, "null tensor");
  StateTensor empty;
  EXPECT_RETRACE_ERROR(
      empty.update(Tensor::from_vector<float>({1.0f}, {1}, DType::float32), Traced::no),
      invalid_argument, "needs a device");
}

// The pattern of a denoising loop: the timestep lives in a StateTensor updated in place before
// each replay, and the latents are fed back through the tracer's input slot.
TEST(StateTensorTest, TimestepInsideAReplayedLoopMatchesEager) {
  RETRACE_TEST_DEVICE(device);
  auto step = [](const Tensor& latents, const Tensor& t) {
    Tensor velocity = ops::mul(ops::add(latents, 1.0), t);
    return ops::add(latents, ops::mul(velocity, -0.1));
  };
  auto run = [&](bool traced) {
    auto tracer = make_tracer(step, *device);
    StateTensor timestep;
    Tensor latents = ops::full({16}, 0.5, *device, DType::float32);
    for (int i = 0; i < 10; ++i) {
      const float t = 1.0f - 0.1f * static_cast<float>(i);
      timestep.update(std::vector<float>(16, t), {16}, traced ? Traced::yes : Traced::no, *device,
                      DType::float32);
      if (traced) {
        const Tensor& next = tracer(tracer.trace_captured() ? std::get<0>(tracer.inputs())
                                                            : latents,
                                    timestep.data());
        ops::copy(next, std::get<0>(tracer.inputs()));  // feed back into the slot
        EXPECT_EQ(tracer.stats().copies, 0u) << "step " << i;
      } else {
        latents = step(latents, timestep.data());
      }
    }
    return traced ? std::get<0>(tracer.inputs()).to_vector<float>() : latents.to_vector<float>();
  };
  EXPECT_EQ(run(true), run(false));
}

}  // namespace
}  // namespace retrace
