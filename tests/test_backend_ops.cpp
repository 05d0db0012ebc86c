// Every registered backend against the CPU device, in one process: the same ops on the same
// random inputs, results compared element by element (as ggml's test-backend-ops does). A
// backend that cannot run here is skipped with the reason; the CPU device is compared with a
// second CPU device (bit for bit), which keeps the harness itself honest.
#include "support.hpp"

#include <cmath>
#include <functional>

namespace retrace {
namespace {

using testing::random_floats;

struct OpCase {
  std::string name;
  std::vector<Shape> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> run;
  double tolerance_f32;  // relative to max(1, |cpu value|)
};

std::vector<OpCase> op_cases() {
  using T = std::vector<Tensor>;
  return {
      {"add broadcast", {{4, 1, 33}, {5, 33}}, [](const T& x) { return ops::add(x[0], x[1]); }, 0},
      {"sub", {{7, 65}, {7, 65}}, [](const T& x) { return ops::sub(x[0], x[1]); }, 0},
      {"mul scalar", {{129}}, [](const T& x) { return ops::mul(x[0], -1.5); }, 0},
      {"div", {{3, 40}, {40}}, [](const T& x) { return ops::div(x[0], ops::add(x[1], 3.0)); }, 1e-6},
      {"maximum", {{6, 20}, {6, 20}}, [](const T& x) { return ops::maximum(x[0], x[1]); }, 0},
      {"exp", {{300}}, [](const T& x) { return ops::exp(x[0]); }, 2e-6},
      {"log", {{300}}, [](const T& x) { return ops::log(ops::add(ops::abs(x[0]), 0.1)); }, 2e-6},
      {"tanh", {{300}}, [](const T& x) { return ops::tanh(x[0]); }, 2e-6},
      {"sigmoid", {{300}}, [](const T& x) { return ops::sigmoid(x[0]); }, 2e-6},
      {"silu", {{300}}, [](const T& x) { return ops::silu(x[0]); }, 2e-6},
      {"gelu", {{300}}, [](const T& x) { return ops::gelu(x[0]); }, 2e-6},
      {"gelu_tanh", {{300}}, [](const T& x) { return ops::gelu_tanh(x[0]); }, 2e-6},
      {"sin", {{300}}, [](const T& x) { return ops::sin(ops::mul(x[0], 40.0)); }, 2e-6},
      {"cos", {{300}}, [](const T& x) { return ops::cos(ops::mul(x[0], 40.0)); }, 2e-6},
      {"square", {{300}}, [](const T& x) { return ops::square(x[0]); }, 0},
      {"erf", {{300}}, [](const T& x) { return ops::erf(ops::mul(x[0], 3.0)); }, 2e-6},
      {"pow", {{4, 75}, {75}},
       [](const T& x) { return ops::pow(ops::add(ops::abs(x[0]), 0.1), ops::mul(x[1], 4.0)); }, 2e-6},
      {"clamp", {{300}}, [](const T& x) { return ops::clamp(x[0], -0.5, 0.25); }, 0},
      {"rsqrt", {{300}}, [](const T& x) { return ops::rsqrt(ops::add(ops::abs(x[0]), 0.5)); }, 2e-6},
      {"sum", {{9, 77}}, [](const T& x) { return ops::sum(x[0]); }, 1e-5},
      {"mean keepdim", {{9, 77}}, [](const T& x) { return ops::mean(x[0], ops::KeepDim::yes); }, 1e-5},
      {"max", {{9, 77}}, [](const T& x) { return ops::max(x[0]); }, 0},
      {"softmax", {{12, 50}}, [](const T& x) { return ops::softmax(x[0]); }, 1e-6},
      {"layer_norm", {{10, 64}, {64}, {64}},
       [](const T& x) { return ops::layer_norm(x[0], x[1], x[2]); }, 1e-5},
      {"rms_norm", {{10, 64}, {64}}, [](const T& x) { return ops::rms_norm(x[0], x[1]); }, 1e-5},
      {"matmul", {{2, 17, 31}, {31, 9}}, [](const T& x) { return ops::matmul(x[0], x[1]); }, 1e-5},
      {"matmul rank-1", {{31}, {2, 31, 9}}, [](const T& x) { return ops::matmul(x[0], x[1]); }, 1e-5},
      {"softmax in place", {{12, 50}},
       [](const T& x) {
         Tensor y = x[0].clone();
         ops::softmax(y, y);
         return y;
       },
       1e-6},
      {"matmul transposed", {{3, 8, 16}, {3, 12, 16}},
       [](const T& x) {
         return ops::matmul(x[0], x[1], ops::Transpose::no, ops::Transpose::yes);
       },
       1e-5},
      {"linear", {{5, 24}, {10, 24}, {10}},
       [](const T& x) { return ops::linear(x[0], x[1], x[2]); }, 1e-5},
      {"attention", {{1, 2, 6, 8}, {1, 2, 10, 8}, {1, 2, 10, 8}, {1, 1, 6, 10}},
       [](const T& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }, 1e-5},
      {"attention causal", {{1, 2, 6, 8}, {1, 2, 10, 8}, {1, 2, 10, 8}},
       [](const T& x) {
         return ops::scaled_dot_product_attention(x[0], x[1], x[2], {}, std::nullopt,
                                                  ops::Causal::yes);
       },
       1e-5},
      {"attention grouped-query", {{2, 6, 5, 8}, {2, 2, 9, 8}, {2, 2, 9, 4}, {6, 5, 9}},
       [](const T& x) {
         return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3], std::nullopt,
                                                  ops::Causal::yes);
       },
       1e-5},
      {"permute", {{2, 3, 4, 5}}, [](const T& x) { return ops::permute(x[0], {3, 1, 0, 2}); }, 0},
      {"slice", {{8, 21}}, [](const T& x) { return ops::slice(x[0], 1, 2, 19, 3); }, 0},
      {"concat", {{2, 5}, {3, 5}},
       [](const T& x) { return ops::concat(std::span<const Tensor>(x.data(), 2), 0); }, 0},
      {"typecast", {{100}}, [](const T& x) { return ops::typecast(x[0], DType::bfloat16); }, 0},
      {"arange", {{1}},
       [](const T& x) { return ops::arange(-1.5, 7.0, 0.125, *x[0].device(), x[0].dtype()); }, 0},
      {"to_layout", {{37, 45}}, [](const T& x) { return ops::to_layout(x[0], Layout::tile); }, 0},
      {"embedding", {{9, 7}},
       [](const T& x) {
         return ops::embedding(x[0], ops::arange(8, -1, -2, *x[0].device(), DType::int32));
       },
       0},
      {"gather", {{6, 5}},
       [](const T& x) {
         const Tensor idx = ops::reshape(ops::arange(0, 12, 1, *x[0].device(), DType::int32), {4, 3});
         return ops::gather(x[0], 0, ops::sub(ops::mul(idx, 7), ops::mul(ops::div(ops::mul(idx, 7), 6), 6)));
       },
       0},
  };
}

