// Tracer: capture a function's device work once, replay it on every later call.
//
//   auto device = retrace::open_cpu_device();
//   auto step = retrace::make_tracer(
//       [](const Tensor& x, float scale) { return ops::mul(ops::add(x, 1.0), scale); }, *device);
//   const Tensor& y = step(x0, 0.5f);   // first call: captures the trace, runs it once
//   const Tensor& z = step(x1, 0.5f);   // later calls: x1 is copied into the captured input
//                                       // slot, then the trace is replayed
//   assert(&y == &z);                   // the same output object every time
//
// The contract (docs/contract.md has all of it):
//  - Inputs and outputs are trees (retrace/tree.hpp). Tensors may be host tensors (moved to the
//    device; single-device tracers only) or device tensors on one of the tracer's devices.
//  - First traced call: every leaf is checked; an optional prep run on clones of the inputs
//    lets lazily created state exist before capture; capture runs on every device; if the
//    function throws, the partial traces are released, the tracer stays un-captured and the
//    error propagates. The inputs become the tracer's input slots.
//  - Later traced calls: every leaf is checked against the captured structure (shapes, dtypes,
//    layouts, devices, container sizes, map keys, scalar and string values) before any is
//    copied, so a rejected call changes nothing. Then host tensors are written into their
//    slots, device tensors elsewhere are copied device-to-device, tensors already in their slot
//    cost nothing, and the trace runs on every device.
//  - THE OUTPUTS ARE THE SAME OBJECTS ON EVERY CALL: a replay overwrites what the previous call
//    returned. Copy (clone()) an output you need to keep across calls.
//  - Untraced calls run the function directly; they are an error once a trace is captured (and
//    after release_function()).
//
//  - A tensor passed for two inputs of the capturing call is copied into a slot of its own for
//    the second, so later calls can pass two different tensors there. Passing one input's slot
//    for another input (a swap) is safe too: it is copied aside before any slot changes.
//  - The ops of the traced function go to the call's queue (CallOptions::queue) by default,
//    in the prep run and in the capture; an op sent explicitly to another queue of a capturing
//    device is a capture violation.
//  - Once one of its devices is closed, every call (and inputs(), outputs()) is a
//    failed_precondition error naming that device.
//
// Thread safety: a Tracer is not safe to call from several threads at once.
#pragma once

#include "retrace/device.hpp"
#include "retrace/error.hpp"
#include "retrace/log.hpp"
#include "retrace/ops.hpp"
#include "retrace/tensor.hpp"
#include "retrace/trace_key.hpp"
#include "retrace/tree.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace retrace {

// Options of a Tracer and of the traced wrappers (retrace/traced_function.hpp): one type.
struct TraceOptions {
  bool prep_run = true;           // run the function once on the inputs before capturing
  bool clone_prep_inputs = true;  // ... on clones, so the real inputs stay untouched
  // Traced wrappers only (a Tracer holds one trace; setting these on one is an error):
  // key traces by the input signature (shapes, dtypes, layouts, devices, scalar values), so a
  // new shape captures a new trace instead of failing the shape check;
  bool auto_key = false;
  std::size_t max_traces = 0;       // bound on live traces (0: none), least recently used first
  std::size_t max_trace_bytes = 0;  // bound on their trace memory (0: none)
  std::string name = "traced function";  // used in log lines and error messages
};

// Options of one call, for a Tracer and for the traced wrappers: one type.
struct CallOptions {
  QueueId queue = kDefaultQueue;
  // Several devices: the replays start on all, then Blocking::yes waits for each one's queue.
  Blocking blocking = Blocking::yes;
  bool execute_on_capture = true;     // run the trace right after capturing it
  TraceKey key{};  // traced wrappers: which trace (a Tracer holds one: the default key only)
};

// What a Tracer or a traced wrapper did.
struct TraceStats {
  std::uint64_t captures = 0;
  std::uint64_t replays = 0;
  std::uint64_t evictions = 0;  // traces released by the bounds
  std::size_t live_traces = 0;
  std::size_t trace_bytes = 0;
  // Of the last traced call:
  std::size_t bytes_refreshed = 0;  // bytes copied into input slots
  std::size_t copies = 0;           // tensor leaves copied into their slots
  std::size_t copies_skipped = 0;   // tensor leaves already in their slots
};

enum class TracerState : std::uint8_t { idle, capturing, captured };

