// Conformance: trace capture, replay, release, capture violations, private trace memory.
#include "conformance/backends.hpp"
#include "support.hpp"

#include <cmath>
#include <functional>
#include <thread>

namespace retrace::conformance {
namespace {

using testing::device_tensor;
using testing::random_floats;
constexpr QueueId q0{0};
constexpr QueueId q1{1};

TEST_P(DeviceConformance, CaptureRecordsAndReplayExecutes) {
  const auto values = random_floats(64, 3);
  Tensor x = device_tensor(device(), values, {64});
  Tensor w = ops::full({64}, 0.5, device());
  device().synchronize();  // eager work still queued would otherwise count below
  const auto executed_before = device().stats().commands_executed;
  device().begin_trace_capture(q0);
  EXPECT_EQ(device().capturing_trace(q0).has_value(), true);
  EXPECT_TRUE(device().is_capturing());
  Tensor y = ops::add(ops::mul(x, w), 1.0);
  const TraceId trace = device().end_trace_capture(q0);
  EXPECT_FALSE(device().is_capturing());
  EXPECT_EQ(device().stats().commands_executed, executed_before);  // recorded, not run

  const TraceInfo info = device().trace_info(trace);
  EXPECT_EQ(info.id, trace);
  EXPECT_EQ(info.commands, 2u);
  EXPECT_EQ(info.ops, (std::vector<std::string_view>{"mul", "add"}));
  EXPECT_GT(info.bytes, 0u);
  EXPECT_EQ(device().stats().live_traces, 1u);

  device().execute_trace(trace, q0, Blocking::yes);
  std::vector<float> expected(64);
  for (int i = 0; i < 64; ++i) expected[i] = values[i] * 0.5f + 1.0f;
  EXPECT_EQ(y.to_vector<float>(), expected);

  // New input values, written in place: the replay sees them.
  const auto next = random_floats(64, 4);
  ops::copy(Tensor::from_vector<float>(next, {64}, DType::float32), x);
  device().execute_trace(trace, q1, Blocking::yes);  // any queue may replay
  for (int i = 0; i < 64; ++i) expected[i] = next[i] * 0.5f + 1.0f;
  EXPECT_EQ(y.to_vector<float>(), expected);

  device().release_trace(trace);
  EXPECT_EQ(device().stats().live_traces, 0u);
  EXPECT_FALSE(device().has_trace(trace));
  EXPECT_RETRACE_ERROR(device().execute_trace(trace, q0, Blocking::yes), invalid_argument,
                       fmt::format("trace {} does not exist on {}", trace, device().name()));
  EXPECT_RETRACE_ERROR(device().release_trace(trace), invalid_argument, "already released");
}

TEST_P(DeviceConformance, ReplayEqualsEagerBitForBit) {
  const auto values = random_floats(1000, 5, -3.0f, 3.0f);
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    Tensor x = device_tensor(device(), values, {10, 100}, dtype);
    auto step = [](const Tensor& in) {
      Tensor t = ops::mul(in, in);
      t = ops::add(t, 0.25);
      t = ops::mul(t, in);
      return ops::add(t, in);
    };
    const auto eager = step(x).to_vector<float>();
    device().begin_trace_capture(q0);
    Tensor out = step(x);
    const TraceId trace = device().end_trace_capture(q0);
    device().execute_trace(trace, q0, Blocking::yes);
    EXPECT_EQ(out.to_vector<float>(), eager) << dtype_name(dtype);
    device().release_trace(trace);
  }
}

// Every operation a capture forbids is rejected, the capture stays usable, and the device
// works normally after the capture ends.
TEST_P(DeviceConformance, CaptureViolationsAreRejectedAndLeaveTheDeviceUsable) {
  Tensor x = ops::full({32}, 1.0, device());
  Tensor host = Tensor::from_vector<float>(std::vector<float>(32, 9.0f), {32}, DType::float32);
  auto buffer = device().allocate(128);
  std::vector<std::byte> bytes(128);
  Event event = device().record_event(q1);
  device().begin_trace_capture(q1);
  Tensor w = ops::add(x, 2.0, q1);
  const TraceId other = device().end_trace_capture(q1);
  const std::vector<std::pair<std::string, std::function<void()>>> forbidden = {
      {"reading a device buffer to the host", [&] { device().read(q1, *buffer, 0, bytes); }},
      {"reading a device buffer to the host", [&] { (void)x.to_vector<float>(); }},
      {"writing host data to the device", [&] { device().write(q1, *buffer, 0, bytes); }},
      {"writing host data to the device", [&] { ops::copy(host, x); }},
      {"writing host data to the device", [&] { (void)host.to_device(device()); }},
      {"synchronize", [&] { device().synchronize(q0); }},
      {"synchronize", [&] { device().synchronize(q1); }},
      {"synchronize", [&] { device().synchronize(); }},
      {"recording an event", [&] { (void)device().record_event(q1); }},
      {"waiting on an event", [&] { device().wait_event(q1, event); }},
      {"waiting for an event on the host", [&] { event.synchronize(); }},
      {"a blocking execute_trace", [&] { device().execute_trace(other, q1, Blocking::yes); }},
  };
  for (const auto& [fragment, action] : forbidden) {
    device().begin_trace_capture(q0);
    Tensor y = ops::add(x, 1.0);
    EXPECT_RETRACE_ERROR(action(), capture_violation, fragment);
    EXPECT_RETRACE_ERROR(action(), capture_violation, "is capturing trace");
    Tensor z = ops::mul(y, 2.0);  // the capture goes on
    const TraceId trace = device().end_trace_capture(q0);
    EXPECT_EQ(device().trace_info(trace).commands, 2u) << fragment;
    device().execute_trace(trace, q0, Blocking::yes);
    EXPECT_EQ(z.to_vector<float>(), std::vector<float>(32, 4.0f)) << fragment;
    device().release_trace(trace);
  }
  // A non-blocking replay on another queue is fine during a capture.
  device().begin_trace_capture(q0);
  EXPECT_NO_THROW(device().execute_trace(other, q1, Blocking::no));
  (void)ops::add(x, 1.0);
  device().release_trace(device().end_trace_capture(q0));
  device().release_trace(other);
  EXPECT_EQ(w.to_vector<float>(q1), std::vector<float>(32, 3.0f));
  EXPECT_EQ(device().stats().live_traces, 0u);
}

// A profile replays the trace with each command timed, and computes what a replay computes;
// a backend that cannot time single commands says so (unimplemented), changing nothing.
TEST_P(DeviceConformance, ProfileTimesEveryCommandOrSaysItCannot) {
  Tensor x = ops::full({256}, 2.0, device());
  device().begin_trace_capture(q0);
  Tensor y = ops::exp(ops::mul(ops::add(x, 1.0), 0.5));
  const TraceId trace = device().end_trace_capture(q0);
  EXPECT_RETRACE_ERROR((void)device().profile_trace(trace, q0, 0), invalid_argument,
                       "replays must be from 1 to 1000000, got 0");
  EXPECT_RETRACE_ERROR((void)device().profile_trace(TraceId{987654321}, q0, 1), invalid_argument,
                       "profile_trace");
  const auto executed = device().stats().traces_executed;
  try {
    const TraceProfile profile = device().profile_trace(trace, q0, 5);
    EXPECT_EQ(profile.trace, trace);
    EXPECT_EQ(profile.replays, 5u);
    EXPECT_EQ(profile.ops, (std::vector<std::string_view>{"add", "mul", "exp"}));
    ASSERT_EQ(profile.command_ns.size(), 3u);
    for (double ns : profile.command_ns) EXPECT_GE(ns, 0.0);
    EXPECT_GT(profile.replay_ns, 0.0);
    EXPECT_EQ(device().stats().traces_executed, executed + 5);
    EXPECT_EQ(y.to_vector<float>(), std::vector<float>(256, std::exp(1.5f)));
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::unimplemented) << e.what();
    EXPECT_NE(e.message().find("cannot time the commands of trace"), std::string::npos);
  }
  // During a capture on the thread, profiling is a capture violation; the capture goes on.
  device().begin_trace_capture(q0);
  EXPECT_RETRACE_ERROR((void)device().profile_trace(trace, q1, 1), capture_violation,
                       "profile_trace");
  (void)ops::add(x, 1.0);
  device().release_trace(device().end_trace_capture(q0));
  device().release_trace(trace);
}

