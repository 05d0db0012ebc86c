// The CPU device's kernel threads on a busy machine: while other threads of this process keep
// every CPU busy (so the kernel helpers are descheduled at any moment), parallel loops still
// run each part exactly once, and kernels, eager and traced, give the bits they give on an idle
// machine and on one thread. No timing is asserted; retrace bench --load measures the speed.
#include "cpu/parallel.hpp"
#include "support.hpp"
#include "util/cpus.hpp"

#include <retrace/cpu.hpp>
#include <retrace/retrace.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace retrace {
namespace {

// Threads that spin on every CPU this process may use, as long as the object lives.
class CpuHogs {
 public:
  CpuHogs() {
    const unsigned count = util::usable_cpus();
    for (unsigned i = 0; i < count; ++i) {
      threads_.emplace_back([this] {
        std::uint64_t spins = 0;
        while (!stop_.load(std::memory_order_relaxed)) ++spins;
        sink_.fetch_add(spins, std::memory_order_relaxed);
      });
    }
  }
  ~CpuHogs() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }
  CpuHogs(const CpuHogs&) = delete;
  CpuHogs& operator=(const CpuHogs&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> sink_{0};
  std::vector<std::thread> threads_;
};

TEST(KernelThreadsUnderLoad, EveryPartOfEveryLoopRunsExactlyOnce) {
  const CpuHogs hogs;
  constexpr std::int64_t kN = 1 << 14;
  std::vector<std::atomic<int>> visits(kN);
  constexpr int kLoops = 300;
  for (int loop = 0; loop < kLoops; ++loop) {
    cpu::parallel_for(kN, 256, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) visits[i].fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (std::int64_t i = 0; i < kN; ++i) ASSERT_EQ(visits[i].load(), kLoops) << "index " << i;
}

// The ops of a transformer layer at sizes that take the parallel paths (streaming kernels of
// 64K elements, a GEMM of 8M multiply-adds split over the threads, attention).
std::vector<Tensor> layer(const Tensor& x, const Tensor& w, const Tensor& row) {
  const Tensor h = ops::linear(ops::layer_norm(x, row, row), w);
  const Tensor q = ops::reshape(h, {1, 4, 256, 64});
  return {h, ops::gelu_tanh(h), ops::softmax(ops::mul(h, 0.125)), ops::add(x, h),
          ops::scaled_dot_product_attention(q, q, q)};
}

std::vector<std::vector<std::uint32_t>> bits_of(const std::vector<Tensor>& results) {
  std::vector<std::vector<std::uint32_t>> bits;
  for (const Tensor& r : results) bits.push_back(testing::float_bits(r));
  return bits;
}

TEST(KernelThreadsUnderLoad, KernelsKeepTheirBitsWhileOtherThreadsHogTheCpus) {
  if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's kernel threads";
  auto device = open_cpu_device(CpuDeviceOptions{.id = DeviceId{6}});
  const Tensor x =
      testing::device_tensor(*device, testing::random_floats(256 * 256, 1), {256, 256});
  const Tensor w =
      testing::device_tensor(*device, testing::random_floats(256 * 256, 2), {256, 256});
  const Tensor row = testing::device_tensor(*device, testing::random_floats(256, 3), {256});
  const auto idle = bits_of(layer(x, w, row));
  // A streaming kernel on one thread gives the same bits (its parts do not change a value).
  auto one = open_cpu_device(CpuDeviceOptions{.id = DeviceId{7}, .kernel_threads = 1});
  const Tensor x1 = testing::device_tensor(*one, testing::random_floats(256 * 256, 1), {256, 256});
  const auto gelu_idle = testing::float_bits(ops::gelu_tanh(x));
  EXPECT_EQ(testing::float_bits(ops::gelu_tanh(x1)), gelu_idle);

  auto traced = make_tracer(
      [](const Tensor& a, const Tensor& b, const Tensor& c) { return layer(a, b, c); }, *device);
  const CpuHogs hogs;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(bits_of(layer(x, w, row)), idle) << "eager, round " << i;
    EXPECT_EQ(bits_of(traced(x, w, row)), idle) << "traced, round " << i;
  }
  EXPECT_EQ(testing::float_bits(ops::gelu_tanh(x1)), gelu_idle);
  EXPECT_EQ(testing::float_bits(ops::gelu_tanh(x)), gelu_idle);
}

}  // namespace
}  // namespace retrace