namespace detail {

// True on a thread while a Tracer's prep run executes there (random draws then leave their
// generator where it is, so the capture's own run draws what an eager call would).
[[nodiscard]] bool in_prep_run() noexcept;
class PrepRunScope {
 public:
  PrepRunScope() noexcept;
  ~PrepRunScope();
  PrepRunScope(const PrepRunScope&) = delete;
  PrepRunScope& operator=(const PrepRunScope&) = delete;

 private:
  bool previous_;
};

template <class T>
bool same_scalar(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a == b || (std::isnan(a) && std::isnan(b));
  } else {
    return a == b;
  }
}

class TracerCore;

// What a language's tracer does for the core during a traced call: walk its own trees (a typed
// C++ tree; Python objects). The core runs the steps of the contract in order
// (TracerCore::capture, TracerCore::replay) and asks for these; any may throw unless noted.
class TracedCall {
 public:
  // --- a capture ---
  // Checks every input leaf (tensors through TracerCore::check_capture_input) before anything
  // moves to a device.
  virtual void check_inputs() = 0;
  // Makes the input slots: each tensor leaf through TracerCore::place_capture_input.
  virtual void place_inputs(QueueId queue) = 0;
  // Runs the function on copies of the slots, with clones of their tensors when `clone`.
  virtual void prep_run(bool clone, QueueId queue) = 0;
  // Runs the function on the slots (the core is capturing) and holds its outputs.
  virtual void invoke() = 0;
  // Checks every output leaf (tensors through TracerCore::check_output).
  virtual void check_outputs() = 0;
  // Keeps the slots and the outputs as the tracer's own, in storage that does not move while
  // the trace lives, and lists their tensors in walk order.
  virtual void commit(std::vector<Tensor*>& slots, std::vector<Tensor*>& outputs) = 0;
  // --- a replay ---
  // Checks every incoming leaf against its slot (structure and values; tensors through
  // TracerCore::check_replay_input) before anything changes, and lists the incoming tensors in
  // the order of the slots' tensors (they stay valid until the call returns).
  virtual void match(std::vector<const Tensor*>& incoming) = 0;
  // --- both ---
  // Runs the traces: TracerCore::execute (Python lets go of the interpreter around it).
  virtual void execute(TracerCore& core, const CallOptions& options) = 0;
  // The first run after a capture failed: the tracer releases its trace (release_trace).
  virtual void release() noexcept = 0;

 protected:
  ~TracedCall() = default;
};

// Shared, non-template parts of the tracer: the one implementation of the contract's call
// sequences, used by the C++ Tracer and the Python one. Movable: a moved-from core is idle and
// owns no traces.
class TracerCore {
 public:
  TracerCore(std::vector<Device*> devices, TraceOptions options);
  TracerCore(TracerCore&& other) noexcept;
  TracerCore& operator=(TracerCore&& other) noexcept;
  TracerCore(const TracerCore&) = delete;
  TracerCore& operator=(const TracerCore&) = delete;
  ~TracerCore();

  [[nodiscard]] const std::vector<Device*>& devices() const noexcept { return devices_; }
  [[nodiscard]] const TraceOptions& options() const noexcept { return options_; }
  [[nodiscard]] TracerState state() const noexcept { return state_; }
  [[nodiscard]] TraceStats stats() const;
  [[nodiscard]] const std::vector<TraceId>& trace_ids() const noexcept { return traces_; }
  [[nodiscard]] const std::string& last_capture_reason() const noexcept { return reason_; }
  // Trace memory of the captured traces, summed over devices.
  [[nodiscard]] std::size_t trace_bytes() const;
  // Where a wrapper's tree arguments sit in its caller's parameter list ("args[2]").
  void set_argument_positions(std::vector<std::size_t> positions) {
    positions_ = std::move(positions);
  }
  [[nodiscard]] std::size_t position(std::size_t i) const noexcept {
    return i < positions_.size() ? positions_[i] : i;
  }

  // Throws failed_precondition naming the first of the tracer's devices that was closed.
  void require_devices_open(std::string_view what) const;
  [[nodiscard]] bool devices_open() const noexcept;
  // A Tracer holds one trace: only the default key.
  void check_call(const CallOptions& options) const;

