// Property test: random small programs of ops, traced and replayed, equal eager execution bit for
// bit, on fresh inputs too. The seed is printed (RETRACE_TEST_SEED overrides it); a failure
// prints the program.
#include "support.hpp"

#include <functional>
#include <random>

namespace retrace {
namespace {

struct Step {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&, std::size_t, std::size_t)> apply;
};

// Ops mapping [4, 8] tensors (two picked from the pool) to a [4, 8] tensor with bounded values
// (some of them strided views).
std::vector<Step> step_library() {
  using V = const std::vector<Tensor>&;
  return {
      {"add", [](V p, std::size_t i, std::size_t j) { return ops::add(p[i], p[j]); }},
      {"sub", [](V p, std::size_t i, std::size_t j) { return ops::sub(p[i], p[j]); }},
      {"mul", [](V p, std::size_t i, std::size_t j) { return ops::tanh(ops::mul(p[i], p[j])); }},
      {"div", [](V p, std::size_t i, std::size_t j) {
         return ops::div(p[i], ops::add(ops::abs(p[j]), 1.0));
       }},
      {"maximum", [](V p, std::size_t i, std::size_t j) { return ops::maximum(p[i], p[j]); }},
      {"minimum-row", [](V p, std::size_t i, std::size_t j) {
         return ops::minimum(p[i], ops::slice(p[j], 0, 1, 2));  // broadcast a [1, 8] row
       }},
      {"add-column", [](V p, std::size_t i, std::size_t j) {
         return ops::add(p[i], ops::slice(p[j], 1, 3, 4));  // broadcast a [4, 1] column
       }},
      {"scalar", [](V p, std::size_t i, std::size_t) { return ops::mul(ops::sub(p[i], 0.25), 0.5); }},
      {"sigmoid", [](V p, std::size_t i, std::size_t) { return ops::sigmoid(p[i]); }},
      {"silu", [](V p, std::size_t i, std::size_t) { return ops::silu(p[i]); }},
      {"gelu", [](V p, std::size_t i, std::size_t) { return ops::gelu(p[i]); }},
      {"sin-cos", [](V p, std::size_t i, std::size_t j) {
         return ops::mul(ops::sin(p[i]), ops::cos(ops::square(p[j])));
       }},
      {"erf-clamp", [](V p, std::size_t i, std::size_t) {
         return ops::erf(ops::clamp(p[i], -1.5, 1.0));
       }},
      {"pow", [](V p, std::size_t i, std::size_t j) {
         return ops::pow(ops::add(ops::abs(p[i]), 0.5), ops::clamp(p[j], -2.0, 2.0));
       }},
      {"relu-neg", [](V p, std::size_t i, std::size_t) { return ops::neg(ops::relu(p[i])); }},
      {"softmax", [](V p, std::size_t i, std::size_t) { return ops::softmax(p[i]); }},
      {"layer_norm", [](V p, std::size_t i, std::size_t j) {
         return ops::layer_norm(p[i], ops::reshape(ops::slice(p[j], 0, 0, 1), {8}));
       }},
      {"rms_norm", [](V p, std::size_t i, std::size_t) { return ops::rms_norm(p[i]); }},
      {"matmul", [](V p, std::size_t i, std::size_t j) {
         return ops::tanh(ops::matmul(ops::matmul(p[i], p[j], ops::Transpose::no,
                                                  ops::Transpose::yes),
                                      p[j]));
       }},
      {"linear", [](V p, std::size_t i, std::size_t j) {
         return ops::tanh(ops::linear(p[i], ops::concat(std::vector<Tensor>{p[j], p[j]}, 0)));
       }},
      {"transpose", [](V p, std::size_t i, std::size_t) {
         return ops::reshape(ops::transpose(ops::reshape(p[i], {4, 2, 4}), 0, 2), {4, 8});
       }},
      {"chunk-concat", [](V p, std::size_t i, std::size_t) {
         auto parts = ops::chunk(p[i], 3, 1);
         std::swap(parts[0], parts[2]);
         return ops::concat(parts, 1);
       }},
      // Views (strided, no copy) of earlier values, which later steps read.
      {"transposed-view", [](V p, std::size_t i, std::size_t) {
         return ops::transpose(ops::reshape(p[i], {8, 4}), 0, 1);
       }},
      {"stepped-view", [](V p, std::size_t i, std::size_t j) {
         return ops::slice(ops::concat(std::vector<Tensor>{p[i], p[j]}, 1), 1, 1, 16, 2);
       }},
      {"expanded-view", [](V p, std::size_t i, std::size_t) {
         return ops::expand(ops::slice(p[i], 0, 2, 3), {4, 8});
       }},
      {"attention", [](V p, std::size_t i, std::size_t j) {
         const Tensor q = ops::reshape(p[i], {1, 2, 4, 4});
         const Tensor k = ops::reshape(p[j], {1, 2, 4, 4});
         return ops::reshape(ops::scaled_dot_product_attention(q, k, k), {4, 8});
       }},
  };
}

TEST(RandomProgramsTest, ReplayEqualsEagerBitForBit) {
  const std::vector<Step> library = step_library();
  std::mt19937_64 rng(testing::test_seed() + 4242);
  RETRACE_TEST_DEVICE(device, {.guard_bytes = 64});
  for (int program = 0; program < 40; ++program) {
    // A program: 3 inputs, 4 to 12 steps, each reading two earlier values.
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> steps;
    std::string text;
    const int length = 4 + static_cast<int>(rng() % 9);
    for (int s = 0; s < length; ++s) {
      const std::size_t available = 3 + static_cast<std::size_t>(s);
      steps.emplace_back(rng() % library.size(), rng() % available, rng() % available);
      const auto& [op, a, b] = steps.back();
      text += fmt::format("v{} = {}(v{}, v{}); ", available, library[op].name, a, b);
    }
    auto run = [&](const std::vector<Tensor>& inputs) {
      std::vector<Tensor> values = inputs;
      for (const auto& [op, a, b] : steps) values.push_back(library[op].apply(values, a, b));
      return ops::add(values.back(), values[values.size() - 2]);
    };
    const DType dtype = program % 2 == 0 ? DType::float32 : DType::bfloat16;
    auto inputs = [&](std::uint64_t salt) {
      std::vector<Tensor> in;
      for (std::uint64_t i = 0; i < 3; ++i) {
        in.push_back(testing::device_tensor(*device, testing::random_floats(32, salt + i), {4, 8},
                                            dtype));
      }
      return in;
    };
    const std::string where = fmt::format("program {} ({}): {}", program, dtype_name(dtype), text);
    try {
    {
    auto tracer = make_tracer(run, *device);
    const std::vector<Tensor> first = inputs(1000 * static_cast<std::uint64_t>(program));
    const std::vector<float> eager_first = run(first).to_vector<float>();
    ASSERT_EQ(tracer(first).to_vector<float>(), eager_first)
        << "program " << program << " (" << dtype_name(dtype) << "): " << text;
    const std::vector<Tensor> second = inputs(1000 * static_cast<std::uint64_t>(program) + 500);
    const std::vector<float> eager_second = run(second).to_vector<float>();
    ASSERT_EQ(tracer(second).to_vector<float>(), eager_second)
        << "program " << program << " on fresh inputs: " << text;
    for (float v : eager_second) ASSERT_TRUE(std::isfinite(v)) << text;
    }
    device->synchronize();  // guard damage in any freed buffer of this program surfaces here
    } catch (const Error& e) {
      FAIL() << e.what() << " in " << where;
    }
  }
}

}  // namespace
}  // namespace retrace
