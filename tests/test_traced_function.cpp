// Traced functions and methods: the three device modes, trace keys, automatic keys, LRU bounds,
// capture explanations, owner lifetimes and thread safety.
#include "support.hpp"

#include <thread>

namespace retrace_traced_test {

using retrace::Device;
using retrace::Tensor;

struct Pipeline : retrace::TraceOwner {
  Device* device = nullptr;
  double gain = 2.0;
  int calls = 0;
  Tensor step(const Tensor& x, float shift) {
    ++calls;
    return retrace::ops::add(retrace::ops::mul(x, gain), shift);
  }
};

struct CclManager : retrace::TraceOwner {  // not a tree: bound by identity
  double scale = 1.0;
};

Tensor scaled(const Tensor& x, Device& device, const CclManager& ccl) {
  (void)device;
  return retrace::ops::mul(x, ccl.scale);
}

Tensor plus_one(const Tensor& x) { return retrace::ops::add(x, 1.0); }

}  // namespace retrace_traced_test

namespace retrace {
namespace {

using namespace retrace_traced_test;
using testing::random_floats;

class LogLines {
 public:
  LogLines() : previous_level_(log_level()) {
    set_log_level(LogLevel::info);
    previous_ = set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~LogLines() {
    set_log_sink(previous_);
    set_log_level(previous_level_);
  }
  std::size_t count(LogLevel level, std::string_view fragment) const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [l, m] : lines_) n += (l == level && m.find(fragment) != std::string::npos);
    return n;
  }
  std::string all() const {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& [l, m] : lines_) out += m + "\n";
    return out;
  }

 private:
  LogSink previous_;
  LogLevel previous_level_;
  mutable std::mutex mutex_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

class TracedFunctionTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = testing::open_test_device();
  void SetUp() override { RETRACE_SKIP_WITHOUT_DEVICE(); }
  Device& device() { return *device_; }
};

TEST_F(TracedFunctionTest, MethodUntracedAndTraced) {
  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Pipeline pipeline;
  pipeline.device = &device();
  Tensor x = ops::full({4}, 1.0, device());
  EXPECT_EQ(step.untraced(pipeline, x, 0.5f).to_vector<float>(), std::vector<float>(4, 2.5f));
  EXPECT_EQ(step.live_traces(pipeline), 0u);
  const Tensor& y = step(pipeline, x, 0.5f);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 2.5f));
  const int calls_after_capture = pipeline.calls;
  const Tensor& z = step(pipeline, ops::full({4}, 3.0, device()), 0.5f);
  EXPECT_EQ(&z, &y);
  EXPECT_EQ(pipeline.calls, calls_after_capture);  // replayed, not called
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(4, 6.5f));
  EXPECT_EQ(step.live_traces(pipeline), 1u);
  EXPECT_EQ(step.stats().replays, 1u);
}

TEST_F(TracedFunctionTest, EachObjectHasItsOwnTracesReleasedWhenItDies) {
  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Tensor x = ops::full({8}, 1.0, device());
  auto a = std::make_unique<Pipeline>();
  a->device = &device();
  {
    Pipeline b;
    b.device = &device();
    b.gain = 10.0;
    EXPECT_EQ(step(*a, x, 0.0f).to_vector<float>(), std::vector<float>(8, 2.0f));
    EXPECT_EQ(step(b, x, 0.0f).to_vector<float>(), std::vector<float>(8, 10.0f));
    EXPECT_EQ(device().stats().live_traces, 2u);
    EXPECT_EQ(step.live_traces(b), 1u);
  }
  EXPECT_EQ(device().stats().live_traces, 1u);  // b's trace died with b
  EXPECT_EQ(step.stats().live_traces, 1u);
  a.reset();
  EXPECT_EQ(device().stats().live_traces, 0u);
  EXPECT_EQ(device().stats().trace_bytes, 0u);
}

TEST_F(TracedFunctionTest, ObjectOutlivingTheWrapperIsFine) {
  Pipeline p;
  p.device = &device();
  {
    auto step = traced_method(&Pipeline::step, [](Pipeline& q) -> Device& { return *q.device; });
    step(p, ops::full({2}, 1.0, device()), 1.0f);
    EXPECT_EQ(device().stats().live_traces, 1u);
  }
  EXPECT_EQ(device().stats().live_traces, 0u);  // the wrapper's traces went with it
}  // p's destructor finds the wrapper gone: nothing to do

