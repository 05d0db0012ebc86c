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
// The contract (DESIGN.md §3):
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

struct TracerOptions {
  bool prep_run = true;           // run the function once on the inputs before capturing
  bool clone_prep_inputs = true;  // ... on clones, so the real inputs stay untouched
  std::string name = "tracer";    // used in log lines and error messages
  // Position of each argument in the caller's parameter list, for error paths ("args[2]") when
  // a wrapper passes only some of its parameters to the tracer. Empty: 0, 1, 2, ...
  std::vector<std::size_t> argument_positions{};
};

struct CallOptions {
  QueueId queue = kDefaultQueue;
  Blocking blocking = Blocking::yes;  // several devices: always non-blocking (with a warning)
  bool execute_on_capture = true;     // run the trace right after capturing it
};

struct TracerCounters {
  std::uint64_t captures = 0;
  std::uint64_t replays = 0;
  // Of the last traced call:
  std::size_t bytes_refreshed = 0;  // bytes copied into input slots
  std::size_t copies = 0;           // tensor leaves copied into their slots
  std::size_t copies_skipped = 0;   // tensor leaves already in their slots
};

enum class TracerState : std::uint8_t { idle, capturing, captured };

namespace detail {

template <class T>
bool same_scalar(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a == b || (std::isnan(a) && std::isnan(b));
  } else {
    return a == b;
  }
}

// Shared, non-template parts of the tracer.
class TracerCore {
 public:
  TracerCore(std::vector<Device*> devices, TracerOptions options);
  TracerCore(const TracerCore&) = delete;
  TracerCore& operator=(const TracerCore&) = delete;
  ~TracerCore();

  [[nodiscard]] const std::vector<Device*>& devices() const noexcept { return devices_; }
  [[nodiscard]] const TracerOptions& options() const noexcept { return options_; }
  [[nodiscard]] TracerState state() const noexcept { return state_; }
  [[nodiscard]] const TracerCounters& counters() const noexcept { return counters_; }
  [[nodiscard]] const std::vector<TraceId>& trace_ids() const noexcept { return traces_; }
  // Trace memory and commands of the captured traces, summed over devices.
  [[nodiscard]] std::size_t trace_bytes() const;

  // Throws failed_precondition naming the first of the tracer's devices that was closed.
  void require_devices_open(std::string_view what) const;
  [[nodiscard]] bool devices_open() const noexcept;

  // Capture-time checks and moves of one tensor leaf. A tensor passed for two inputs gets a
  // slot of its own for the second (a copy), so later calls may pass two different tensors.
  void check_capture_input(const TreePath& path, const Tensor& tensor) const;
  [[nodiscard]] Tensor place_capture_input(const Tensor& tensor, QueueId queue);
  void start_placing() noexcept { placed_.clear(); }
  // Remembers the input slots' buffers, for the refresh hazard check below.
  void set_slots(std::vector<const Buffer*> buffers);
  // True when `incoming` is another leaf's slot: refreshing in order could overwrite it before
  // it is read (two inputs swapped), so it is copied aside first.
  [[nodiscard]] bool needs_snapshot(const Tensor& slot, const Tensor& incoming) const;
  void check_output(const TreePath& path, const Tensor& tensor) const;
  // Replay-time check and refresh of one tensor leaf.
  void check_replay_input(const TreePath& path, const Tensor& slot, const Tensor& incoming) const;
  void refresh(Tensor& slot, const Tensor& incoming, QueueId queue);
  template <class T>
  void check_replay_scalar(const TreePath& path, const T& slot, const T& incoming) const {
    if (same_scalar(slot, incoming)) return;
    throw_tree_error(path, fmt::format("value {} does not match the captured value {} (values are "
                                       "baked into the trace; pass a tensor, or use a trace key "
                                       "for values that change)",
                                       incoming, slot));
  }

  void begin_capture(QueueId queue);
  void end_capture(QueueId queue);
  void abort_capture(QueueId queue) noexcept;
  void execute(const CallOptions& options);
  void start_call() noexcept;
  void note_replay() noexcept { ++counters_.replays; }
  void require_function(bool has_function, std::string_view what) const;
  void require_untraced_allowed(bool has_function) const;
  void require_captured(std::string_view what) const;
  void mark_captured() noexcept;
  // Releases the device traces; returns false if none was captured.
  bool release() noexcept;

 private:
  std::vector<Device*> devices_;
  std::vector<std::shared_ptr<detail::DeviceLink>> links_;
  TracerOptions options_;
  TracerState state_ = TracerState::idle;
  std::vector<TraceId> traces_;
  std::vector<const Buffer*> placed_;      // buffers of the inputs placed for this capture
  std::vector<const Buffer*> slot_buffers_;  // sorted
  std::size_t begun_ = 0;
  TracerCounters counters_;
  bool warned_blocking_ = false;
};

}  // namespace detail