TEST_P(DeviceConformance, CaptureStateMachineErrorsNameTheState) {
  EXPECT_RETRACE_ERROR((void)device().end_trace_capture(q0), failed_precondition,
                       fmt::format("no capture is in progress on {}", device().name()));
  device().begin_trace_capture(q0);
  const TraceId capturing = *device().capturing_trace(q0);
  EXPECT_RETRACE_ERROR(device().begin_trace_capture(q0), failed_precondition,
                       fmt::format("queue 0 of {} is already capturing trace {}", device().name(),
                                   capturing));
  EXPECT_RETRACE_ERROR(device().begin_trace_capture(q1), failed_precondition,
                       "one capture per device at a time");
  EXPECT_RETRACE_ERROR((void)device().end_trace_capture(q1), failed_precondition,
                       fmt::format("queue 1 of {} is not capturing", device().name()));
  EXPECT_RETRACE_ERROR(device().execute_trace(capturing, q1, Blocking::yes), failed_precondition,
                       "is still being captured");
  const TraceId trace = device().end_trace_capture(q0);
  EXPECT_EQ(trace, capturing);
  device().begin_trace_capture(q1);
  EXPECT_RETRACE_ERROR(device().execute_trace(trace, q1, Blocking::yes), capture_violation,
                       "while that queue is capturing");
  EXPECT_NO_THROW(device().execute_trace(trace, q0, Blocking::no));  // another queue may
  (void)device().end_trace_capture(q1);
  device().synchronize();
}