  // Capture-time checks and moves of one tensor leaf. A tensor passed for two inputs gets a
  // slot of its own for the second (a copy), so later calls may pass two different tensors.
  void check_capture_input(const TreePath& path, const Tensor& tensor) const;
  [[nodiscard]] Tensor place_capture_input(const Tensor& tensor, QueueId queue);
  void check_output(const TreePath& path, const Tensor& tensor) const;
  // Replay-time check of one tensor leaf.
  void check_replay_input(const TreePath& path, const Tensor& slot, const Tensor& incoming) const;
  template <class T>
  void check_replay_scalar(const TreePath& path, const T& slot, const T& incoming) const {
    if (same_scalar(slot, incoming)) return;
    throw_tree_error(path, fmt::format("value {} does not match the captured value {} (the "
                                       "input does not match the initial value: values are baked "
                                       "into the trace; pass a tensor, or use a trace key for "
                                       "values that change)",
                                       incoming, slot));
  }

  // A traced call: checks the devices and the call, then captures (the first traced call, or
  // the first after release) or replays.
  void call(const CallOptions& options, TracedCall& call, bool has_function);
  // The first traced call: every input leaf checked before anything moves; the inputs placed
  // (host tensors to the device, a tensor passed twice given a second slot); the prep run; the
  // capture on every device (released again if the function or the output check throws); the
  // slots and outputs committed; the first run (unless execute_on_capture is off).
  void capture(const CallOptions& options, TracedCall& call, bool has_function);
  // A later traced call: every incoming leaf checked before any slot changes; an incoming
  // tensor that is another input's slot copied aside first; the slots refreshed; the replay;
  // the outputs in the trace's memory stamped with its version.
  void replay(const CallOptions& options, TracedCall& call);
  // Runs the captured traces on every device (see CallOptions::blocking).
  void execute(const CallOptions& options);
  void require_function(bool has_function, std::string_view what) const;
  void require_untraced_allowed(bool has_function) const;
  void require_captured(std::string_view what) const;
  // Releases the device traces and forgets the slots and outputs; false if none was captured.
  bool release() noexcept;

 private:
  void start_call() noexcept;
  void begin_capture(QueueId queue);
  void end_capture(QueueId queue);
  void abort_capture(QueueId queue) noexcept;
  void mark_captured() noexcept;
  // Remembers the input slots' buffers, for the refresh hazard check (needs_snapshot).
  void set_slots(std::vector<const Buffer*> buffers);
  // After a run: every output in the trace's memory gets this run's version, so a copy of an
  // output taken before is found stale when it is read (see Tensor::replay_version()).
  [[nodiscard]] bool stamps_output(const Tensor& output) const noexcept;
  void stamp_outputs() noexcept;

  std::vector<Device*> devices_;
  std::vector<std::shared_ptr<detail::DeviceLink>> links_;
  TraceOptions options_;
  std::vector<std::size_t> positions_;
  TracerState state_ = TracerState::idle;
  std::vector<TraceId> traces_;
  std::vector<const Buffer*> placed_;        // buffers of the inputs placed for this capture
  std::vector<const Buffer*> slot_buffers_;  // sorted
  std::size_t begun_ = 0;
  TraceStats stats_;
  std::string reason_;
  std::uint64_t version_ = 0;  // replays run so far (captures included), for output versions
  // The committed slots' and stamped outputs' tensors (in the tracer's own storage), and the
  // scratch of a replay.
  std::vector<Tensor*> slots_;
  std::vector<Tensor*> stamped_;
  std::vector<const Tensor*> incoming_;
  std::vector<Tensor> snapshots_;

  // True when `incoming` is another leaf's slot: refreshing in order could overwrite it before
  // it is read (two inputs swapped), so it is copied aside first.
  [[nodiscard]] bool needs_snapshot(const Tensor& slot, const Tensor& incoming) const;
  // True when refreshing the slot from `incoming` copies nothing: it is the slot (passed back
  // from inputs()) or keep_slot().
  [[nodiscard]] static bool in_place(const Tensor& slot, const Tensor& incoming) noexcept;
  void refresh(Tensor& slot, const Tensor& incoming, QueueId queue);
};

}  // namespace detail

// Tracer<Fn, Args...>: Args are the function's parameter types without const and references;
// a parameter may be a non-const reference (Tensor&): the function then gets a copy of the
// handle, so rebinding it inside the function never changes the tracer's input slots.
template <class Fn, class... Args>
class Tracer {
 public:
  using Inputs = std::tuple<Args...>;
  using Result = std::invoke_result_t<Fn&, Args&...>;
  using Outputs = std::conditional_t<std::is_void_v<Result>, None, Result>;

