// The example DiT: traced steps equal eager steps bit for bit (two resolutions, both dtypes),
// and the safetensors reader: round trip, and each malformed file rejected with a clear error.
#include "support.hpp"

#include <retrace/models/dit.hpp>
#include <retrace/models/safetensors.hpp>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>

namespace retrace {
namespace {

using models::DiT;
using models::DiTConfig;

class DiTTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Device> device_ = open_cpu_device(CpuDeviceOptions{.guard_bytes = 64});
};

TEST_P(DiTTest, TracedStepsEqualEagerAtTwoResolutions) {
  DiT model(DiTConfig{.tokens = 16, .hidden = 32, .depth = 2, .heads = 2, .dtype = GetParam()},
            *device_);
  auto step = traced_method(&DiT::euler_step, [](DiT& m) -> Device& { return m.device(); });
  const std::vector<float> ts = models::euler_timesteps(3);
  for (std::int64_t tokens : {16, 8}) {
    const std::string key = std::to_string(tokens);
    const auto start = testing::random_floats(static_cast<std::size_t>(tokens * 32), tokens);
    Tensor eager = testing::device_tensor(*device_, start, {1, tokens, 32}, GetParam());
    Tensor slot = testing::device_tensor(*device_, start, {1, tokens, 32}, GetParam());
    StateTensor t;
    for (float time : ts) {
      const auto features = model.timestep_features(time);
      eager = model.euler_step(eager, testing::device_tensor(*device_, features, {1, 32}, GetParam()),
                               -1.0f / 3);
      t.update(features, {1, 32}, Traced::yes, *device_, GetParam());
      const Tensor& next = step.call(CallOptions{.key = key}, model, slot, t.data(), -1.0f / 3);
      ops::copy(next, slot);
    }
    EXPECT_EQ(slot.to_vector<float>(), eager.to_vector<float>()) << tokens << " tokens";
    for (float v : slot.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(step.live_traces(model), 2u);
  EXPECT_EQ(step.stats().replays, 4u);
}

INSTANTIATE_TEST_SUITE_P(DTypes, DiTTest, ::testing::Values(DType::float32, DType::bfloat16),
                         [](const auto& param_info) { return std::string(dtype_name(param_info.param)); });

TEST(DiTModelTest, RejectsBadConfigsAndWeights) {
  auto device = open_cpu_device();
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.hidden = 30, .heads = 4}, *device), invalid_argument,
                       "hidden (30) must be even and divisible by heads (4)");
  std::map<std::string, Tensor> weights;
  EXPECT_RETRACE_ERROR(DiT(DiTConfig{.hidden = 8, .depth = 1, .heads = 2}, *device, weights),
                       invalid_argument, "the weights have no tensor \"t_embedder.mlp.0.weight\"");
  DiT model(DiTConfig{.tokens = 4, .hidden = 8, .depth = 1, .heads = 2}, *device);
  EXPECT_RETRACE_ERROR((void)model.forward(ops::full({1, 4, 6}, 0.0, *device), ops::full({1, 8}, 0.0, *device)),
                       invalid_argument, "latents must be [1, tokens, 8], got [1, 4, 6]");
}

// Writes DiT weights holding a NaN to $RETRACE_NAN_WEIGHTS, for the CLI test that checks the
// demo compares traced and eager results bit for bit (NaN == NaN there).
TEST(DiTWeightsTest, WritesWeightsWithANaNForTheCli) {
  const char* out = std::getenv("RETRACE_NAN_WEIGHTS");
  if (out == nullptr) GTEST_SKIP() << "RETRACE_NAN_WEIGHTS is not set (set by CTest)";
  auto device = open_cpu_device();
  const DiTConfig config{.tokens = 8, .hidden = 32, .depth = 1, .heads = 2, .seed = 3};
  DiT seeded(config, *device);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, shape] : DiT::weight_shapes(config)) weights[name] = seeded.weight(name);
  std::vector<float> bias = weights["final_layer.linear.bias"].to_vector<float>();
  bias[3] = std::numeric_limits<float>::quiet_NaN();
  weights["final_layer.linear.bias"] = Tensor::from_vector<float>(bias, {32}, DType::float32);
  models::write_safetensors(out, weights);
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() / "retrace_safetensors_test";
    std::filesystem::create_directories(dir);
    return (dir / name).string();
  }
  // Writes an 8-byte length, the header text and the data bytes.
  std::string raw_file(const std::string& name, const std::string& header, std::size_t data_bytes,
                       std::optional<std::uint64_t> claimed = std::nullopt) {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t size = claimed.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << std::string(data_bytes, '\0');
    return p;
  }
};

