// Helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>
#include <retrace/backend.hpp>
#include <retrace/retrace.hpp>
#if RETRACE_TEST_HAVE_CUDA
#include <retrace/cuda.hpp>
#endif

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// Expects `statement` to throw retrace::Error of `category` whose message contains `fragment`.
#define EXPECT_RETRACE_ERROR(statement, category_, fragment)                                 \
  do {                                                                                       \
    bool thrown_ = false;                                                                    \
    try {                                                                                    \
      statement;                                                                             \
    } catch (const ::retrace::Error& e_) {                                                   \
      thrown_ = true;                                                                        \
      EXPECT_EQ(e_.category(), ::retrace::ErrorCategory::category_)                          \
          << "message: " << e_.message();                                                    \
      EXPECT_NE(e_.message().find(fragment), std::string::npos)                              \
          << "expected fragment \"" << (fragment) << "\" in: " << e_.message();              \
    }                                                                                        \
    EXPECT_TRUE(thrown_) << "expected " #statement " to throw";                              \
  } while (false)

namespace retrace::testing {

// Seed for random inputs: RETRACE_TEST_SEED overrides it; the seed is logged so any failure
// can be replayed.
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    const char* env = std::getenv("RETRACE_TEST_SEED");
    const std::uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : 20261202u;
    std::printf("[retrace] random seed %llu (set RETRACE_TEST_SEED to override)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t salt = 0, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(test_seed() + salt);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The backend the device-generic suites (ops, tracer, traced functions, lifetimes) run on:
// RETRACE_TEST_BACKEND=<a registered backend> (default cpu). CTest runs those suites once per
// backend the build has.
inline std::string test_backend() {
  const char* env = std::getenv("RETRACE_TEST_BACKEND");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("cpu");
}

// Why devices of `backend` cannot be opened here ("" when they can), from the registry.
inline std::string backend_skip_reason(const std::string& backend) {
  std::string known;
  for (const BackendStatus& status : available_backends()) {
    if (status.name == backend) {
      return status.available ? std::string()
                              : "the " + backend + " backend cannot be used here: " + status.reason;
    }
    known += (known.empty() ? "" : ", ") + status.name;
  }
  return "retrace was built without the " + backend + " backend (it has: " + known + ")";
}

// Why CPU devices cannot open here ("" when they can): RETRACE_CPU_ISA names a kernel variant
// this CPU cannot run (CTest runs the suites once per variant).
inline std::string cpu_isa_skip_reason() {
  try {
    (void)default_cpu_kernel_isa();
  } catch (const Error& e) {
    if (e.category() == ErrorCategory::unimplemented) return e.message();
  }
  return {};
}

// Why the selected backend cannot run here ("" when it can).
inline std::string test_skip_reason() {
  if (std::string reason = backend_skip_reason(test_backend()); !reason.empty()) return reason;
  return test_backend() == "cpu" ? cpu_isa_skip_reason() : std::string();
}

// Device `id` of `backend` ("cuda:1"). Tests use several devices of one backend; on a machine
// with fewer GPUs than that, the CUDA devices share the GPUs (device id 1 on GPU 1 % count), as
// several retrace devices may: each has its own memory, queues and traces.
inline std::unique_ptr<Device> open_backend_device(const std::string& backend, DeviceId id,
                                                   DeviceOptions options = {}) {
#if RETRACE_TEST_HAVE_CUDA
  if (backend == "cuda") {
    const int gpus = cuda_device_count();
    if (gpus > 0 && static_cast<int>(id.value) >= gpus) {
      CudaDeviceOptions settings;
      settings.id = id;
      settings.ordinal = static_cast<int>(id.value % static_cast<std::uint32_t>(gpus));
      settings.memory_bytes = options.memory_bytes;
      settings.trace_region_bytes = options.trace_region_bytes;
      settings.num_queues = options.num_queues;
      return open_cuda_device(settings);
    }
  }
#endif
  return open_device(backend + ":" + std::to_string(id.value), options);
}

struct TestDeviceSpec {
  DeviceId id{0};
  std::size_t guard_bytes = 0;  // where the backend's memory is host visible (CPU)
};

// A device of the selected backend, or nullptr when it cannot run here (see test_skip_reason).
inline std::unique_ptr<Device> open_test_device(TestDeviceSpec spec = {}) {
  if (!test_skip_reason().empty()) return nullptr;
  DeviceOptions options;
  options.memory_bytes = std::size_t{512} << 20;
  options.trace_region_bytes = std::size_t{128} << 20;
  options.guard_bytes = test_backend() == "cpu" ? spec.guard_bytes : 0;
  return open_backend_device(test_backend(), spec.id, options);
}

// The name a test device with this id has: "cpu:1", "cuda:1".
inline std::string test_device_name(std::uint32_t id) {
  return test_backend() + ":" + std::to_string(id);
}

// Runs f and expects a retrace::Error of `category` whose message contains `needle`.
template <class F>
void expect_error(F&& f, ErrorCategory category, std::string_view needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A scratch directory for a suite's files, private to this process (test processes running
// side by side, ctest -j or two builds' suites, never rewrite a file another one has mapped) and
// removed when the process exits.
inline std::string scratch_dir(std::string_view suite) {
  struct Root {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("retrace-tests-" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Root root;
  const std::filesystem::path dir = root.path / std::string(suite);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The bit patterns of a tensor's values read as float32, for bit-for-bit comparisons.
inline std::vector<std::uint32_t> float_bits(const Tensor& t) {
  std::vector<std::uint32_t> out;
  for (float v : t.to_vector<float>()) out.push_back(std::bit_cast<std::uint32_t>(v));
  return out;
}

inline Tensor device_tensor(Device& device, const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::float32, Layout layout = Layout::row_major) {
  return Tensor::from_vector<float>(values, shape, dtype, layout).to_device(device);
}

// Runs f(x) eagerly and through a Tracer for three random float32 inputs x of `shape` (the
// first call captures, the others replay) and expects the results equal bit for bit.
template <class F>
void expect_traced_equals_eager(Device& device, F f, const Shape& shape, std::uint64_t salt) {
  auto tracer = make_tracer(f, device);
  for (std::uint64_t call = 0; call < 3; ++call) {
    const Tensor x = device_tensor(
        device, random_floats(static_cast<std::size_t>(shape.numel()), salt + call), shape);
    const std::vector<float> traced = tracer(x).template to_vector<float>();
    const std::vector<float> eager = f(x).template to_vector<float>();
    ASSERT_EQ(traced.size(), eager.size());
    for (std::size_t i = 0; i < eager.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(traced[i]), std::bit_cast<std::uint32_t>(eager[i]))
          << "call " << call << ", element " << i;
    }
  }
}

}  // namespace retrace::testing

// Opens a device of the selected backend into `var`, or skips the test with the reason.
#define RETRACE_TEST_DEVICE(var, ...)                                              \
  auto var = ::retrace::testing::open_test_device(__VA_ARGS__);                   \
  if (!var) GTEST_SKIP() << ::retrace::testing::test_skip_reason()

namespace retrace::testing {
// A fixture with a device of the selected backend (the test skips, saying why, without one).
class DeviceTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = open_test_device();
  void SetUp() override {
    if (!device_) GTEST_SKIP() << test_skip_reason();
  }
  Device& device() { return *device_; }
};
}  // namespace retrace::testing

// For fixtures holding a test device in `device_`.
#define RETRACE_SKIP_WITHOUT_DEVICE() \
  if (!device_) GTEST_SKIP() << ::retrace::testing::test_skip_reason()