  Tracer(Fn function, Device& device, TraceOptions options = {})
      : Tracer(std::move(function), std::vector<Device*>{&device}, std::move(options)) {}
  Tracer(Fn function, std::vector<Device*> devices, TraceOptions options = {})
      : core_(std::move(devices), std::move(options)),
        function_(std::make_unique<Fn>(std::move(function))) {}

  // Movable (a std::vector of tracers is fine); references to inputs() and outputs() stay
  // valid across a move. A moved-from tracer is idle, without a function.
  Tracer(Tracer&&) noexcept = default;
  Tracer& operator=(Tracer&& other) noexcept {
    if (this != &other) {
      release_trace();
      core_ = std::move(other.core_);
      function_ = std::move(other.function_);
      slots_ = std::move(other.slots_);
      outputs_ = std::move(other.outputs_);
    }
    return *this;
  }
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  ~Tracer() { release_trace(); }

  // A traced call with default options: captures on the first call, replays afterwards.
  const Outputs& operator()(const Args&... args) { return call(CallOptions{}, args...); }

  const Outputs& call(const CallOptions& options, const Args&... args) {
    Call steps(*this, std::forward_as_tuple(args...));
    core_.call(options, steps, function_ != nullptr);
    return *outputs_;
  }

  // Runs the function directly (no trace). Only before a capture.
  Result untraced(const Args&... args) {
    core_.require_devices_open("untraced");
    core_.require_untraced_allowed(function_ != nullptr);
    Inputs copies(args...);
    return std::apply(*function_, copies);
  }

  // The input slots: the tensors the trace reads. Passing them back costs no copy.
  [[nodiscard]] const Inputs& inputs() const {
    core_.require_devices_open("inputs()");
    core_.require_captured("inputs()");
    return *slots_;
  }
  // The outputs: the same objects after every call, overwritten by each replay.
  [[nodiscard]] const Outputs& outputs() const {
    core_.require_devices_open("outputs()");
    core_.require_captured("outputs()");
    return *outputs_;
  }

  [[nodiscard]] bool trace_captured() const noexcept {
    return core_.state() == TracerState::captured;
  }
  [[nodiscard]] TracerState state() const noexcept { return core_.state(); }
  [[nodiscard]] bool has_function() const noexcept { return function_ != nullptr; }
  [[nodiscard]] TraceStats stats() const { return core_.stats(); }
  // Why the last capture happened ("first traced call", "the previous trace was released").
  [[nodiscard]] const std::string& last_capture_reason() const noexcept {
    return core_.last_capture_reason();
  }
  [[nodiscard]] const std::vector<TraceId>& trace_ids() const noexcept { return core_.trace_ids(); }
  // The devices (dangling once a device is destroyed: check devices_open() first).
  [[nodiscard]] const std::vector<Device*>& devices() const noexcept { return core_.devices(); }
  // False once one of the devices was closed (every call then throws).
  [[nodiscard]] bool devices_open() const noexcept { return core_.devices_open(); }
  [[nodiscard]] std::size_t trace_bytes() const { return core_.trace_bytes(); }
  [[nodiscard]] const TraceOptions& options() const noexcept { return core_.options(); }
  // For traced wrappers: where the tree arguments sit in their own parameter list.
  void set_argument_positions(std::vector<std::size_t> positions) {
    core_.set_argument_positions(std::move(positions));
  }

  // Frees the traces (idempotent); the next traced call captures again.
  void release_trace() noexcept {
    if (!core_.release()) return;
    slots_.reset();
    outputs_.reset();
  }
  // Drops the function and what it holds; only replays remain possible.
  void release_function() noexcept { function_.reset(); }

 private:
  // The tree walks of one traced call, for the core (detail::TracedCall).
  class Call final : public detail::TracedCall {
   public:
    Call(Tracer& tracer, std::tuple<const Args&...> args) : t_(tracer), args_(args) {}

