// The Tracer contract (docs/contract.md, "Tracer"), one or more tests per rule.
#include "support.hpp"

#include <map>
#include <optional>

namespace retrace_tracer_test {

struct MlpWeights {
  retrace::Tensor w1;
  retrace::Tensor b1;
  retrace::Tensor w2;
};
RETRACE_FIELDS(MlpWeights, w1, b1, w2)

}  // namespace retrace_tracer_test

namespace retrace {
namespace {

using retrace_tracer_test::MlpWeights;
using testing::device_tensor;
using testing::random_floats;

// Captures log lines while alive.
class LogCapture {
 public:
  LogCapture() {
    previous_level_ = log_level();
    set_log_level(LogLevel::debug);
    previous_ = set_log_sink([this](LogLevel level, std::string_view message) {
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~LogCapture() {
    set_log_sink(previous_);
    set_log_level(previous_level_);
  }
  bool contains(LogLevel level, std::string_view fragment) const {
    for (const auto& [l, m] : lines_) {
      if (l == level && m.find(fragment) != std::string::npos) return true;
    }
    return false;
  }

 private:
  LogSink previous_;
  LogLevel previous_level_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

class TracerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = testing::open_test_device({.guard_bytes = 64});
  void SetUp() override { RETRACE_SKIP_WITHOUT_DEVICE(); }
  Device& device() { return *device_; }
  std::vector<float> read(const Tensor& t) { return t.to_vector<float>(); }
};

auto affine(const Tensor& x, float scale) { return ops::add(ops::mul(x, scale), 1.0); }

TEST_F(TracerTest, FirstCallCapturesAndRunsLaterCallsReplay) {
  int calls = 0;
  auto tracer = make_tracer(
      [&](const Tensor& x, float scale) {
        ++calls;
        return affine(x, scale);
      },
      device(), TraceOptions{.name = "affine"});
  EXPECT_FALSE(tracer.trace_captured());
  const auto v = random_floats(64, 1);
  Tensor x = device_tensor(device(), v, {64});
  const Tensor& y = tracer(x, 2.0f);
  EXPECT_TRUE(tracer.trace_captured());
  EXPECT_EQ(calls, 2);  // prep run + capture
  EXPECT_EQ(tracer.stats().captures, 1u);
  EXPECT_EQ(device().stats().live_traces, 1u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(read(y)[i], v[i] * 2.0f + 1.0f);

  const auto w = random_floats(64, 2);
  const Tensor& z = tracer(device_tensor(device(), w, {64}), 2.0f);
  EXPECT_EQ(calls, 2);  // replays never call the function
  EXPECT_EQ(&z, &y);    // the same output object
  EXPECT_EQ(tracer.stats().replays, 1u);
  EXPECT_EQ(tracer.stats().copies, 1u);
  EXPECT_EQ(tracer.stats().bytes_refreshed, 64u * 4);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(read(z)[i], w[i] * 2.0f + 1.0f);
}

// keep_slot() for a tensor input leaves its slot as it is: state the function updates in place
// (a cache) carries over from replay to replay. At the capture there is no slot to keep.
TEST_F(TracerTest, KeepSlotLeavesTheInputSlotAsItIs) {
  auto step = make_tracer(
      [](const Tensor& x, const Tensor& cache) {
        ops::add(cache, x, cache);
        return ops::mul(cache, 1.0);
      },
      device(), {.prep_run = false});
  const Tensor ones = ops::full({4}, 1.0, device());
  EXPECT_RETRACE_ERROR((void)step(ones, keep_slot()), invalid_argument,
                       "input args[1]: is keep_slot() (None in Python)");
  EXPECT_FALSE(step.trace_captured());
  const Tensor cache = ops::full({4}, 0.0, device());
  EXPECT_EQ(read(step(ones, cache)), std::vector<float>(4, 1.0f));
  EXPECT_EQ(read(step(ones, keep_slot())), std::vector<float>(4, 2.0f));
  EXPECT_EQ(step.stats().copies_skipped, 2u);  // ones is its slot already, the cache kept
  EXPECT_EQ(read(step(ones, keep_slot())), std::vector<float>(4, 3.0f));
  // A tensor again refreshes the slot as usual.
  EXPECT_EQ(read(step(ones, ops::full({4}, 10.0, device()))), std::vector<float>(4, 11.0f));
  EXPECT_TRUE(keep_slot().is_keep_slot());
  EXPECT_FALSE(Tensor().is_keep_slot());
  EXPECT_FALSE(ones.is_keep_slot());
}

TEST_F(TracerTest, HostInputsAreMovedAndWrittenIntoSlots) {
  auto tracer = make_tracer(affine, device());
  const auto v = random_floats(16, 3), w = random_floats(16, 4);
  const Tensor& y = tracer(Tensor::from_vector<float>(v, {16}, DType::float32), 3.0f);
  const Tensor& slot = std::get<0>(tracer.inputs());
  EXPECT_TRUE(slot.on_device());
  EXPECT_EQ(slot.device(), &device());
  const std::uint64_t slot_address = slot.address();
  tracer(Tensor::from_vector<float>(w, {16}, DType::float32), 3.0f);
  EXPECT_EQ(std::get<0>(tracer.inputs()).address(), slot_address);
  EXPECT_EQ(tracer.stats().copies, 1u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(read(y)[i], w[i] * 3.0f + 1.0f);
}

TEST_F(TracerTest, InputsPassedBackFromSlotsCostNoCopy) {
  auto tracer = make_tracer(
      [](const std::vector<Tensor>& xs) {
        std::vector<Tensor> out;
        for (const Tensor& x : xs) out.push_back(ops::add(x, 1.0));
        return out;
      },
      device());
  std::vector<Tensor> xs;
  for (int i = 0; i < 8; ++i) xs.push_back(ops::full({4}, i, device()));
  tracer(xs);
  const auto& [slots] = tracer.inputs();
  tracer(slots);
  EXPECT_EQ(tracer.stats().copies, 0u);
  EXPECT_EQ(tracer.stats().copies_skipped, 8u);
  EXPECT_EQ(tracer.stats().bytes_refreshed, 0u);
  // The caller's tensors became the slots: passing them again costs nothing either.
  tracer(xs);
  EXPECT_EQ(tracer.stats().copies_skipped, 8u);
}

TEST_F(TracerTest, ReplayOverwritesTheSameOutputs) {
  auto tracer = make_tracer([](const Tensor& x) { return std::make_pair(ops::add(x, 1.0), 7); },
                            device());
  const auto& first = tracer(ops::full({2}, 1.0, device()));
  const std::vector<float> kept = read(first.first);
  const auto& second = tracer(ops::full({2}, 5.0, device()));
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(kept, std::vector<float>(2, 2.0f));
  EXPECT_EQ(read(first.first), std::vector<float>(2, 6.0f));
  EXPECT_EQ(second.second, 7);  // scalar outputs are constants of the trace
}

// A call that fails its check must leave every slot as it was, even the leaves that come before
// the offending one in the tree.
TEST_F(TracerTest, RejectedCallChangesNothing) {
  using Batch = std::map<std::string, Tensor>;
  auto tracer = make_tracer([](const Tensor& a, const Batch& b) {
    return ops::add(a, b.at("latents"));
  }, device());
  Tensor a = ops::full({1, 64, 64}, 1.0, device());
  Batch batch{{"latents", ops::full({1, 64, 64}, 2.0, device())}};
  tracer(a, batch);
  const Tensor slot_a = std::get<0>(tracer.inputs());
  const Tensor slot_latents = std::get<1>(tracer.inputs()).at("latents");

  Batch wrong{{"latents", ops::full({1, 64, 32}, 9.0, device())}};
  EXPECT_RETRACE_ERROR(tracer(ops::full({1, 64, 64}, 5.0, device()), wrong), invalid_argument,
                       "input args[1][\"latents\"]: shape [1, 64, 32] does not match the "
                       "captured shape [1, 64, 64]");
  EXPECT_EQ(read(slot_a), std::vector<float>(64 * 64, 1.0f));  // args[0] was not copied
  EXPECT_EQ(read(slot_latents), std::vector<float>(64 * 64, 2.0f));
  EXPECT_EQ(tracer.stats().replays, 0u);
  EXPECT_EQ(tracer.stats().copies, 0u);
}

TEST_F(TracerTest, EveryMismatchIsRejectedWithItsPath) {
  using Extras = std::tuple<std::vector<Tensor>, std::map<std::string, int>, std::optional<float>,
                            std::string>;
  auto tracer = make_tracer(
      [](const Tensor& x, const Extras& e) { return ops::add(x, std::get<0>(e)[0]); }, device());
  Tensor x = ops::full({4, 4}, 1.0, device());
  auto extras = [&](std::vector<Tensor> ts, std::map<std::string, int> m, std::optional<float> o,
                    std::string s) { return Extras{std::move(ts), std::move(m), o, std::move(s)}; };
  const Extras good = extras({ops::full({4, 4}, 1.0, device())}, {{"steps", 20}}, 0.5f, "euler");
  tracer(x, good);
  auto other = testing::open_test_device({.id = DeviceId{1}});

  EXPECT_RETRACE_ERROR(tracer(Tensor(), good), invalid_argument, "input args[0]: is a null tensor");
  EXPECT_RETRACE_ERROR(tracer(ops::full({4, 4}, 1.0, device(), DType::bfloat16), good),
                       invalid_argument,
                       "input args[0]: dtype bfloat16 does not match the captured dtype float32");
  EXPECT_RETRACE_ERROR(
      tracer(ops::full({4, 4}, 1.0, device(), DType::float32, Layout::tile), good),
      invalid_argument, "input args[0]: layout tile does not match the captured layout row_major");
  EXPECT_RETRACE_ERROR(tracer(ops::full({4, 4}, 1.0, *other), good), invalid_argument,
                       fmt::format("input args[0]: is on {}, but the captured input is on {}",
                                   testing::test_device_name(1), testing::test_device_name(0)));
  EXPECT_RETRACE_ERROR(tracer(x, extras({}, {{"steps", 20}}, 0.5f, "euler")), invalid_argument,
                       "input args[1][0]: has 0 elements, expected 1");
  EXPECT_RETRACE_ERROR(
      tracer(x, extras({ops::full({4, 4}, 1.0, device())}, {{"step", 20}}, 0.5f, "euler")),
      invalid_argument, "input args[1][1]: keys {step} do not match the expected keys {steps}");
  EXPECT_RETRACE_ERROR(
      tracer(x, extras({ops::full({4, 4}, 1.0, device())}, {{"steps", 30}}, 0.5f, "euler")),
      invalid_argument, "input args[1][1][\"steps\"]: value 30 does not match the captured value 20");
  EXPECT_RETRACE_ERROR(
      tracer(x, extras({ops::full({4, 4}, 1.0, device())}, {{"steps", 20}}, std::nullopt, "euler")),
      invalid_argument, "input args[1][2]: is empty, expected a value");
  EXPECT_RETRACE_ERROR(
      tracer(x, extras({ops::full({4, 4}, 1.0, device())}, {{"steps", 20}}, 0.25f, "euler")),
      invalid_argument, "input args[1][2]: value 0.25 does not match the captured value 0.5");
  EXPECT_RETRACE_ERROR(
      tracer(x, extras({ops::full({4, 4}, 1.0, device())}, {{"steps", 20}}, 0.5f, "heun")),
      invalid_argument, "input args[1][3]: value heun does not match the captured value euler");
  EXPECT_EQ(tracer.stats().replays, 0u);
  tracer(x, good);
  EXPECT_EQ(tracer.stats().replays, 1u);
}

TEST_F(TracerTest, CaptureChecksInputs) {
  auto other = testing::open_test_device({.id = DeviceId{1}});
  auto tracer = make_tracer(affine, device(), TraceOptions{.name = "affine"});
  EXPECT_RETRACE_ERROR(tracer(ops::full({4}, 1.0, *other), 1.0f), invalid_argument,
                       fmt::format("input args[0]: is on {}, which is not a device of tracer "
                                   "'affine' ({})",
                                   testing::test_device_name(1), testing::test_device_name(0)));
  EXPECT_RETRACE_ERROR(tracer(Tensor(), 1.0f), invalid_argument, "input args[0]: is a null tensor");
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(TracerTest, PrepRunWorksOnClonesOfTheInputs) {
  // The function updates its input in place; the prep run must not touch the caller's tensor.
  auto in_place = [](const Tensor& x) {
    ops::add(x, 1.0, x);
    return ops::mul(x, 2.0);
  };
  const auto v = random_floats(32, 5);
  Tensor x = device_tensor(device(), v, {32});
  auto tracer = make_tracer(in_place, device());
  tracer.call(CallOptions{.execute_on_capture = false}, x);
  EXPECT_EQ(read(x), v);  // bit-identical after capture

  Tensor y = device_tensor(device(), v, {32});
  auto unsafe = make_tracer(in_place, device(), TraceOptions{.clone_prep_inputs = false});
  unsafe.call(CallOptions{.execute_on_capture = false}, y);
  EXPECT_NE(read(y), v);  // without clones, the prep run changed the input

  int calls = 0;
  auto no_prep = make_tracer(
      [&](const Tensor& t) {
        ++calls;
        return ops::add(t, 1.0);
      },
      device(), TraceOptions{.prep_run = false});
  no_prep(x);
  EXPECT_EQ(calls, 1);
}

TEST_F(TracerTest, ExecuteOnCaptureOffOnlyCaptures) {
  auto tracer = make_tracer([](const Tensor& x) { return ops::add(x, 1.0); }, device());
  const auto before = device().stats().traces_executed;
  tracer.call(CallOptions{.execute_on_capture = false}, ops::full({4}, 1.0, device()));
  EXPECT_TRUE(tracer.trace_captured());
  EXPECT_EQ(device().stats().traces_executed, before);
  const Tensor& y = tracer(ops::full({4}, 3.0, device()));
  EXPECT_EQ(read(y), std::vector<float>(4, 4.0f));
}

TEST_F(TracerTest, FunctionThatThrowsLeavesNothingBehind) {
  int calls = 0;
  auto tracer = make_tracer(
      [&](const Tensor& x) -> Tensor {
        if (++calls == 2) throw std::runtime_error("boom in the model");
        return ops::add(x, 1.0);
      },
      device());
  const DeviceStats before = device().stats();
  Tensor x = ops::full({4}, 1.0, device());
  EXPECT_THROW(
      {
        try {
          tracer(x);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "boom in the model");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_EQ(tracer.state(), TracerState::idle);
  EXPECT_FALSE(device().is_capturing());
  EXPECT_EQ(device().stats().live_traces, before.live_traces);
  EXPECT_EQ(device().stats().trace_bytes, before.trace_bytes);
  EXPECT_EQ(read(tracer(x)), std::vector<float>(4, 2.0f));  // the next call captures fine
  EXPECT_EQ(tracer.stats().captures, 1u);
}

TEST_F(TracerTest, FailedExecutionRightAfterCaptureDoesNotLeakTheTrace) {
  auto tracer = make_tracer(
      [](const Tensor& x) {
        ops::assert_finite(x);
        return ops::add(x, 1.0);
      },
      device(), TraceOptions{.prep_run = false});
  Tensor bad = Tensor::from_vector<float>({1.0f, std::nanf("")}, {2}, DType::float32)
                   .to_device(device());
  EXPECT_RETRACE_ERROR(tracer(bad), device_error, "op 'assert_finite' failed");
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_EQ(device().stats().live_traces, 0u);
  EXPECT_EQ(device().stats().trace_bytes, 0u);
}

TEST_F(TracerTest, OutputsMustBeDeviceTensors) {
  auto tracer = make_tracer(
      [](const Tensor& x) {
        (void)ops::add(x, 1.0);
        return Tensor::from_vector<float>({1.0f}, {1}, DType::float32);
      },
      device(), TraceOptions{.prep_run = false});
  EXPECT_RETRACE_ERROR(tracer(ops::full({2}, 1.0, device())), invalid_argument,
                       "output outputs: is a host tensor");
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(TracerTest, UntracedCallsFollowTheStateMachine) {
  auto tracer = make_tracer(affine, device(), TraceOptions{.name = "affine"});
  Tensor x = ops::full({4}, 1.0, device());
  EXPECT_EQ(read(tracer.untraced(x, 2.0f)), std::vector<float>(4, 3.0f));
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_RETRACE_ERROR((void)tracer.inputs(), failed_precondition,
                       "inputs(): tracer 'affine' has no captured trace");
  tracer(x, 2.0f);
  EXPECT_RETRACE_ERROR((void)tracer.untraced(x, 2.0f), failed_precondition,
                       "untraced call of tracer 'affine' is not allowed after a trace was captured");
  tracer.release_trace();
  EXPECT_NO_THROW((void)tracer.untraced(x, 2.0f));
  tracer.release_function();
  EXPECT_RETRACE_ERROR((void)tracer.untraced(x, 2.0f), failed_precondition,
                       "the function was released with release_function()");
  EXPECT_RETRACE_ERROR(tracer(x, 2.0f), failed_precondition,
                       "tracer 'affine' cannot capture a trace: the function was released");
}

TEST_F(TracerTest, ReleaseFunctionKeepsReplaysWorking) {
  auto held = std::make_shared<int>(42);
  auto tracer = make_tracer(
      [held](const Tensor& x) { return ops::mul(x, static_cast<double>(*held)); }, device());
  std::weak_ptr<int> watch = held;
  held.reset();
  tracer(ops::full({2}, 1.0, device()));
  tracer.release_function();
  EXPECT_TRUE(watch.expired());  // what the function held is gone
  EXPECT_EQ(read(tracer(ops::full({2}, 2.0, device()))), std::vector<float>(2, 84.0f));
}

TEST_F(TracerTest, ReleaseTraceIsIdempotentAndAllowsANewCapture) {
  auto tracer = make_tracer(affine, device());
  tracer(ops::full({8}, 1.0, device()), 1.0f);
  EXPECT_EQ(device().stats().live_traces, 1u);
  EXPECT_GT(tracer.trace_bytes(), 0u);
  tracer.release_trace();
  tracer.release_trace();
  EXPECT_EQ(device().stats().live_traces, 0u);
  EXPECT_FALSE(tracer.trace_captured());
  // A new capture may even use another shape.
  const Tensor& y = tracer(ops::full({3}, 2.0, device()), 1.0f);
  EXPECT_EQ(read(y), std::vector<float>(3, 3.0f));
  EXPECT_EQ(tracer.stats().captures, 2u);
  EXPECT_EQ(device().stats().live_traces, 1u);
}

TEST_F(TracerTest, DestroyingTheTracerReleasesItsTrace) {
  {
    auto tracer = make_tracer(affine, device());
    tracer(ops::full({8}, 1.0, device()), 1.0f);
    EXPECT_EQ(device().stats().live_traces, 1u);
  }
  EXPECT_EQ(device().stats().live_traces, 0u);
  EXPECT_EQ(device().stats().trace_bytes, 0u);
}

TEST_F(TracerTest, ReentrantCallIsRejected) {
  std::function<Tensor(const Tensor&)> inner;
  auto tracer = make_tracer([&](const Tensor& x) { return inner(x); }, device(),
                            TraceOptions{.prep_run = false, .name = "outer"});
  inner = [&](const Tensor& x) -> Tensor { return tracer(x); };
  EXPECT_RETRACE_ERROR(tracer(ops::full({2}, 1.0, device())), failed_precondition,
                       "tracer 'outer' was called while it is capturing");
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(TracerTest, CaptureLogsAtDebugLevel) {
  LogCapture logs;
  auto tracer = make_tracer(affine, device(), TraceOptions{.name = "logged"});
  tracer(ops::full({2}, 1.0, device()), 1.0f);
  tracer.release_trace();
  EXPECT_TRUE(logs.contains(LogLevel::debug, "tracer 'logged': captured trace"));
  EXPECT_TRUE(logs.contains(LogLevel::debug, "tracer 'logged': released 1 trace(s)"));
}

TEST(TracerMultiDeviceTest, CapturesAndReplaysOnEveryDevice) {
  RETRACE_TEST_DEVICE(device0, {.id = DeviceId{0}});
  RETRACE_TEST_DEVICE(device1, {.id = DeviceId{1}});
  Device& d0 = *device0;
  Device& d1 = *device1;
  LogCapture logs;
  auto tracer = make_tracer(
      [](const Tensor& a, const Tensor& b) {
        return std::make_tuple(ops::add(a, 1.0), ops::mul(b, 2.0));
      },
      std::vector<Device*>{&d0, &d1});
  const auto& [ya, yb] = tracer(ops::full({8}, 1.0, d0), ops::full({8}, 3.0, d1));
  EXPECT_EQ(d0.stats().live_traces, 1u);
  EXPECT_EQ(d1.stats().live_traces, 1u);
  EXPECT_EQ(tracer.trace_ids().size(), 2u);
  tracer(ops::full({8}, 10.0, d0), ops::full({8}, 20.0, d1));  // blocking: both have run
  EXPECT_EQ(ya.to_vector<float>(), std::vector<float>(8, 11.0f));
  EXPECT_EQ(yb.to_vector<float>(), std::vector<float>(8, 40.0f));
  EXPECT_FALSE(logs.contains(LogLevel::warning, "blocking"));
  tracer.call(CallOptions{.blocking = Blocking::no}, ops::full({8}, 2.0, d0),
              ops::full({8}, 3.0, d1));
  d0.synchronize();
  d1.synchronize();
  EXPECT_EQ(ya.to_vector<float>(), std::vector<float>(8, 3.0f));
  EXPECT_EQ(yb.to_vector<float>(), std::vector<float>(8, 6.0f));
  // At replay a host tensor is unambiguous: it is written into its slot's device.
  tracer(Tensor::from_vector<float>(std::vector<float>(8, 4.0f), {8}, DType::float32),
         ops::full({8}, 1.0, d1));
  d0.synchronize();
  EXPECT_EQ(ya.to_vector<float>(), std::vector<float>(8, 5.0f));
  EXPECT_RETRACE_ERROR(tracer(ops::full({8}, 1.0, d1), ops::full({8}, 1.0, d1)), invalid_argument,
                       fmt::format("input args[0]: is on {}, but the captured input is on {}",
                                   d1.name(), d0.name()));
  tracer.release_trace();
  EXPECT_EQ(d0.stats().live_traces, 0u);
  EXPECT_EQ(d1.stats().live_traces, 0u);
  auto fresh = make_tracer([](const Tensor& a) { return ops::add(a, 1.0); },
                           std::vector<Device*>{&d0, &d1});
  EXPECT_RETRACE_ERROR(fresh(Tensor::from_vector<float>({1.0f}, {1}, DType::float32)),
                       invalid_argument,
                       fmt::format("input args[0]: is a host tensor; a tracer over several "
                                   "devices ({}, {}) needs its inputs on a device",
                                   d0.name(), d1.name()));
}

TEST(TracerConstructionTest, RejectsBadDeviceLists) {
  RETRACE_TEST_DEVICE(device);
  auto fn = [](const Tensor& x) { return x; };
  EXPECT_RETRACE_ERROR((void)make_tracer(fn, std::vector<Device*>{}), invalid_argument,
                       "needs at least one device");
  EXPECT_RETRACE_ERROR((void)make_tracer(fn, std::vector<Device*>{device.get(), device.get()}),
                       invalid_argument, fmt::format("device {} is listed twice", device->name()));
}

// The differential test: a residual MLP block with a nested input tree and scalars, replayed 100
// times with fresh inputs, equals eager execution bit for bit.
struct BlockInputs {
  Tensor x;
  MlpWeights weights;
  std::map<std::string, Tensor> extras;
  float residual_scale;
  int depth;
};

Tensor mlp_block(const Tensor& x, const MlpWeights& w, const std::map<std::string, Tensor>& extras,
                 float residual_scale, int depth) {
  Tensor h = x;
  for (int i = 0; i < depth; ++i) {
    Tensor t = ops::add(ops::mul(h, w.w1), w.b1);
    t = ops::mul(t, t);                 // a square as the nonlinearity
    t = ops::mul(ops::mul(t, w.w2), 0.125);
    h = ops::add(h, ops::mul(t, residual_scale));
  }
  return ops::add(h, extras.at("shift"));
}

TEST_F(TracerTest, ReplayEqualsEagerBitForBitOverAHundredFreshInputs) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    const Shape shape{4, 32};
    auto tensor = [&](std::uint64_t salt) {
      return device_tensor(device(), random_floats(128, salt), shape, dtype);
    };
    MlpWeights weights{tensor(10), tensor(11), tensor(12)};
    auto tracer = make_tracer(mlp_block, device());
    const Tensor* first_output = nullptr;
    for (int call = 0; call < 100; ++call) {
      Tensor x = tensor(100 + call);
      std::map<std::string, Tensor> extras{{"shift", tensor(1000 + call)}};
      // Alternate device tensors at new addresses with host tensors.
      Tensor x_in = call % 2 == 0 ? x : x.to_host();
      const std::vector<float> eager = read(mlp_block(x, weights, extras, 0.5f, 3));
      const Tensor& traced = tracer(x_in, weights, extras, 0.5f, 3);
      if (first_output == nullptr) first_output = &traced;
      EXPECT_EQ(&traced, first_output);
      ASSERT_EQ(read(traced), eager) << "call " << call << " dtype " << dtype_name(dtype);
    }
    EXPECT_EQ(tracer.stats().captures, 1u);
    EXPECT_EQ(tracer.stats().replays, 99u);
    // weights (3 tensors) are passed at their slots' addresses: no copy.
    EXPECT_EQ(tracer.stats().copies_skipped, 3u);
    EXPECT_EQ(tracer.stats().copies, 2u);
  }
}

}  // namespace
}  // namespace retrace