// A case's inputs on a device: the same host values on every device.
std::vector<Tensor> case_inputs(const OpCase& c, Device& device, DType dtype, std::uint64_t salt) {
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const auto n = static_cast<std::size_t>(c.inputs[i].numel());
    inputs.push_back(Tensor::from_vector<float>(random_floats(n, salt + i, -2.0f, 2.0f),
                                                c.inputs[i], dtype)
                         .to_device(device));
  }
  return inputs;
}

// Runs one case on a device.
// got within tolerance * max(1, |want|) of want; equal values (infinities) and NaN pairs too.
bool close(float got, float want, double tolerance) {
  if (got == want || (std::isnan(got) && std::isnan(want))) return true;
  return std::abs(got - want) <= tolerance * std::max(1.0f, std::abs(want));
}

std::vector<float> run_case(const OpCase& c, Device& device, DType dtype, std::uint64_t salt) {
  return c.run(case_inputs(c, device, dtype, salt)).to_vector<float>();
}

class BackendOpsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsTest, EveryOpAgreesWithTheCpuDevice) {
  const std::string backend = GetParam();
  if (const std::string reason = testing::backend_skip_reason(backend); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  auto cpu = open_device("cpu");
  auto other = testing::open_backend_device(backend, DeviceId{1});
  const bool exact = backend == "cpu";  // same kernels: bit for bit
  std::uint64_t salt = 1000;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    for (const OpCase& c : op_cases()) {
      salt += 10;
      SCOPED_TRACE(fmt::format("{} {} on {}", c.name, dtype, other->name()));
      std::vector<float> want, got;
      try {
        want = run_case(c, *cpu, dtype, salt);
      } catch (const Error& e) {
        ADD_FAILURE() << "the CPU device failed: " << e.what();
        continue;
      }
      try {
        got = run_case(c, *other, dtype, salt);
      } catch (const Error& e) {
        if (e.category() == ErrorCategory::unimplemented) continue;  // says so, by name
        ADD_FAILURE() << e.what();
        continue;
      }
      ASSERT_EQ(got.size(), want.size());
      // 16-bit results may differ by one rounding of a slightly different float.
      const double tolerance = dtype == DType::bfloat16  ? 1.0 / 64
                               : dtype == DType::float16 ? 1.0 / 512
                                                         : c.tolerance_f32;
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (exact || tolerance == 0.0) {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << "element " << i << ": " << got[i] << " vs " << want[i];
        } else {
          EXPECT_TRUE(close(got[i], want[i], tolerance))
              << "element " << i << ": " << got[i] << " vs " << want[i];
        }
      }
    }
  }
}