    void check_inputs() override {
      inputs_ = std::make_unique<Inputs>(std::make_from_tuple<Inputs>(args_));
      t_.for_each_tensor(*inputs_, [&](const TreePath& path, Tensor& leaf) {
        t_.core_.check_capture_input(path, leaf);
      });
    }
    void place_inputs(QueueId queue) override {
      t_.for_each_tensor(*inputs_, [&](const TreePath&, Tensor& leaf) {
        leaf = t_.core_.place_capture_input(leaf, queue);
      });
    }
    void prep_run(bool clone, QueueId queue) override {
      Inputs copies = *inputs_;
      if (clone) {
        t_.for_each_tensor(copies, [&](const TreePath&, Tensor& leaf) { leaf = leaf.clone(queue); });
      }
      (void)t_.invoke_on(copies);
    }
    void invoke() override { outputs_ = std::make_unique<Outputs>(t_.invoke_on(*inputs_)); }
    void check_outputs() override {
      visit_leaves(
          [&](const TreePath& path, auto& leaf) {
            if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
              t_.core_.check_output(path, leaf);
            }
          },
          TreePath::root("outputs", "output"), *outputs_);
    }
    void commit(std::vector<Tensor*>& slots, std::vector<Tensor*>& outputs) override {
      t_.slots_ = std::move(inputs_);
      t_.outputs_ = std::move(outputs_);
      t_.for_each_tensor(*t_.slots_, [&](const TreePath&, Tensor& leaf) { slots.push_back(&leaf); });
      visit_leaves(
          [&](const TreePath&, auto& leaf) {
            if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
              outputs.push_back(&leaf);
            }
          },
          TreePath::root("outputs", "output"), *t_.outputs_);
    }
    void match(std::vector<const Tensor*>& incoming) override {
      const TreePath root = TreePath::root("args", "input");
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (visit_leaves(
             [&](const TreePath& path, auto& slot, const auto& in) {
               using Leaf = std::remove_cvref_t<decltype(slot)>;
               if constexpr (std::is_same_v<Leaf, Tensor>) {
                 t_.core_.check_replay_input(path, slot, in);
                 incoming.push_back(&in);
               } else if constexpr (!std::is_same_v<Leaf, None>) {
                 t_.core_.check_replay_scalar(path, slot, in);
               }
             },
             root.at(t_.core_.position(I)), std::get<I>(*t_.slots_), std::get<I>(args_)),
         ...);
      }(std::index_sequence_for<Args...>{});
    }
    void execute(detail::TracerCore& core, const CallOptions& options) override {
      core.execute(options);
    }
    void release() noexcept override { t_.release_trace(); }

   private:
    Tracer& t_;
    std::tuple<const Args&...> args_;
    std::unique_ptr<Inputs> inputs_;    // the slots being made
    std::unique_ptr<Outputs> outputs_;  // the outputs of the capture
  };

  // f(path, tensor) for every tensor leaf of an input tree.
  template <class F>
  void for_each_tensor(Inputs& inputs, F&& f) {
    const TreePath root = TreePath::root("args", "input");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (visit_leaves(
           [&](const TreePath& path, auto& leaf) {
             if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
               f(path, leaf);
             }
           },
           root.at(core_.position(I)), std::get<I>(inputs)),
       ...);
    }(std::index_sequence_for<Args...>{});
  }

  // The function gets copies of the input handles (a Tensor& parameter rebinding its tensor
  // changes the copy, never a slot).
  Outputs invoke_on(const Inputs& inputs) {
    Inputs copies = inputs;
    if constexpr (std::is_void_v<Result>) {
      std::apply(*function_, copies);
      return None{};
    } else {
      return std::apply(*function_, copies);
    }
  }

  detail::TracerCore core_;
  std::unique_ptr<Fn> function_;
  // Heap-held, so references handed out stay valid when the tracer moves.
  std::unique_ptr<Inputs> slots_;
  std::unique_ptr<Outputs> outputs_;
};

namespace detail {
template <class T>
struct CallSignature : CallSignature<decltype(&T::operator())> {};
template <class R, class... A>
struct CallSignature<R (*)(A...)> {
  using Inputs = std::tuple<std::remove_cvref_t<A>...>;
};
template <class R, class C, class... A>
struct CallSignature<R (C::*)(A...) const> {
  using Inputs = std::tuple<std::remove_cvref_t<A>...>;
};
template <class R, class C, class... A>
struct CallSignature<R (C::*)(A...)> {
  using Inputs = std::tuple<std::remove_cvref_t<A>...>;
};
template <class Fn, class Tuple>
struct TracerFor;
template <class Fn, class... A>
struct TracerFor<Fn, std::tuple<A...>> {
  using type = Tracer<Fn, A...>;
};
}  // namespace detail