template <class Fn, class... Args>
class Tracer {
 public:
  using Inputs = std::tuple<Args...>;
  using Result = std::invoke_result_t<Fn&, const Args&...>;
  using Outputs = std::conditional_t<std::is_void_v<Result>, None, Result>;

  Tracer(Fn function, Device& device, TracerOptions options = {})
      : Tracer(std::move(function), std::vector<Device*>{&device}, std::move(options)) {}
  Tracer(Fn function, std::vector<Device*> devices, TracerOptions options = {})
      : core_(std::move(devices), std::move(options)), function_(std::move(function)) {}

  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  ~Tracer() { release_trace(); }

  // A traced call with default options: captures on the first call, replays afterwards.
  const Outputs& operator()(const Args&... args) { return call(CallOptions{}, args...); }

  const Outputs& call(const CallOptions& options, const Args&... args) {
    core_.require_devices_open("call");
    core_.start_call();
    if (core_.state() == TracerState::captured) return replay(options, args...);
    return capture(options, args...);
  }

  // Runs the function directly (no trace). Only before a capture.
  Result untraced(const Args&... args) {
    core_.require_devices_open("untraced");
    core_.require_untraced_allowed(function_.has_value());
    return std::invoke(*function_, args...);
  }

  // The input slots: the tensors the trace reads. Passing them back costs no copy.
  [[nodiscard]] const Inputs& inputs() const {
    core_.require_devices_open("inputs()");
    core_.require_captured("inputs()");
    return *slots_;
  }
  [[nodiscard]] const Outputs& outputs() const {
    core_.require_devices_open("outputs()");
    core_.require_captured("outputs()");
    return *outputs_;
  }

  [[nodiscard]] bool trace_captured() const noexcept {
    return core_.state() == TracerState::captured;
  }
  [[nodiscard]] TracerState state() const noexcept { return core_.state(); }
  [[nodiscard]] bool has_function() const noexcept { return function_.has_value(); }
  [[nodiscard]] const TracerCounters& counters() const noexcept { return core_.counters(); }
  [[nodiscard]] const std::vector<TraceId>& trace_ids() const noexcept { return core_.trace_ids(); }
  // The devices (dangling once a device is destroyed: check devices_open() first).
  [[nodiscard]] const std::vector<Device*>& devices() const noexcept { return core_.devices(); }
  // False once one of the devices was closed (every call then throws).
  [[nodiscard]] bool devices_open() const noexcept { return core_.devices_open(); }
  [[nodiscard]] std::size_t trace_bytes() const { return core_.trace_bytes(); }

  // Frees the traces (idempotent); the next traced call captures again.
  void release_trace() noexcept {
    if (!core_.release()) return;
    slots_.reset();
    outputs_.reset();
  }
  // Drops the function and what it holds; only replays remain possible.
  void release_function() noexcept { function_.reset(); }

 private:
  [[nodiscard]] std::size_t position(std::size_t i) const noexcept {
    const auto& positions = core_.options().argument_positions;
    return i < positions.size() ? positions[i] : i;
  }