TEST_F(TracedFunctionTest, DeviceParameterIsFoundByTypeAndBoundArgumentsSelectTheTracer) {
  auto traced_scaled = traced_function(scaled);
  CclManager half, triple;
  half.scale = 0.5;
  triple.scale = 3.0;
  Tensor x = ops::full({4}, 2.0, device());
  EXPECT_EQ(traced_scaled.untraced(x, device(), half).to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(traced_scaled(x, device(), half).to_vector<float>(),
            std::vector<float>(4, 1.0f));
  EXPECT_EQ(traced_scaled(x, device(), triple).to_vector<float>(),
            std::vector<float>(4, 6.0f));
  EXPECT_EQ(traced_scaled.stats().live_traces, 2u);  // one per manager identity
  traced_scaled(ops::full({4}, 4.0, device()), device(), half);
  EXPECT_EQ(traced_scaled.stats().captures, 2u);
  EXPECT_EQ(traced_scaled.stats().replays, 1u);
  auto other = testing::open_test_device({.id = DeviceId{1}});
  traced_scaled(ops::full({4}, 4.0, *other), *other, half);
  EXPECT_EQ(traced_scaled.stats().live_traces, 3u);  // and per device
}

TEST_F(TracedFunctionTest, InjectedDeviceIsNeverSeenByTheFunction) {
  auto traced_plus_one = traced_function_injected(plus_one);
  Tensor x = ops::full({4}, 1.0, device());
  EXPECT_EQ(traced_plus_one.untraced(x).to_vector<float>(), std::vector<float>(4, 2.0f));  // untraced
  const Tensor& y = traced_plus_one(device(), x);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 2.0f));
  traced_plus_one(device(), ops::full({4}, 5.0, device()));
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 6.0f));
  EXPECT_EQ(traced_plus_one.stats().captures, 1u);
}

