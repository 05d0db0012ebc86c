// Conformance: command queues, ordering, events, blocking and non-blocking work, sticky errors.
#include "conformance/backends.hpp"
#include "support.hpp"

namespace retrace::conformance {
namespace {

constexpr QueueId q0{0};
constexpr QueueId q1{1};

TEST_P(DeviceConformance, HasAtLeastTwoQueuesAndRejectsOthers) {
  EXPECT_GE(device().num_queues(), 2u);
  EXPECT_RETRACE_ERROR(device().synchronize(QueueId{7}), invalid_argument,
                       fmt::format("synchronize: queue 7 does not exist on {} (it has queues "
                                   "0..{})",
                                   device().name(), device().num_queues() - 1));
  Tensor t = ops::full({4}, 0.0, device());
  EXPECT_RETRACE_ERROR(ops::fill(t, 1.0, QueueId{2}), invalid_argument, "fill: queue 2");
}

TEST_P(DeviceConformance, QueueRunsItsWorkInOrder) {
  Tensor x = ops::full({1024}, 1.0, device());
  for (int i = 0; i < 200; ++i) {
    ops::mul(x, 2.0, x);
    ops::add(x, -1.0, x);  // x = 2x - 1 keeps x == 1 only if applied in order
  }
  ops::add(x, 1.0, x);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(1024, 2.0f));
}

TEST_P(DeviceConformance, EventsOrderWorkAcrossQueues) {
  constexpr std::int64_t n = 1 << 16;
  for (int round = 0; round < 20; ++round) {
    Tensor x = ops::full({n}, 0.0, device(), DType::float32, Layout::row_major, q0);
    for (int i = 0; i < 10; ++i) ops::add(x, 1.0, x, q0);
    Event produced = device().record_event(q0);
    device().wait_event(q1, produced);
    Tensor y = ops::mul(x, 2.0, q1);  // must see all ten additions
    device().synchronize(q1);
    EXPECT_TRUE(produced.is_complete());
    EXPECT_EQ(y.to_vector<float>(q1), std::vector<float>(n, 20.0f)) << "round " << round;
  }
}

TEST_P(DeviceConformance, HostWaitsOnEvents) {
  Tensor x = ops::full({4096}, 3.0, device());
  Event done = device().record_event(q0);
  done.synchronize();
  EXPECT_TRUE(done.is_complete());
  EXPECT_EQ(done.queue(), q0);
  EXPECT_EQ(done.device(), &device());
  Event never;
  EXPECT_RETRACE_ERROR(device().wait_event(q1, never), invalid_argument, "never recorded");
  EXPECT_RETRACE_ERROR(never.synchronize(), invalid_argument, "never recorded");
  auto other = open(DeviceSpec{DeviceId{1}});
  Event foreign = other->record_event(q0);
  EXPECT_RETRACE_ERROR(device().wait_event(q1, foreign), invalid_argument,
                       fmt::format("recorded on {}, not {}", other->name(), device().name()));
}

TEST_P(DeviceConformance, NonBlockingWorkCompletesBySynchronize) {
  Tensor x = ops::full({256}, 1.0, device());
  device().begin_trace_capture(q0);
  ops::add(x, 1.0, x);
  const TraceId trace = device().end_trace_capture(q0);
  for (int i = 0; i < 50; ++i) device().execute_trace(trace, q0, Blocking::no);
  device().synchronize(q0);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(256, 51.0f));
  // Non-blocking writes stage their data: the source may change right after the call.
  std::vector<float> host(256, 7.0f);
  device().write(q0, *x.buffer(), 0, std::as_bytes(std::span(host)), Blocking::no);
  std::fill(host.begin(), host.end(), -1.0f);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(256, 7.0f));
  device().release_trace(trace);
}

TEST_P(DeviceConformance, SynchronizeAllWaitsForEveryQueue) {
  Tensor a = ops::full({1 << 15}, 0.0, device(), DType::float32, Layout::row_major, q0);
  Tensor b = ops::full({1 << 15}, 0.0, device(), DType::float32, Layout::row_major, q1);
  for (int i = 0; i < 8; ++i) {
    ops::add(a, 1.0, a, q0);
    ops::add(b, 2.0, b, q1);
  }
  device().synchronize();
  EXPECT_EQ(a.to_vector<float>(q1), std::vector<float>(1 << 15, 8.0f));
  EXPECT_EQ(b.to_vector<float>(q0), std::vector<float>(1 << 15, 16.0f));
  EXPECT_GE(device().stats().commands_executed, 18u);
}

TEST_P(DeviceConformance, FailingCommandSurfacesAtNextSynchronize) {
  Tensor bad = Tensor::from_vector<float>({1.0f, std::nanf(""), 3.0f}, {3}, DType::float32)
                   .to_device(device());
  Tensor x = ops::full({3}, 1.0, device());
  ops::assert_finite(bad);
  ops::add(x, 1.0, x);  // queued behind the failure: skipped
  EXPECT_RETRACE_ERROR(device().synchronize(q0), device_error,
                       fmt::format("op 'assert_finite' failed on queue 0 of {} (eager): element "
                                   "1 of 3",
                                   device().name()));
  // Reported once; the queue works again.
  EXPECT_NO_THROW(device().synchronize(q0));
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, 1.0f));
  ops::add(x, 1.0, x);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST_P(DeviceConformance, FailingCommandSurfacesAtReadAndReplay) {
  Tensor bad = Tensor::from_vector<float>({std::numeric_limits<float>::infinity()}, {1},
                                          DType::float32)
                   .to_device(device());
  ops::assert_finite(bad);
  EXPECT_RETRACE_ERROR((void)bad.to_vector<float>(), device_error, "op 'assert_finite'");

  Tensor x = ops::full({4}, 1.0, device());
  device().begin_trace_capture(q0);
  ops::assert_finite(bad);
  ops::add(x, 1.0, x);
  const TraceId trace = device().end_trace_capture(q0);
  device().execute_trace(trace, q0, Blocking::no);
  EXPECT_RETRACE_ERROR(device().execute_trace(trace, q0, Blocking::yes), device_error,
                       fmt::format("(command 0 of 2 in trace {})", trace));
  EXPECT_NO_THROW(device().synchronize());
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 1.0f));  // the add never ran
  device().release_trace(trace);
}

TEST_P(DeviceConformance, SynchronizeAllReportsAFailureAfterWaitingForAll) {
  Tensor bad = Tensor::from_vector<float>({std::nanf("")}, {1}, DType::float32).to_device(device());
  Tensor y = ops::full({1 << 14}, 0.0, device(), DType::float32, Layout::row_major, q0);
  ops::assert_finite(bad, q1);
  ops::add(y, 5.0, y, q0);
  EXPECT_RETRACE_ERROR(device().synchronize(), device_error,
                       fmt::format("queue 1 of {}", device().name()));
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(1 << 14, 5.0f));
}

}  // namespace
}  // namespace retrace::conformance