  template <class F>
  void for_each_input(F&& f, Inputs& slots, const Args&... incoming) {
    const TreePath root = TreePath::root("args", "input");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (visit_leaves(f, root.at(position(I)), std::get<I>(slots), incoming), ...);
    }(std::index_sequence_for<Args...>{});
  }

  template <class F>
  void for_each_argument(F&& f, Inputs& inputs) {
    const TreePath root = TreePath::root("args", "input");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (visit_leaves(f, root.at(position(I)), std::get<I>(inputs)), ...);
    }(std::index_sequence_for<Args...>{});
  }

  template <class F, class Tree>
  void for_each_leaf(F&& f, Tree& tree, std::string_view label, std::string_view role) {
    const TreePath root = TreePath::root(label, role);
    visit_leaves(f, root, tree);
  }

  const Outputs& capture(const CallOptions& options, const Args&... args) {
    core_.require_function(function_.has_value(), "capture a trace");
    // The ops of the prep run and of the capture go to the call's queue by default.
    DefaultQueueScope queue_scope(options.queue);
    Inputs inputs(args...);
    // Check every leaf before anything moves to a device.
    for_each_argument(
        [&](const TreePath& path, auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
            core_.check_capture_input(path, leaf);
          }
        },
        inputs);
    core_.start_placing();
    for_each_argument(
        [&](const TreePath&, auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
            leaf = core_.place_capture_input(leaf, options.queue);
          }
        },
        inputs);
    if (core_.options().prep_run) prep_run(inputs, options.queue);

    core_.begin_capture(options.queue);
    std::optional<Outputs> outputs;
    try {
      outputs.emplace(invoke_on(inputs));
      core_.end_capture(options.queue);
    } catch (...) {
      core_.abort_capture(options.queue);
      throw;
    }
    try {
      for_each_leaf(
          [&](const TreePath& path, auto& leaf) {
            if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
              core_.check_output(path, leaf);
            }
          },
          *outputs, "outputs", "output");
    } catch (...) {
      core_.abort_capture(options.queue);
      throw;
    }
    slots_.emplace(std::move(inputs));
    outputs_ = std::move(outputs);
    std::vector<const Buffer*> slot_buffers;
    for_each_argument(
        [&](const TreePath&, auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
            slot_buffers.push_back(leaf.buffer().get());
          }
        },
        *slots_);
    core_.set_slots(std::move(slot_buffers));
    core_.mark_captured();
    if (options.execute_on_capture) {
      try {
        core_.execute(options);
      } catch (...) {
        release_trace();  // the trace never ran: do not leak it
        throw;
      }
    }
    return *outputs_;
  }

  const Outputs& replay(const CallOptions& options, const Args&... args) {
    // Every leaf is checked before any slot changes.
    for_each_input(
        [&](const TreePath& path, auto& slot, const auto& incoming) {
          using Leaf = std::remove_cvref_t<decltype(slot)>;
          if constexpr (std::is_same_v<Leaf, Tensor>) {
            core_.check_replay_input(path, slot, incoming);
          } else if constexpr (std::is_same_v<Leaf, None>) {
          } else {
            core_.check_replay_scalar(path, slot, incoming);
          }
        },
        *slots_, args...);
    // An incoming tensor that is another input's slot is copied aside before any slot changes.
    std::vector<std::pair<std::size_t, Tensor>> snapshots;
    std::size_t leaf = 0;
    for_each_input(
        [&](const TreePath&, auto& slot, const auto& incoming) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(slot)>, Tensor>) {
            if (core_.needs_snapshot(slot, incoming)) {
              snapshots.emplace_back(leaf, incoming.clone(options.queue));
            }
            ++leaf;
          }
        },
        *slots_, args...);
    leaf = 0;
    std::size_t next_snapshot = 0;
    for_each_input(
        [&](const TreePath&, auto& slot, const auto& incoming) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(slot)>, Tensor>) {
            const bool saved = next_snapshot < snapshots.size() &&
                               snapshots[next_snapshot].first == leaf;
            core_.refresh(slot, saved ? snapshots[next_snapshot++].second : incoming,
                          options.queue);
            ++leaf;
          }
        },
        *slots_, args...);
    core_.execute(options);
    core_.note_replay();
    return *outputs_;
  }

  void prep_run(const Inputs& inputs, QueueId queue) {
    if (!core_.options().clone_prep_inputs) {
      (void)invoke_on(inputs);
      return;
    }
    Inputs clones = inputs;
    for_each_argument(
        [&](const TreePath&, auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
            leaf = leaf.clone(queue);
          }
        },
        clones);
    (void)invoke_on(clones);
  }

  Outputs invoke_on(const Inputs& inputs) {
    if constexpr (std::is_void_v<Result>) {
      std::apply(*function_, inputs);
      return None{};
    } else {
      return std::apply(*function_, inputs);
    }
  }

  detail::TracerCore core_;
  std::optional<Fn> function_;
  std::optional<Inputs> slots_;
  std::optional<Outputs> outputs_;
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
Tracer(R (*)(A...), Device&, TracerOptions = {}) -> Tracer<R (*)(A...), std::remove_cvref_t<A>...>;

// Makes a tracer, deducing the input types from a callable with one call signature (a lambda, a
// function pointer, a functor). Name them for generic lambdas: make_tracer<Tensor, float>(...).
template <class... Args, class Fn>
[[nodiscard]] auto make_tracer(Fn function, Device& device, TracerOptions options = {}) {
  if constexpr (sizeof...(Args) == 0) {
    using T = typename detail::TracerFor<Fn, typename detail::CallSignature<Fn>::Inputs>::type;
    return T(std::move(function), device, std::move(options));
  } else {
    return Tracer<Fn, Args...>(std::move(function), device, std::move(options));
  }
}

template <class... Args, class Fn>
[[nodiscard]] auto make_tracer(Fn function, std::vector<Device*> devices,
                               TracerOptions options = {}) {
  if constexpr (sizeof...(Args) == 0) {
    using T = typename detail::TracerFor<Fn, typename detail::CallSignature<Fn>::Inputs>::type;
    return T(std::move(function), std::move(devices), std::move(options));
  } else {
    return Tracer<Fn, Args...>(std::move(function), std::move(devices), std::move(options));
  }
}

}  // namespace retrace