TEST_F(TracedFunctionTest, TraceKeysHoldSeveralTraces) {
  auto traced_plus_one = traced_function_injected(plus_one);
  const Tensor& small = traced_plus_one.call(CallOptions{.key = "64"}, device(),
                                                    ops::full({64}, 1.0, device()));
  const Tensor& large = traced_plus_one.call(CallOptions{.key = "128"}, device(),
                                                    ops::full({128}, 2.0, device()));
  EXPECT_EQ(traced_plus_one.stats().live_traces, 2u);
  traced_plus_one.call(CallOptions{.key = "64"}, device(), ops::full({64}, 7.0, device()));
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(64, 8.0f));
  EXPECT_EQ(large.to_vector<float>(), std::vector<float>(128, 3.0f));
  // Without a key, a new shape is an error of the default trace, not a new capture.
  traced_plus_one(device(), ops::full({64}, 1.0, device()));
  EXPECT_RETRACE_ERROR(traced_plus_one(device(), ops::full({32}, 1.0, device())),
                       invalid_argument, "input args[0]: shape [32] does not match");
  traced_plus_one.release_key("64");
  EXPECT_EQ(traced_plus_one.stats().live_traces, 2u);
  traced_plus_one.release_all();
  EXPECT_EQ(traced_plus_one.stats().live_traces, 0u);
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(TracedFunctionTest, ReleasingOneKeyOneObjectOrAll) {
  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Pipeline a, b;
  a.device = b.device = &device();
  Tensor x = ops::full({4}, 1.0, device());
  for (const char* key : {"x", "y"}) {
    step.call(CallOptions{.key = key}, a, x, 0.0f);
    step.call(CallOptions{.key = key}, b, x, 0.0f);
  }
  EXPECT_EQ(step.stats().live_traces, 4u);
  step.release(a, "x");
  EXPECT_EQ(step.live_traces(a), 1u);
  step.release(b);
  EXPECT_EQ(step.live_traces(b), 0u);
  step.release_key("y");
  EXPECT_EQ(step.stats().live_traces, 0u);
  step(a, x, 0.0f);
  step.release_all();
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(TracedFunctionTest, AutomaticKeysCaptureEachShapeAndReplayBitIdentical) {
  LogLines logs;
  auto fn = [](const Tensor& x, Device& dev, float s) {
    (void)dev;
    return ops::add(ops::mul(x, x), s);
  };
  auto traced = traced_function(fn, TraceOptions{.auto_key = true, .name = "square"});
  for (int round = 0; round < 3; ++round) {
    for (std::int64_t n : {64, 96}) {
      const auto values = random_floats(static_cast<std::size_t>(n), 100 * round + n);
      Tensor x = testing::device_tensor(device(), values, {n});
      const auto eager = fn(x, device(), 0.25f).to_vector<float>();
      EXPECT_EQ(traced(x, device(), 0.25f).to_vector<float>(), eager);
    }
  }
  EXPECT_EQ(traced.stats().captures, 2u);
  EXPECT_EQ(traced.stats().replays, 4u);
  EXPECT_EQ(logs.count(LogLevel::info, "square: capturing a new trace: first traced call"), 1u);
  EXPECT_EQ(logs.count(LogLevel::info,
                       fmt::format("square: capturing a new trace: new input signature: input "
                                   "args[0] is [96] float32 row_major on {0}, the nearest trace "
                                   "has [64] float32 row_major on {0}",
                                   device().name())),
            1u)
      << logs.all();
  // A new scalar value is a new signature too.
  traced(ops::full({64}, 1.0, device()), device(), 0.5f);
  EXPECT_EQ(logs.count(LogLevel::info, "input args[2] is 0.5, the nearest trace has 0.25"), 1u)
      << logs.all();
}

TEST_F(TracedFunctionTest, ExplainsANewKey) {
  LogLines logs;
  auto traced = traced_function_injected(plus_one, TraceOptions{.name = "p1"});
  traced.call(CallOptions{.key = "a"}, device(), ops::full({2}, 1.0, device()));
  traced.call(CallOptions{.key = "b"}, device(), ops::full({2}, 1.0, device()));
  EXPECT_EQ(logs.count(LogLevel::info, "p1: capturing a new trace: new trace key \"b\""), 1u);
}

TEST_F(TracedFunctionTest, LeastRecentlyUsedTraceIsReleasedPastTheCountBound) {
  LogLines logs;
  auto traced = traced_function_injected(plus_one, TraceOptions{.max_traces = 2, .name = "lru"});
  auto call = [&](const char* key) {
    return traced.call(CallOptions{.key = key}, device(), ops::full({16}, 1.0, device()))
        .to_vector<float>();
  };
  call("a");
  call("b");
  call("a");  // b is now the least recently used
  call("c");
  EXPECT_EQ(traced.stats().live_traces, 2u);
  EXPECT_EQ(traced.stats().evictions, 1u);
  EXPECT_EQ(device().stats().live_traces, 2u);
  EXPECT_EQ(logs.count(LogLevel::info, "lru: released the least recently used trace (key \"b\""),
            1u)
      << logs.all();
  const auto captures = traced.stats().captures;
  call("a");  // still there
  EXPECT_EQ(traced.stats().captures, captures);
  call("b");  // evicted: captured again
  EXPECT_EQ(traced.stats().captures, captures + 1);
}

TEST_F(TracedFunctionTest, LeastRecentlyUsedTraceIsReleasedPastTheByteBound) {
  auto traced = traced_function_injected(
      plus_one, TraceOptions{.max_trace_bytes = 2 * 4096 * 4 + 1000, .name = "bytes"});
  for (const char* key : {"a", "b", "c", "d"}) {
    traced.call(CallOptions{.key = key}, device(), ops::full({4096}, 1.0, device()));
  }
  const TraceStats stats = traced.stats();
  EXPECT_EQ(stats.live_traces, 2u);
  EXPECT_LE(stats.trace_bytes, 2u * 4096 * 4 + 1000);
  EXPECT_EQ(stats.evictions, 2u);
}

TEST_F(TracedFunctionTest, WarnsWhenCapturesKeepHappening) {
  LogLines logs;
  auto traced = traced_function_injected(
      plus_one, TraceOptions{.auto_key = true, .name = "churn"});
  for (std::int64_t n = 1; n <= 12; ++n) traced(device(), ops::full({n}, 1.0, device()));
  EXPECT_EQ(logs.count(LogLevel::warning, "churn: 10 of the last 10 calls captured a new trace"),
            1u)
      << logs.all();
}

// Each thread works on its own queue: captures are thread-local, and a queue that one thread is
// capturing on is off limits to the others.
TEST_F(TracedFunctionTest, CallsFromSeveralThreadsAreSerialised) {
  auto add_one = [](const Tensor& x, QueueId queue) { return ops::add(x, 1.0, queue); };
  auto traced = traced_function_injected(
      [&](const Tensor& x, std::int64_t queue) {
        return add_one(x, QueueId{static_cast<std::uint32_t>(queue)});
      });
  auto worker = [&](std::uint32_t queue, float base) {
    const QueueId q{queue};
    for (int i = 0; i < 40; ++i) {
      const float value = base + static_cast<float>(i);
      Tensor x = ops::full({256}, value, device(), DType::float32, Layout::row_major, q);
      const Tensor& y = traced.call(CallOptions{.queue = q, .key = std::to_string(queue)},
                                           device(), x, static_cast<std::int64_t>(queue));
      EXPECT_EQ(y.to_vector<float>(q), std::vector<float>(256, value + 1));
    }
  };
  std::thread a(worker, 0u, 0.0f), b(worker, 1u, 1000.0f);
  a.join();
  b.join();
  EXPECT_EQ(traced.stats().captures, 2u);
  EXPECT_EQ(traced.stats().replays, 78u);
}

// The eviction order both languages use: least recently used first, never the newest, until
// both bounds hold (a lone trace over max_trace_bytes stays: it is the newest).
TEST(TraceBounds, ReleasesTheLeastRecentlyUsedUntilTheBoundsHold) {
  using Entry = detail::TraceBounds::Entry;
  detail::TraceBounds count(2, 0);
  const std::vector<Entry> four = {{3, 10}, {1, 10}, {4, 10}, {2, 10}};
  EXPECT_EQ(count.victims(four, 2), (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(count.victims(four, 1), (std::vector<std::size_t>{3, 0}));  // the newest stays
  detail::TraceBounds bytes(0, 25);
  EXPECT_EQ(bytes.victims(four, 2), (std::vector<std::size_t>{1, 3}));
  EXPECT_TRUE(bytes.victims(std::vector<Entry>{{1, 100}}, 0).empty());
  detail::TraceBounds none(0, 0);
  EXPECT_TRUE(none.victims(four, 0).empty());
  const std::uint64_t earlier = none.touch();
  EXPECT_LT(earlier, none.touch());
}

}  // namespace
}  // namespace retrace
