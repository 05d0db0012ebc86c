// Lifetimes and identity: handles that outlive their device, ids that are never reused, objects
// rebuilt at the address of a destroyed one, aliased and swapped inputs, and the queue the ops of
// a traced function go to. Run under ASan, a use-after-free here fails the suite.
#include "support.hpp"

#include <optional>
#include <unordered_map>

namespace retrace_lifetime_test {

using retrace::Device;
using retrace::Tensor;

struct Pipeline : retrace::TraceOwner {
  Device* device = nullptr;
  double gain = 2.0;
  int calls = 0;
  Tensor step(const Tensor& x) {
    ++calls;
    return retrace::ops::mul(x, gain);
  }
};

struct Scaler : retrace::TraceOwner {  // bound by identity to a traced function
  explicit Scaler(double s) : scale(s) {}
  double scale;
};

Tensor scaled(const Tensor& x, Device& device, const Scaler& scaler) {
  (void)device;
  return retrace::ops::mul(x, scaler.scale);
}

Tensor shared_scaled(const Tensor& x, Device& device, std::shared_ptr<const Scaler> scaler) {
  (void)device;
  return retrace::ops::mul(x, scaler->scale);
}

Tensor plus_one(const Tensor& x) { return retrace::ops::add(x, 1.0); }

}  // namespace retrace_lifetime_test