TEST_P(DeviceConformance, CapturesAreThreadLocal) {
  Tensor x = ops::full({64}, 1.0, device(), DType::float32, Layout::row_major, q1);
  device().synchronize();
  device().begin_trace_capture(q0);
  const TraceId capturing = *device().capturing_trace(q0);
  std::thread other([&] {
    // Other queues keep working, with ordinary memory.
    Tensor y = ops::add(x, 1.0, q1);
    EXPECT_EQ(y.buffer()->trace(), std::nullopt);
    EXPECT_EQ(y.to_vector<float>(q1), std::vector<float>(64, 2.0f));
    device().synchronize();  // skips the capturing queue
    // The capturing queue is off limits.
    EXPECT_RETRACE_ERROR((void)ops::add(x, 1.0, q0), capture_violation,
                         fmt::format("from another thread while that queue is capturing trace {}",
                                     capturing));
    EXPECT_RETRACE_ERROR((void)device().end_trace_capture(q0), capture_violation,
                         "was begun by another thread; captures are thread-local");
    EXPECT_RETRACE_ERROR(device().synchronize(q0), capture_violation,
                         fmt::format("synchronize on queue 0 of {} is not allowed from another "
                                     "thread",
                                     device().name()));
  });
  other.join();
  Tensor z = ops::add(x, 5.0);
  EXPECT_EQ(z.buffer()->trace(), capturing);
  const TraceId trace = device().end_trace_capture(q0);
  EXPECT_EQ(device().trace_info(trace).commands, 1u);
  device().execute_trace(trace, q0, Blocking::yes);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(64, 6.0f));
  device().release_trace(trace);
}

