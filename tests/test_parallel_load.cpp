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

// Restores the pool's own choice of cut when a test ends.
struct BusyCut {
  BusyCut() { cpu::detail::force_busy_cut(true); }
  ~BusyCut() { cpu::detail::force_busy_cut(false); }
  BusyCut(const BusyCut&) = delete;
  BusyCut& operator=(const BusyCut&) = delete;
};

// Products and kernels at shapes whose cut changes when the pool cuts finer (rows of C, columns
// of a single row, K and N off the libraries' tiles, bias or none, batched, bfloat16).
struct Product {
  std::int64_t m, k, n;
  bool bias;
};
constexpr Product kProducts[] = {{1, 300, 1000, true},   {7, 96, 513, false},
                                 {64, 257, 129, true},   {300, 100, 257, true},
                                 {512, 384, 96, false},  {1000, 64, 64, true}};

std::vector<Tensor> cut_sensitive_inputs(Device& device) {
  std::vector<Tensor> in;
  std::uint64_t salt = 100;
  const auto add = [&](const Shape& shape, DType dtype = DType::float32) {
    in.push_back(testing::device_tensor(
        device, testing::random_floats(static_cast<std::size_t>(shape.numel()), ++salt), shape,
        dtype));
  };
  for (const Product& p : kProducts) {
    add({p.m, p.k});
    add({p.n, p.k});
    add({p.n});
  }
  add({3, 130, 70});
  add({3, 70, 190});
  add({200, 65});
  add({300, 65});
  add({257, 192}, DType::bfloat16);
  add({320, 192}, DType::bfloat16);
  add({2, 64, 24, 24});
  add({96, 64, 3, 3});
  add({96});
  add({64});
  add({2, 4, 300, 64});
  add({2, 4, 300, 64});
  add({1000, 257});
  return in;
}

std::vector<Tensor> cut_sensitive(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  std::size_t i = 0;
  for (const Product& p : kProducts) {
    out.push_back(ops::linear(in[i], in[i + 1], p.bias ? in[i + 2] : Tensor{}));
    i += 3;
  }
  out.push_back(ops::matmul(in[i], in[i + 1]));
  out.push_back(ops::matmul(in[i + 2], in[i + 3], ops::Transpose::no, ops::Transpose::yes));
  out.push_back(ops::linear(in[i + 4], in[i + 5]));
  i += 6;
  const Tensor& image = in[i];
  out.push_back(
      ops::conv2d(image, in[i + 1], in[i + 2], ops::Conv2dOptions{.padding = {1, 1}}));
  out.push_back(ops::group_norm(image, 32, in[i + 3], in[i + 3]));
  out.push_back(ops::scaled_dot_product_attention(in[i + 4], in[i + 5], in[i + 4]));
  out.push_back(ops::softmax(in[i + 6]));
  out.push_back(ops::layer_norm(in[i + 6], Tensor{}, Tensor{}));
  return out;
}

TEST(KernelThreadsUnderLoad, TheFinerCutOfABusyMachineKeepsEveryKernelsBits) {
  if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's kernel threads";
  auto device = open_cpu_device(CpuDeviceOptions{.id = DeviceId{8}});
  const auto in = cut_sensitive_inputs(*device);
  cpu::detail::force_busy_cut(false);
  const auto usual = bits_of(cut_sensitive(in));
  const BusyCut busy;
  EXPECT_EQ(bits_of(cut_sensitive(in)), usual) << "the finer cut";
  auto traced = make_tracer([](const std::vector<Tensor>& x) { return cut_sensitive(x); }, *device);
  EXPECT_EQ(bits_of(traced(in)), usual) << "the finer cut, capture";
  EXPECT_EQ(bits_of(traced(in)), usual) << "the finer cut, replay";
}

}  // namespace
}  // namespace retrace
