// One vocabulary for Tracer and the traced wrappers: TraceOptions, CallOptions (with any
// hashable trace key), operator() as the traced call everywhere, untraced(), inputs() and
// last_capture_reason() on every wrapper, movable tracers, non-const Tensor& parameters, and
// stale copies of outputs caught when they are read.
#include "support.hpp"

#include <tuple>

namespace retrace_vocabulary_test {

using retrace::Device;
using retrace::Tensor;

struct Model : retrace::TraceOwner {
  Device* device = nullptr;
  Tensor step(const Tensor& x, float t) { return retrace::ops::mul(x, t); }
};

Tensor scale_by(const Tensor& x, Device& device, double s) {
  (void)device;
  return retrace::ops::mul(x, s);
}

Tensor twice(const Tensor& x) { return retrace::ops::add(x, x); }

}  // namespace retrace_vocabulary_test

namespace retrace {
namespace {

using namespace retrace_vocabulary_test;

class VocabularyTest : public testing::DeviceTest {
 protected:
  Tensor full(std::int64_t n, double v) { return ops::full({n}, v, device()); }
  static std::vector<float> filled(std::size_t n, float v) { return std::vector<float>(n, v); }
};

TEST(TraceKeyTest, StringsIntegersBoolsAndTuplesCompareByValue) {
  EXPECT_EQ(TraceKey(), TraceKey(""));
  EXPECT_EQ(TraceKey(256), TraceKey(std::int64_t{256}));
  EXPECT_EQ(TraceKey(256), TraceKey(256u));
  EXPECT_FALSE(TraceKey(1) == TraceKey(true));
  EXPECT_FALSE(TraceKey("256") == TraceKey(256));
  EXPECT_EQ(TraceKey(std::tuple{true, 256}), TraceKey(std::pair{true, 256}));
  EXPECT_FALSE(TraceKey(std::tuple{true, 256}) == TraceKey(std::tuple{false, 256}));
  EXPECT_FALSE(TraceKey(std::tuple{std::tuple{1, 2}, 3}) == TraceKey(std::tuple{1, std::tuple{2, 3}}));
  EXPECT_EQ(TraceKey(std::tuple{true, 256}).hash(), TraceKey(std::pair{true, 256}).hash());
  EXPECT_EQ(TraceKey(std::tuple{true, 256, "cfg"}).to_string(), "(true, 256, \"cfg\")");
  EXPECT_EQ(TraceKey(std::tuple{std::tuple{1, 2}, 3}).to_string(), "((1, 2), 3)");
  EXPECT_EQ(TraceKey(~std::uint64_t{0}).to_string(), "18446744073709551615");
}

TEST_F(VocabularyTest, TupleKeysSelectTraces) {
  auto step = traced_method(&Model::step, [](Model& m) -> Device& { return *m.device; });
  Model model;
  model.device = &device();
  for (bool cfg : {true, false, true}) {
    for (std::int64_t tokens : {8, 16, 8}) {
      const Tensor& out = step.call({.key = std::tuple{cfg, tokens}}, model, full(tokens, 1.0),
                                    cfg ? 2.0f : 3.0f);
      EXPECT_EQ(out.to_vector<float>(), filled(static_cast<std::size_t>(tokens), cfg ? 2.0f : 3.0f));
    }
  }
  EXPECT_EQ(step.stats().captures, 4u);
  EXPECT_EQ(step.stats().replays, 5u);
  EXPECT_EQ(step.live_traces(model), 4u);
  step.release(model, std::tuple{true, std::int64_t{8}});
  EXPECT_EQ(step.live_traces(model), 3u);
}

TEST_F(VocabularyTest, OperatorCallIsTracedEverywhereAndUntracedIsThePlainCall) {
  auto method = traced_method(&Model::step, [](Model& m) -> Device& { return *m.device; });
  auto function = traced_function(scale_by);
  auto injected = traced_function_injected(twice);
  auto tracer = make_tracer(twice, device());
  Model model;
  model.device = &device();
  Tensor x = full(4, 1.0);
  EXPECT_EQ(method.untraced(model, x, 5.0f).to_vector<float>(), filled(4, 5.0f));
  EXPECT_EQ(function.untraced(x, device(), 3.0).to_vector<float>(), filled(4, 3.0f));
  EXPECT_EQ(injected.untraced(x).to_vector<float>(), filled(4, 2.0f));
  EXPECT_EQ(tracer.untraced(x).to_vector<float>(), filled(4, 2.0f));
  EXPECT_EQ(method.stats().captures + function.stats().captures + injected.stats().captures +
                tracer.stats().captures,
            0u);
  (void)method(model, x, 5.0f);
  (void)function(x, device(), 3.0);
  (void)injected(device(), x);
  (void)tracer(x);
  EXPECT_EQ(method.stats().captures, 1u);
  EXPECT_EQ(function.stats().captures, 1u);
  EXPECT_EQ(injected.stats().captures, 1u);
  EXPECT_EQ(tracer.stats().captures, 1u);
  // The same per-call options type for all four.
  const CallOptions options{.queue = kDefaultQueue, .blocking = Blocking::yes};
  (void)method.call(options, model, x, 5.0f);
  (void)function.call(options, x, device(), 3.0);
  (void)injected.call(options, device(), x);
  (void)tracer.call(options, x);
  EXPECT_EQ(tracer.stats().replays, 1u);
  EXPECT_EQ(injected.stats().replays, 1u);
}

TEST_F(VocabularyTest, EveryWrapperExposesItsInputSlots) {
  auto function = traced_function(scale_by);
  Tensor x = full(4, 1.0);
  EXPECT_RETRACE_ERROR((void)function.inputs({}, x, device(), 2.0), failed_precondition,
                       "make a traced call first");
  (void)function(x, device(), 2.0);
  const auto& slots = function.inputs({}, x, device(), 2.0);
  const Tensor& slot = std::get<0>(slots);
  ops::fill(slot, 4.0);
  EXPECT_EQ(function(slot, device(), 2.0).to_vector<float>(), filled(4, 8.0f));
  EXPECT_EQ(function.stats().copies_skipped, 1u);  // the slot passed back: no copy

  auto injected = traced_function_injected(twice, {.auto_key = true});
  (void)injected(device(), full(8, 1.0));
  const Tensor& injected_slot = std::get<0>(injected.inputs({}, device(), full(8, 0.0)));
  EXPECT_EQ(injected_slot.shape(), (Shape{8}));
  EXPECT_RETRACE_ERROR((void)injected.inputs({}, device(), full(9, 0.0)), failed_precondition,
                       "no trace for these arguments");

  auto method = traced_method(&Model::step, [](Model& m) -> Device& { return *m.device; });
  Model model;
  model.device = &device();
  (void)method.call({.key = 7}, model, x, 1.0f);
  EXPECT_EQ(std::get<0>(method.inputs(model, 7)).shape(), (Shape{4}));
  EXPECT_EQ(std::get<0>(method.inputs({.key = 7}, model, x, 1.0f)).shape(), (Shape{4}));
}

TEST_F(VocabularyTest, TheReasonForTheLastCaptureIsQueryable) {
  auto injected = traced_function_injected(twice, {.auto_key = true, .name = "twice"});
  (void)injected(device(), full(4, 1.0));
  EXPECT_EQ(injected.last_capture_reason(), "first traced call");
  (void)injected(device(), full(6, 1.0));
  EXPECT_NE(injected.last_capture_reason().find("new input signature: input args[0] is [6]"),
            std::string::npos)
      << injected.last_capture_reason();
  (void)injected.call({.key = std::tuple{1, 2}}, device(), full(6, 1.0));
  EXPECT_EQ(injected.last_capture_reason(), "new trace key (1, 2)");
  auto tracer = make_tracer(twice, device());
  (void)tracer(full(4, 1.0));
  EXPECT_EQ(tracer.last_capture_reason(), "first traced call");
  tracer.release_trace();
  (void)tracer(full(4, 1.0));
  EXPECT_EQ(tracer.last_capture_reason(), "the previous trace was released");
}

TEST_F(VocabularyTest, ATracerHoldsOneTrace) {
  auto tracer = make_tracer(twice, device());
  EXPECT_RETRACE_ERROR((void)tracer.call({.key = "x"}, full(4, 1.0)), invalid_argument,
                       "a Tracer holds one trace, so a call takes no trace key (got \"x\")");
  EXPECT_RETRACE_ERROR((void)make_tracer(twice, device(), {.auto_key = true}), invalid_argument,
                       "a Tracer holds one");
}

TEST_F(VocabularyTest, TracersMoveWithTheirTracesAndOutputs) {
  std::vector<decltype(make_tracer(twice, device()))> tracers;
  for (int i = 0; i < 3; ++i) tracers.push_back(make_tracer(twice, device()));
  const Tensor& out0 = tracers[0](full(4, 1.0));
  const Tensor* address = &out0;
  for (int i = 0; i < 20; ++i) tracers.push_back(make_tracer(twice, device()));  // reallocates
  EXPECT_EQ(&tracers[0].outputs(), address);  // outputs live on the heap: still valid
  EXPECT_EQ(tracers[0](full(4, 3.0)).to_vector<float>(), filled(4, 6.0f));
  EXPECT_EQ(device().stats().live_traces, 1u);
  auto moved = std::move(tracers[0]);
  EXPECT_FALSE(tracers[0].trace_captured());
  EXPECT_TRUE(moved.trace_captured());
  EXPECT_EQ(moved(full(4, 5.0)).to_vector<float>(), filled(4, 10.0f));
  tracers.clear();  // the moved-from tracer releases nothing
  EXPECT_EQ(device().stats().live_traces, 1u);
  moved = make_tracer(twice, device());  // assigning releases the old trace
  EXPECT_EQ(device().stats().live_traces, 0u);
}

TEST_F(VocabularyTest, NonConstTensorParametersGetCopiesOfTheSlotHandles) {
  auto tracer = make_tracer(
      [](Tensor& x, Tensor& y) {
        x = ops::add(x, 1.0);  // rebinds the function's copy of the handle, never the slot
        return ops::add(x, y);
      },
      device());
  Tensor a = full(4, 1.0), b = full(4, 10.0);
  EXPECT_EQ(tracer(a, b).to_vector<float>(), filled(4, 12.0f));
  EXPECT_EQ(std::get<0>(tracer.inputs()).address(), a.address());
  EXPECT_EQ(tracer(full(4, 2.0), full(4, 20.0)).to_vector<float>(), filled(4, 23.0f));
  auto method_like = traced_function_injected([](Tensor& x) { return ops::mul(x, 2.0); });
  EXPECT_EQ(method_like(device(), full(4, 2.0)).to_vector<float>(), filled(4, 4.0f));
}

TEST_F(VocabularyTest, GenericLambdasAreTypedByTheirFirstCall) {
  auto tracer = make_tracer([](const auto& x, auto s) { return ops::mul(x, s); }, device());
  EXPECT_FALSE(tracer.trace_captured());
  EXPECT_EQ(tracer(full(4, 2.0), 3.0).to_vector<float>(), filled(4, 6.0f));
  EXPECT_EQ(tracer(full(4, 5.0), 3.0).to_vector<float>(), filled(4, 15.0f));
  EXPECT_EQ(tracer.stats().replays, 1u);
  EXPECT_TRUE(tracer.trace_captured());
  EXPECT_EQ(std::get<0>(tracer.tracer<Tensor, double>().inputs()).shape(), (Shape{4}));
  EXPECT_RETRACE_ERROR((void)tracer(full(4, 5.0), 3.0f), invalid_argument,
                       "other argument types than its first call");
  auto wrapped = traced_function_injected([](const Tensor& x) { return ops::neg(x); });
  EXPECT_EQ(wrapped(device(), full(2, 1.0)).to_vector<float>(), filled(2, -1.0f));
}

TEST_F(VocabularyTest, AStaleCopyOfAnOutputIsCaughtWhenRead) {
  auto tracer = make_tracer(twice, device());
  const Tensor& out = tracer(full(4, 1.0));
  Tensor copy = out;  // a copy of the handle, after the first run
  Tensor kept = out.clone();
  EXPECT_EQ(copy.to_vector<float>(), filled(4, 2.0f));  // still current
  (void)tracer(full(4, 5.0));                            // overwrites the output
  EXPECT_EQ(out.to_vector<float>(), filled(4, 10.0f));   // the tracer's own object follows
  EXPECT_EQ(kept.to_vector<float>(), filled(4, 2.0f));   // a clone is its own
  EXPECT_RETRACE_ERROR((void)copy.to_vector<float>(), failed_precondition,
                       "stale copy of a traced output: replay 2 of its trace overwrote the "
                       "output after this copy was taken (the copy holds replay 1)");
  EXPECT_RETRACE_ERROR((void)ops::add(copy, 1.0), failed_precondition, "clone() an output");
  EXPECT_RETRACE_ERROR((void)copy.clone(), failed_precondition, "stale copy");
  Tensor fresh = out;  // copied after the replay: current until the next one
  EXPECT_EQ(fresh.to_vector<float>(), filled(4, 10.0f));
  EXPECT_EQ(ops::reshape(out, {2, 2}).to_vector<float>(), filled(4, 10.0f));
  // Wrappers' outputs are tracers' outputs.
  auto injected = traced_function_injected(twice);
  Tensor early = injected(device(), full(4, 1.0));
  (void)injected(device(), full(4, 2.0));
  EXPECT_RETRACE_ERROR((void)early.to_host(), failed_precondition, "stale copy");
  // An output that is an input slot, or outside the trace's memory, is never stale.
  auto identity = make_tracer([](const Tensor& x) { return x; }, device(), {.prep_run = false});
  Tensor input = full(4, 1.0);
  const Tensor& same = identity(input);
  Tensor alias = same;
  (void)identity(full(4, 3.0));
  EXPECT_EQ(alias.to_vector<float>(), filled(4, 3.0f));
}

}  // namespace
}  // namespace retrace