TEST_P(DeviceConformance, TraceMemoryIsPrivateUntilRelease) {
  Tensor x = ops::full({4096}, 1.0, device());
  device().begin_trace_capture(q0);
  Tensor a = ops::add(x, 1.0);
  Tensor b = ops::mul(a, 3.0);
  Tensor c = ops::add(b, a);
  const TraceId trace = device().end_trace_capture(q0);
  const TraceInfo info = device().trace_info(trace);
  EXPECT_EQ(device().stats().trace_bytes, info.bytes);
  EXPECT_EQ(a.buffer()->trace(), trace);
  EXPECT_EQ(x.buffer()->trace(), std::nullopt);

  // Buffers allocated after the capture never overlap memory the trace's replays write.
  std::vector<Tensor> later;
  for (int i = 0; i < 16; ++i) later.push_back(ops::full({4096}, -7.0, device()));
  for (const Tensor& t : later) {
    for (const Tensor& owned : {a, b, c}) {
      const auto lo = owned.address(), hi = owned.address() + owned.nbytes();
      EXPECT_TRUE(t.address() + t.nbytes() <= lo || t.address() >= hi);
    }
  }
  for (int i = 0; i < 5; ++i) device().execute_trace(trace, q0, Blocking::no);
  device().synchronize();
  for (const Tensor& t : later) EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4096, -7.0f));
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(4096, 8.0f));

  // Dropping every handle to pool buffers keeps them reserved while the trace lives.
  const std::uint64_t a_address = a.address();
  a = b = Tensor();
  Tensor probe = ops::full({4096}, 0.0, device());
  EXPECT_NE(probe.address(), a_address);
  device().execute_trace(trace, q0, Blocking::yes);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(4096, 8.0f));

  // After release, an output still held stays valid and is never handed out again.
  device().release_trace(trace);
  EXPECT_EQ(device().stats().trace_bytes, 0u);
  std::vector<Tensor> more;
  for (int i = 0; i < 8; ++i) more.push_back(ops::full({4096}, 5.0, device()));
  for (const Tensor& t : more) EXPECT_NE(t.address(), c.address());
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(4096, 8.0f));
}

TEST_P(DeviceConformance, CaptureReusesItsOwnFreedTemporaries) {
  Tensor x = ops::full({1024}, 1.0, device());
  device().begin_trace_capture(q0);
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = ops::add(y, 1.0);  // each temporary dies after one use
  const TraceId trace = device().end_trace_capture(q0);
  EXPECT_LE(device().trace_info(trace).bytes, 3u * (1024 * 4 + 2 * 64));
  device().execute_trace(trace, q0, Blocking::yes);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(1024, 51.0f));
  device().release_trace(trace);
}

// A temporary freed during the capture may come back for a smaller tensor; replays still write
// the larger one there first. Guard bytes must not call that an overrun (found by the random
// program test).
TEST_P(DeviceConformance, ReusingALargerTemporaryIsNotAnOverrun) {
  Tensor x = ops::full({64}, 1.0, device());
  Tensor small = ops::full({40}, 1.0, device());
  device().begin_trace_capture(q0);
  Tensor y;
  {
    Tensor big = ops::add(x, 1.0);  // 256 bytes, freed at the end of the scope
    y = ops::sum(ops::reshape(big, {2, 32}), ops::KeepDim::yes);
  }
  Tensor reused = ops::mul(small, 3.0);  // 160 bytes: may reuse big's block
  const TraceId trace = device().end_trace_capture(q0);
  for (int i = 0; i < 3; ++i) device().execute_trace(trace, q0, Blocking::yes);
  EXPECT_EQ(reused.to_vector<float>(), std::vector<float>(40, 3.0f));
  device().release_trace(trace);
  reused = y = Tensor();
  EXPECT_NO_THROW(device().synchronize());
}