// Every CPU kernel variant (instruction set) against the baseline variant, on the same cases;
// within a variant, a replay of each case equals its eager run bit for bit.
}  // namespace

void PrintTo(const CpuKernelIsa& isa, std::ostream* os) { *os << isa.name; }

namespace {

class CpuVariantOpsTest : public ::testing::TestWithParam<CpuKernelIsa> {};

TEST_P(CpuVariantOpsTest, AgreesWithTheBaselineAndReplaysBitForBit) {
  const CpuKernelIsa& isa = GetParam();
  if (!isa.unusable.empty()) {
    GTEST_SKIP() << "the " << isa.name << " kernels cannot run on this CPU: it " << isa.unusable;
  }
  CpuDeviceOptions options;
  options.kernel_isa = cpu_kernel_isas().front().name;
  auto baseline = open_cpu_device(options);
  options.kernel_isa = isa.name;
  options.id = DeviceId{1};
  auto device = open_cpu_device(options);
  ASSERT_EQ(cpu_kernel_isa(*device), isa.name);
  std::uint64_t salt = 5000;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    for (const OpCase& c : op_cases()) {
      salt += 10;
      SCOPED_TRACE(fmt::format("{} {} with the {} kernels", c.name, dtype, isa.name));
      const std::vector<float> want = run_case(c, *baseline, dtype, salt);
      const std::vector<float> got = run_case(c, *device, dtype, salt);
      ASSERT_EQ(got.size(), want.size());
      // Variants may contract a*b+c into one FMA or sum in another order: float32 within the
      // case's tolerance (2 ulp for the exact ones), 16-bit floats within one rounding.
      const double tolerance = dtype == DType::bfloat16  ? 1.0 / 64
                               : dtype == DType::float16 ? 1.0 / 512
                                                         : std::max(c.tolerance_f32, 2e-7);
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(close(got[i], want[i], tolerance))
            << "element " << i << ": " << got[i] << " vs " << want[i];
      }
      // Traced == eager within the variant.
      const std::vector<Tensor> inputs = case_inputs(c, *device, dtype, salt);
      auto tracer = make_tracer([&c](const std::vector<Tensor>& x) { return c.run(x); }, *device);
      (void)tracer(inputs);                                     // capture
      const std::vector<float> replayed = tracer(inputs).to_vector<float>();  // replay
      ASSERT_EQ(tracer.stats().replays, 1u);
      ASSERT_EQ(replayed.size(), got.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(replayed[i]), std::bit_cast<std::uint32_t>(got[i]))
            << "element " << i << ": replay " << replayed[i] << " vs eager " << got[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Built, CpuVariantOpsTest, ::testing::ValuesIn(cpu_kernel_isas()),
                         [](const ::testing::TestParamInfo<CpuKernelIsa>& param) {
                           std::string name = param.param.name;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

std::vector<std::string> registered_backends() {
  std::vector<std::string> names;
  for (const BackendStatus& status : available_backends()) names.push_back(status.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendOpsTest, ::testing::ValuesIn(registered_backends()),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

}  // namespace
}  // namespace retrace