namespace retrace {
namespace {

using namespace retrace_lifetime_test;
using testing::device_tensor;

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }
std::vector<float> filled(std::size_t n, float v) { return std::vector<float>(n, v); }

// --- handles that outlive their device ---------------------------------------------------------

TEST(LifetimeTest, TracerReplayAfterTheDeviceIsGoneRaises) {
  RETRACE_TEST_DEVICE(device);
  const std::string name = device->name();
  auto step = make_tracer(plus_one, *device);
  Tensor x = ops::full({4}, 1.0, *device);
  EXPECT_EQ(values(step(x)), filled(4, 2.0f));
  device.reset();  // destroyed under the tracer, its slots and its outputs
  EXPECT_RETRACE_ERROR((void)step(x), failed_precondition, name + " was closed");
  EXPECT_RETRACE_ERROR((void)step.inputs(), failed_precondition, name + " was closed");
  EXPECT_RETRACE_ERROR((void)step.outputs(), failed_precondition, name + " was closed");
  EXPECT_FALSE(step.devices_open());
  step.release_trace();  // nothing left to release; no crash
}

TEST(LifetimeTest, TracerFirstCallAfterTheDeviceIsGoneRaises) {
  RETRACE_TEST_DEVICE(device);
  const std::string name = device->name();
  auto step = make_tracer(plus_one, *device);
  Tensor host = Tensor::from_vector<float>(filled(4, 1.0f), {4}, DType::float32);
  device.reset();
  EXPECT_RETRACE_ERROR((void)step(host), failed_precondition, name + " was closed");
  EXPECT_RETRACE_ERROR((void)step.untraced(host), failed_precondition, name + " was closed");
}

TEST(LifetimeTest, TensorsEventsAndStateAfterCloseRaiseNamingTheDevice) {
  RETRACE_TEST_DEVICE(device);
  const std::string closed = device->name() + " was closed";
  Tensor t = ops::full({8}, 1.0, *device);
  StateTensor state;
  state.update(ops::full({2}, 0.0, *device), Traced::no);
  Event event = device->record_event(kDefaultQueue);
  device->begin_trace_capture(kDefaultQueue);
  Tensor y = ops::add(t, 1.0);
  const TraceId trace = device->end_trace_capture(kDefaultQueue);
  device->close();
  EXPECT_TRUE(device->is_closed());
  device->close();  // idempotent
  EXPECT_RETRACE_ERROR((void)t.to_vector<float>(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)t.clone(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)ops::add(t, 1.0), failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)y.to_host(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(state.update(Tensor::from_vector<float>(filled(2, 1.0f), {2},
                                                            DType::float32),
                                    Traced::yes),
                       failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)event.is_complete(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(event.synchronize(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(device->execute_trace(trace, kDefaultQueue, Blocking::yes),
                       failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)device->trace_info(trace), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(device->release_trace(trace), failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)device->allocate(64), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(device->synchronize(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR((void)device->stats(), failed_precondition, closed);
  EXPECT_RETRACE_ERROR(device->begin_trace_capture(kDefaultQueue), failed_precondition, closed);
  EXPECT_NE(t.to_string().find("(closed)"), std::string::npos) << t.to_string();
  // Dropping handles of a closed device is fine.
  t = Tensor();
  y = Tensor();
}

TEST(LifetimeTest, CloseDuringACaptureDropsIt) {
  RETRACE_TEST_DEVICE(device);
  Tensor t = ops::full({8}, 1.0, *device);
  device->begin_trace_capture(kDefaultQueue);
  Tensor y = ops::add(t, 1.0);
  device->close();
  EXPECT_FALSE(device->is_capturing());
  EXPECT_RETRACE_ERROR((void)y.to_host(), failed_precondition, "was closed");
}

TEST(LifetimeTest, TracedWrappersRaiseOnAClosedDevice) {
  RETRACE_TEST_DEVICE(device);
  auto traced = traced_function_injected(plus_one);
  Tensor x = ops::full({4}, 1.0, *device);
  EXPECT_EQ(values(traced(*device, x)), filled(4, 2.0f));
  device->close();
  EXPECT_RETRACE_ERROR((void)traced(*device, x), failed_precondition, "was closed");

  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Pipeline pipeline;
  pipeline.device = device.get();
  EXPECT_RETRACE_ERROR((void)step(pipeline, x), failed_precondition, "was closed");
}

// --- identity -------------------------------------------------------------------------------

TEST(IdentityTest, DeviceUidsAreNeverReused) {
  std::vector<std::uint64_t> seen;
  for (int i = 0; i < 4; ++i) {
    RETRACE_TEST_DEVICE(device);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), device->uid()), 0);
    seen.push_back(device->uid());
  }
}

TEST(IdentityTest, ATraceIdOfAnotherDeviceIsRejected) {
  RETRACE_TEST_DEVICE(a, {.id = DeviceId{0}});
  RETRACE_TEST_DEVICE(b, {.id = DeviceId{1}});
  Tensor xa = ops::full({4}, 1.0, *a);
  Tensor xb = ops::full({4}, 1.0, *b);
  b->begin_trace_capture(kDefaultQueue);
  (void)ops::add(xb, 1.0);
  const TraceId on_b = b->end_trace_capture(kDefaultQueue);
  a->begin_trace_capture(kDefaultQueue);
  (void)ops::add(xa, 1.0);
  const TraceId on_a = a->end_trace_capture(kDefaultQueue);
  EXPECT_NE(on_a, on_b);  // unique in the process
  EXPECT_RETRACE_ERROR(a->execute_trace(on_b, kDefaultQueue, Blocking::yes), invalid_argument,
                       "belongs to another device (" + b->name() + ")");
  EXPECT_RETRACE_ERROR(a->release_trace(on_b), invalid_argument, "belongs to another device");
  EXPECT_TRUE(b->has_trace(on_b));
  b->release_trace(on_b);
  EXPECT_RETRACE_ERROR(a->execute_trace(on_b, kDefaultQueue, Blocking::yes), invalid_argument,
                       "does not exist on " + a->name());
  a->release_trace(on_a);
}

TEST(IdentityTest, ANewDeviceAtTheAddressOfADestroyedOneCapturesAfresh) {
  auto traced = traced_function_injected(plus_one);
  std::optional<std::uintptr_t> previous;
  for (int round = 0; round < 3; ++round) {
    RETRACE_TEST_DEVICE(device);
    // Allocators hand a freed block of the same size right back: usually the same address.
    const auto address = reinterpret_cast<std::uintptr_t>(device.get());
    if (previous) RecordProperty("same_address", address == *previous ? "yes" : "no");
    previous = address;
    Tensor x = ops::full({4}, static_cast<double>(round), *device);
    EXPECT_EQ(values(traced(*device, x)), filled(4, static_cast<float>(round) + 1.0f));
    EXPECT_EQ(values(traced(*device, ops::full({4}, 5.0, *device))), filled(4, 6.0f));
  }
  EXPECT_EQ(traced.stats().captures, 3u);
}

TEST(IdentityTest, ANewOwnerInTheSameStorageGetsItsOwnTrace) {
  RETRACE_TEST_DEVICE(device);
  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Tensor x = ops::full({4}, 1.0, *device);
  std::optional<Pipeline> pipeline;
  pipeline.emplace();
  pipeline->device = device.get();
  const Pipeline* first = &*pipeline;
  const std::uint64_t first_id = pipeline->trace_owner_id();
  EXPECT_EQ(values(step(*pipeline, x)), filled(4, 2.0f));
  pipeline.emplace();  // destroyed, and a new one built in the same storage
  EXPECT_EQ(&*pipeline, first);
  EXPECT_NE(pipeline->trace_owner_id(), first_id);
  pipeline->device = device.get();
  pipeline->gain = 10.0;
  EXPECT_EQ(values(step(*pipeline, x)), filled(4, 10.0f));
  EXPECT_EQ(pipeline->calls, 2);  // prep run and capture: a new trace, not the old one
  EXPECT_EQ(step.stats().captures, 2u);
  EXPECT_EQ(device->stats().live_traces, 1u);
}

TEST(IdentityTest, AssigningToAnOwnerReleasesItsTraces) {
  RETRACE_TEST_DEVICE(device);
  auto step = traced_method(&Pipeline::step, [](Pipeline& p) -> Device& { return *p.device; });
  Tensor x = ops::full({4}, 1.0, *device);
  Pipeline pipeline;
  pipeline.device = device.get();
  EXPECT_EQ(values(step(pipeline, x)), filled(4, 2.0f));
  Pipeline other;
  other.device = device.get();
  other.gain = 3.0;
  pipeline = other;
  EXPECT_EQ(step.live_traces(pipeline), 0u);
  EXPECT_EQ(device->stats().live_traces, 0u);
  EXPECT_EQ(values(step(pipeline, x)), filled(4, 3.0f));
}

TEST(IdentityTest, ANewBoundObjectInTheSameStorageGetsItsOwnTrace) {
  RETRACE_TEST_DEVICE(device);
  auto traced = traced_function(scaled);
  Tensor x = ops::full({4}, 1.0, *device);
  std::optional<Scaler> scaler;
  scaler.emplace(2.0);
  const Scaler* first = &*scaler;
  EXPECT_EQ(values(traced(x, *device, *scaler)), filled(4, 2.0f));
  EXPECT_EQ(device->stats().live_traces, 1u);
  scaler.emplace(7.0);
  EXPECT_EQ(&*scaler, first);
  EXPECT_EQ(device->stats().live_traces, 0u);  // the trace died with the object it bound
  EXPECT_EQ(values(traced(x, *device, *scaler)), filled(4, 7.0f));
  EXPECT_EQ(traced.stats().captures, 2u);
}

TEST(IdentityTest, ASharedBoundObjectIsKeptAliveByItsTrace) {
  RETRACE_TEST_DEVICE(device);
  auto traced = traced_function(shared_scaled);
  Tensor x = ops::full({4}, 1.0, *device);
  auto scaler = std::make_shared<const Scaler>(4.0);
  std::weak_ptr<const Scaler> watch = scaler;
  EXPECT_EQ(values(traced(x, *device, scaler)), filled(4, 4.0f));
  EXPECT_EQ(values(traced(x, *device, scaler)), filled(4, 4.0f));
  EXPECT_EQ(traced.stats().captures, 1u);
  scaler.reset();
  EXPECT_FALSE(watch.expired());  // held by the trace: its address cannot be reused
  traced.release_all();
  EXPECT_TRUE(watch.expired());
}

// --- inputs that alias ----------------------------------------------------------------------

TEST(AliasingTest, OneTensorForTwoInputsGetsTwoSlots) {
  RETRACE_TEST_DEVICE(device);
  auto step = make_tracer(
      [](const Tensor& a, const Tensor& b) { return ops::sub(a, ops::mul(b, 2.0)); }, *device);
  Tensor x = ops::full({4}, 3.0, *device);
  EXPECT_EQ(values(step(x, x)), filled(4, -3.0f));
  const auto& [slot_a, slot_b] = step.inputs();
  EXPECT_NE(slot_a.address(), slot_b.address());
  EXPECT_EQ(values(step(ops::full({4}, 10.0, *device), ops::full({4}, 1.0, *device))),
            filled(4, 8.0f));
  // x became the first slot (device inputs are the slots), so it now holds 10: 10 - 2 * 10.
  EXPECT_EQ(values(step(x, x)), filled(4, -10.0f));
  EXPECT_EQ(values(step(ops::full({4}, 3.0, *device), ops::full({4}, 3.0, *device))),
            filled(4, -3.0f));
}

TEST(AliasingTest, SwappedSlotsAreReadBeforeTheyAreOverwritten) {
  RETRACE_TEST_DEVICE(device);
  auto step = make_tracer([](const Tensor& a, const Tensor& b) { return ops::sub(a, b); },
                          *device);
  EXPECT_EQ(values(step(ops::full({4}, 5.0, *device), ops::full({4}, 2.0, *device))),
            filled(4, 3.0f));
  const auto [slot_a, slot_b] = step.inputs();  // handles on the two slots
  EXPECT_EQ(values(step(slot_b, slot_a)), filled(4, -3.0f));
  EXPECT_EQ(values(step(slot_b, slot_a)), filled(4, 3.0f));
  EXPECT_EQ(values(step(slot_a, slot_a)), filled(4, 0.0f));
}

// --- the queue the ops go to ------------------------------------------------------------------

TEST(QueueTest, OpsOfATracedFunctionFollowTheCapturedQueue) {
  RETRACE_TEST_DEVICE(device);
  auto step = make_tracer(plus_one, *device);
  const CallOptions on_1{.queue = QueueId{1}};
  Tensor x = ops::full({4}, 1.0, *device);
  device->synchronize();  // x was made on queue 0; the calls below run on queue 1
  EXPECT_EQ(values(step.call(on_1, x)), filled(4, 2.0f));
  const TraceInfo info = device->trace_info(step.trace_ids().front());
  EXPECT_EQ(info.captured_on, QueueId{1});
  EXPECT_EQ(info.commands, 1u);  // the add was recorded, not run outside the trace
  Tensor next = ops::full({4}, 41.0, *device);
  device->synchronize();
  const Tensor& y = step.call(on_1, next);
  EXPECT_EQ(values(y), filled(4, 42.0f));
}

TEST(QueueTest, AnOpSentToAnotherQueueDuringACaptureIsRejected) {
  RETRACE_TEST_DEVICE(device);
  auto step = make_tracer([](const Tensor& x) { return ops::add(x, 1.0, QueueId{0}); }, *device,
                          {.prep_run = false});
  Tensor x = ops::full({4}, 1.0, *device);
  EXPECT_RETRACE_ERROR((void)step.call({.queue = QueueId{1}}, x), capture_violation,
                       "would run now, outside the trace");
  EXPECT_FALSE(step.trace_captured());
  EXPECT_EQ(device->stats().live_traces, 0u);
  EXPECT_FALSE(device->is_capturing());
  EXPECT_EQ(values(step.call({.queue = QueueId{0}}, x)), filled(4, 2.0f));
}

TEST(QueueTest, DefaultQueueScopeSetsTheQueueOfDefaultOps) {
  RETRACE_TEST_DEVICE(device);
  Tensor x = ops::full({4}, 1.0, *device);
  {
    DefaultQueueScope scope(QueueId{1});
    device->begin_trace_capture(kDefaultQueue);
    EXPECT_EQ(device->capturing_trace(QueueId{1}).has_value(), true);
    (void)ops::add(x, 1.0);
    const TraceId trace = device->end_trace_capture(kDefaultQueue);
    EXPECT_EQ(device->trace_info(trace).captured_on, QueueId{1});
    device->release_trace(trace);
  }
  device->begin_trace_capture(kDefaultQueue);
  EXPECT_EQ(device->capturing_trace(QueueId{0}).has_value(), true);
  (void)device->end_trace_capture(kDefaultQueue);
}

}  // namespace
}  // namespace retrace