TEST_P(DeviceConformance, TraceKeepsOutsideBuffersAlive) {
  Tensor out = ops::full({256}, 0.0, device());
  TraceId trace;
  {
    Tensor input = ops::full({256}, 2.0, device());  // dropped by the caller after capture
    device().begin_trace_capture(q0);
    ops::mul(input, 4.0, out);
    trace = device().end_trace_capture(q0);
  }
  EXPECT_EQ(device().trace_info(trace).external_buffers, 2u);
  Tensor filler = ops::full({256}, 100.0, device());  // must not land on the input's memory
  device().execute_trace(trace, q0, Blocking::yes);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(256, 8.0f));
  device().release_trace(trace);
}

TEST_P(DeviceConformance, TraceRegionLimitIsAClearError) {
  DeviceSpec spec;
  spec.trace_region_bytes = 64 << 10;
  auto limited = open(spec);
  Tensor x = ops::full({8192}, 1.0, *limited);  // 32 KiB
  limited->begin_trace_capture(q0);
  Tensor a = ops::add(x, 1.0);
  EXPECT_RETRACE_ERROR(
      { Tensor b = ops::add(a, 1.0); Tensor c = ops::add(b, 1.0); }, out_of_memory,
      "raise trace_region_bytes");
  const TraceId trace = limited->end_trace_capture(q0);
  limited->release_trace(trace);
  EXPECT_EQ(limited->stats().trace_bytes, 0u);
  EXPECT_EQ(ops::add(x, 1.0).to_vector<float>(), std::vector<float>(8192, 2.0f));
}

TEST_P(DeviceConformance, ThousandCyclesLeaveStatsWhereTheyStarted) {
  Tensor x = ops::full({512}, 1.0, device());
  device().synchronize();
  const DeviceStats before = device().stats();
  for (int i = 0; i < 1000; ++i) {
    device().begin_trace_capture(q0);
    Tensor y = ops::mul(ops::add(x, 1.0), 2.0);
    const TraceId trace = device().end_trace_capture(q0);
    device().execute_trace(trace, QueueId{static_cast<std::uint32_t>(i % 2)},
                           i % 3 == 0 ? Blocking::no : Blocking::yes);
    device().release_trace(trace);
  }
  device().synchronize();
  const DeviceStats after = device().stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.trace_bytes, before.trace_bytes);
  EXPECT_EQ(after.live_buffers, before.live_buffers);
  EXPECT_EQ(after.live_traces, 0u);
  EXPECT_EQ(after.traces_executed, before.traces_executed + 1000);
}

TEST_P(DeviceConformance, ReleasingWaitsForReplaysInFlight) {
  Tensor x = ops::full({1 << 16}, 0.0, device());
  device().begin_trace_capture(q0);
  Tensor y = x;
  for (int i = 0; i < 20; ++i) y = ops::add(y, 1.0);
  ops::copy(y, x);
  const TraceId trace = device().end_trace_capture(q0);
  device().synchronize();  // x was filled on queue 0; the replays run on queue 1
  for (int i = 0; i < 10; ++i) device().execute_trace(trace, q1, Blocking::no);
  device().release_trace(trace);  // must not free memory the queued replays still use
  std::vector<Tensor> reuse;
  for (int i = 0; i < 30; ++i) reuse.push_back(ops::full({1 << 16}, -1.0, device(), DType::float32,
                                                         Layout::row_major, q0));
  device().synchronize();
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(1 << 16, 200.0f));
}

TEST_P(DeviceConformance, DestroyingADeviceReleasesItsTraces) {
  auto scratch = open();
  Tensor x = ops::full({64}, 1.0, *scratch);
  scratch->begin_trace_capture(q0);
  Tensor y = ops::add(x, 1.0);
  (void)scratch->end_trace_capture(q0);
  scratch->begin_trace_capture(q1);  // left open on purpose
  Tensor z = ops::add(x, 2.0, q1);
  scratch.reset();
  EXPECT_EQ(y.device(), nullptr);
}

}  // namespace
}  // namespace retrace::conformance