TEST_F(SafetensorsTest, RoundTripGivesTheSameModel) {
  auto device = open_cpu_device();
  const DiTConfig config{.tokens = 8, .hidden = 16, .depth = 1, .heads = 2, .seed = 5};
  DiT seeded(config, *device);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, shape] : DiT::weight_shapes(config)) weights[name] = seeded.weight(name);
  weights["extra.u8"] = Tensor::from_vector<float>({1.0f, 2.0f}, {2}, DType::uint8);
  const std::string file = path("model.safetensors");
  models::write_safetensors(file, weights);
  const auto loaded = models::read_safetensors(file);
  EXPECT_EQ(loaded.size(), weights.size());
  EXPECT_EQ(loaded.at("extra.u8").to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  DiT reloaded(config, *device, loaded);
  Tensor x = ops::full({1, 8, 16}, 0.3, *device);
  Tensor t = Tensor::from_vector<float>(seeded.timestep_features(0.7f), {1, 16}, DType::float32)
                 .to_device(*device);
  EXPECT_EQ(reloaded.forward(x, t).to_vector<float>(), seeded.forward(x, t).to_vector<float>());
}

TEST_F(SafetensorsTest, ReadsHalfAndBFloat16) {
  // F16 1.0 = 0x3c00, -2.0 = 0xc000; BF16 1.5 = 0x3fc0.
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"__metadata__":{"format":"pt"}})";
  const std::string p = path("half.safetensors");
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t size = header.size();
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << header;
  const unsigned char data[] = {0x00, 0x3c, 0x00, 0xc0, 0xc0, 0x3f};
  out.write(reinterpret_cast<const char*>(data), sizeof data);
  out.close();
  const auto t = models::read_safetensors(p);
  EXPECT_EQ(t.at("h").dtype(), DType::float32);
  EXPECT_EQ(t.at("h").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(t.at("b").dtype(), DType::bfloat16);
  EXPECT_EQ(t.at("b").to_vector<float>(), (std::vector<float>{1.5f}));
}

TEST_F(SafetensorsTest, MalformedFilesAreClearErrors) {
  const std::string tiny = path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(tiny), invalid_argument,
                       "is truncated: 3 bytes, not even the 8-byte header length");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(raw_file("long.safetensors", "{}", 0, 100)),
                       invalid_argument, "is truncated: the header claims 100 bytes");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(raw_file("json.safetensors", "{not json", 0)),
                       invalid_argument, "the header is not valid JSON");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file("fields.safetensors", R"({"w":{"dtype":"F32"}})", 0)),
      invalid_argument, "tensor \"w\" needs dtype, shape and data_offsets");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "dtype.safetensors", R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\" has dtype F64; supported: F32, BF16, F16, I32, U32, U8");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)),
      invalid_argument, "tensor \"w\" has data_offsets outside the 8 bytes of data");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\" has 8 bytes of data but shape [3] of F32 needs 12");
  EXPECT_RETRACE_ERROR(
      (void)models::read_safetensors(raw_file(
          "types.safetensors", R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,8]}})", 8)),
      invalid_argument, "tensor \"w\": shape must be an array");
  EXPECT_RETRACE_ERROR((void)models::read_safetensors(path("missing.safetensors")),
                       invalid_argument, "cannot open");
}

}  // namespace
}  // namespace retrace