template <class R, class... A>
Tracer(R (*)(A...), Device&, TraceOptions = {}) -> Tracer<R (*)(A...), std::remove_cvref_t<A>...>;

// A Tracer over a generic lambda (or any callable with several call signatures): its input
// types are those of its first call, traced or untraced; a later call with other argument
// types is an invalid_argument error. The typed Tracer behind it is tracer<Args...>().
template <class Fn>
class GenericTracer {
 public:
  GenericTracer(Fn function, std::vector<Device*> devices, TraceOptions options)
      : function_(std::move(function)), devices_(std::move(devices)), options_(std::move(options)) {}

  template <class... A>
  const auto& operator()(const A&... args) {
    return call(CallOptions{}, args...);
  }
  template <class... A>
  const auto& call(const CallOptions& options, const A&... args) {
    return typed<std::remove_cvref_t<A>...>().call(options, args...);
  }
  template <class... A>
  decltype(auto) untraced(const A&... args) {
    return typed<std::remove_cvref_t<A>...>().untraced(args...);
  }
  // The typed Tracer (made by the first call; throws if that call had other argument types).
  template <class... A>
  [[nodiscard]] Tracer<Fn, A...>& tracer() {
    return typed<A...>();
  }

  [[nodiscard]] bool trace_captured() const noexcept {
    return holder_ != nullptr && holder_->trace_captured();
  }
  [[nodiscard]] TraceStats stats() const { return holder_ ? holder_->stats() : TraceStats{}; }
  void release_trace() noexcept {
    if (holder_) holder_->release_trace();
  }

 private:
  struct Base {
    virtual ~Base() = default;
    [[nodiscard]] virtual bool trace_captured() const noexcept = 0;
    [[nodiscard]] virtual TraceStats stats() const = 0;
    virtual void release_trace() noexcept = 0;
  };
  template <class... A>
  struct Holder final : Base {
    explicit Holder(Tracer<Fn, A...> t) : tracer(std::move(t)) {}
    bool trace_captured() const noexcept override { return tracer.trace_captured(); }
    TraceStats stats() const override { return tracer.stats(); }
    void release_trace() noexcept override { tracer.release_trace(); }
    Tracer<Fn, A...> tracer;
  };

  template <class... A>
  Tracer<Fn, A...>& typed() {
    if (holder_ == nullptr) {
      RETRACE_CHECK(function_.has_value(), failed_precondition, "tracer '{}' has no function",
                    options_.name);
      holder_ = std::make_unique<Holder<A...>>(
          Tracer<Fn, A...>(std::move(*function_), devices_, options_));
      function_.reset();
    }
    auto* holder = dynamic_cast<Holder<A...>*>(holder_.get());
    RETRACE_CHECK(holder != nullptr, invalid_argument,
                  "tracer '{}' was called with other argument types than its first call; a "
                  "tracer of a generic function has the input types of its first call (make "
                  "another tracer for other types)",
                  options_.name);
    return holder->tracer;
  }

  std::optional<Fn> function_;
  std::vector<Device*> devices_;
  TraceOptions options_;
  std::unique_ptr<Base> holder_;
};

namespace detail {
template <class Fn>
concept HasOneCallSignature =
    requires { &Fn::operator(); } || std::is_pointer_v<Fn> || std::is_function_v<Fn>;
}  // namespace detail

// Makes a tracer, deducing the input types from a callable with one call signature (a lambda, a
// function pointer, a functor). A generic lambda gets a GenericTracer, typed by its first call;
// or name the types: make_tracer<Tensor, float>(...).
template <class... Args, class Fn>
[[nodiscard]] auto make_tracer(Fn function, std::vector<Device*> devices,
                               TraceOptions options = {}) {
  if constexpr (sizeof...(Args) > 0) {
    return Tracer<Fn, Args...>(std::move(function), std::move(devices), std::move(options));
  } else if constexpr (detail::HasOneCallSignature<Fn>) {
    using T = typename detail::TracerFor<Fn, typename detail::CallSignature<Fn>::Inputs>::type;
    return T(std::move(function), std::move(devices), std::move(options));
  } else {
    return GenericTracer<Fn>(std::move(function), std::move(devices), std::move(options));
  }
}

template <class... Args, class Fn>
[[nodiscard]] auto make_tracer(Fn function, Device& device, TraceOptions options = {}) {
  return make_tracer<Args...>(std::move(function), std::vector<Device*>{&device},
                              std::move(options));
}

}  // namespace retrace
