#include "retrace/tracer.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

namespace retrace::detail {

namespace {
thread_local bool t_prep_run = false;
}  // namespace

bool in_prep_run() noexcept { return t_prep_run; }
PrepRunScope::PrepRunScope() noexcept : previous_(t_prep_run) { t_prep_run = true; }
PrepRunScope::~PrepRunScope() { t_prep_run = previous_; }

namespace {
std::string device_names(const std::vector<Device*>& devices) {
  std::vector<std::string> names;
  for (const Device* d : devices) names.push_back(d->name());
  return fmt::format("{}", fmt::join(names, ", "));
}
}  // namespace

TracerCore::TracerCore(std::vector<Device*> devices, TraceOptions options)
    : devices_(std::move(devices)), options_(std::move(options)) {
  RETRACE_CHECK(!devices_.empty(), invalid_argument, "tracer '{}' needs at least one device",
                options_.name);
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    RETRACE_CHECK(devices_[i] != nullptr, invalid_argument, "tracer '{}': device {} is null",
                  options_.name, i);
    RETRACE_CHECK(std::count(devices_.begin(), devices_.end(), devices_[i]) == 1,
                  invalid_argument, "tracer '{}': device {} is listed twice", options_.name,
                  devices_[i]->name());
    links_.push_back(devices_[i]->link());
  }
  require_devices_open("making a tracer");
  RETRACE_CHECK(!options_.auto_key && options_.max_traces == 0 && options_.max_trace_bytes == 0,
                invalid_argument,
                "tracer '{}': auto_key, max_traces and max_trace_bytes choose among several "
                "traces; a Tracer holds one (use traced_function or traced_method)",
                options_.name);
}

TracerCore::~TracerCore() = default;

TracerCore::TracerCore(TracerCore&& other) noexcept
    : devices_(std::move(other.devices_)),
      links_(std::move(other.links_)),
      options_(std::move(other.options_)),
      positions_(std::move(other.positions_)),
      state_(std::exchange(other.state_, TracerState::idle)),
      traces_(std::move(other.traces_)),
      placed_(std::move(other.placed_)),
      slot_buffers_(std::move(other.slot_buffers_)),
      begun_(std::exchange(other.begun_, 0)),
      stats_(other.stats_),
      reason_(std::move(other.reason_)),
      version_(other.version_),
      slots_(std::move(other.slots_)),
      stamped_(std::move(other.stamped_)) {
  other.traces_.clear();
  other.slots_.clear();
  other.stamped_.clear();
}

TracerCore& TracerCore::operator=(TracerCore&& other) noexcept {
  if (this == &other) return *this;
  release();
  devices_ = std::move(other.devices_);
  links_ = std::move(other.links_);
  options_ = std::move(other.options_);
  positions_ = std::move(other.positions_);
  state_ = std::exchange(other.state_, TracerState::idle);
  traces_ = std::move(other.traces_);
  other.traces_.clear();
  placed_ = std::move(other.placed_);
  slot_buffers_ = std::move(other.slot_buffers_);
  begun_ = std::exchange(other.begun_, 0);
  stats_ = other.stats_;
  reason_ = std::move(other.reason_);
  version_ = other.version_;
  slots_ = std::move(other.slots_);
  stamped_ = std::move(other.stamped_);
  other.slots_.clear();
  other.stamped_.clear();
  return *this;
}

// --- the call sequences -------------------------------------------------------------------------

void TracerCore::call(const CallOptions& options, TracedCall& call, bool has_function) {
  require_devices_open("call");
  check_call(options);
  start_call();
  if (state_ == TracerState::captured) {
    replay(options, call);
  } else {
    capture(options, call, has_function);
  }
}

void TracerCore::capture(const CallOptions& options, TracedCall& call, bool has_function) {
  require_function(has_function, "capture a trace");
  // The ops of the prep run and of the capture go to the call's queue by default.
  DefaultQueueScope queue_scope(options.queue);
  call.check_inputs();  // every leaf, before anything moves to a device
  placed_.clear();
  call.place_inputs(options.queue);
  if (options_.prep_run) {
    const PrepRunScope scope;  // random draws leave their generators where they are
    call.prep_run(options_.clone_prep_inputs, options.queue);
  }
  begin_capture(options.queue);
  try {
    call.invoke();
    end_capture(options.queue);
    call.check_outputs();
  } catch (...) {
    abort_capture(options.queue);
    throw;
  }
  std::vector<Tensor*> outputs;
  slots_.clear();
  call.commit(slots_, outputs);
  std::vector<const Buffer*> buffers;
  buffers.reserve(slots_.size());
  for (const Tensor* slot : slots_) buffers.push_back(slot->buffer().get());
  set_slots(std::move(buffers));
  mark_captured();
  stamped_.clear();
  for (Tensor* output : outputs) {
    if (stamps_output(*output)) stamped_.push_back(output);
  }
  if (!options.execute_on_capture) return;
  try {
    call.execute(*this, options);
  } catch (...) {
    call.release();  // the trace never ran: do not leak it
    throw;
  }
  stamp_outputs();
}

void TracerCore::replay(const CallOptions& options, TracedCall& call) {
  incoming_.clear();
  call.match(incoming_);  // every leaf checked: a rejected call changes nothing
  RETRACE_CHECK(incoming_.size() == slots_.size(), failed_precondition,
                "tracer '{}': the call has {} input tensors where the trace has {} slots",
                options_.name, incoming_.size(), slots_.size());
  // Inputs passed back from their slots (the usual loop) need nothing: one pass tells.
  std::size_t first = 0;
  while (first < slots_.size() && in_place(*slots_[first], *incoming_[first])) ++first;
  stats_.copies_skipped += first;
  if (first < slots_.size()) {
    // An incoming tensor that is another input's slot is copied aside before any slot changes.
    snapshots_.clear();
    snapshots_.reserve(slots_.size());
    for (std::size_t i = first; i < slots_.size(); ++i) {
      if (needs_snapshot(*slots_[i], *incoming_[i])) {
        snapshots_.push_back(incoming_[i]->clone(options.queue));
        incoming_[i] = &snapshots_.back();
      }
    }
    for (std::size_t i = first; i < slots_.size(); ++i) {
      refresh(*slots_[i], *incoming_[i], options.queue);
    }
    snapshots_.clear();
  }
  incoming_.clear();
  call.execute(*this, options);
  ++stats_.replays;
  stamp_outputs();
}

void TracerCore::stamp_outputs() noexcept {
  ++version_;
  for (Tensor* output : stamped_) detail::stamp_replay_version(*output, version_);
}

TraceStats TracerCore::stats() const {
  TraceStats stats = stats_;
  stats.live_traces = state_ == TracerState::captured ? 1 : 0;
  stats.trace_bytes = state_ == TracerState::captured && devices_open() ? trace_bytes() : 0;
  return stats;
}

void TracerCore::check_call(const CallOptions& options) const {
  RETRACE_CHECK(options.key.is_default(), invalid_argument,
                "tracer '{}': a Tracer holds one trace, so a call takes no trace key (got {}); "
                "keys select among the traces of traced wrappers (traced_function, "
                "traced_method)",
                options_.name, options.key.to_string());
}

std::size_t TracerCore::trace_bytes() const {
  require_devices_open("trace_bytes()");
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < traces_.size(); ++i) bytes += devices_[i]->trace_info(traces_[i]).bytes;
  return bytes;
}

void TracerCore::require_devices_open(std::string_view what) const {
  for (const auto& link : links_) {
    if (link->device.load() != nullptr) [[likely]] continue;
    RETRACE_FAIL(failed_precondition,
                 "tracer '{}': {}: its device {} was closed; its traces and input slots are "
                 "gone (make a new tracer on an open device)",
                 options_.name, what, link->name);
  }
}

bool TracerCore::devices_open() const noexcept {
  return std::all_of(links_.begin(), links_.end(),
                     [](const auto& link) { return link->device.load() != nullptr; });
}

void TracerCore::check_capture_input(const TreePath& path, const Tensor& tensor) const {
  if (tensor.is_keep_slot()) {
    throw_tree_error(path, "is keep_slot() (None in Python), which keeps an input slot of a "
                           "captured trace as it is; the capturing call has no slot yet: pass "
                           "the tensor");
  }
  if (tensor.is_null()) throw_tree_error(path, "is a null tensor");
  if (tensor.on_host()) {
    if (devices_.size() == 1) return;
    throw_tree_error(path, fmt::format("is a host tensor; a tracer over several devices ({}) "
                                       "needs its inputs on a device (host tensors are not "
                                       "supported during capture when the tracer manages "
                                       "multiple devices)",
                                       device_names(devices_)));
  }
  const Device* device = tensor.device();
  if (device == nullptr) {
    RETRACE_FAIL(failed_precondition, "{}: lives on {}, which was closed", path.describe(),
                 tensor.buffer()->link().name);
  }
  if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) {
    throw_tree_error(path, fmt::format("is on {}, which is not a device of tracer '{}' ({}): its "
                                       "device does not match any tracer device",
                                       device->name(), options_.name, device_names(devices_)));
  }
}

Tensor TracerCore::place_capture_input(const Tensor& tensor, QueueId queue) {
  if (tensor.on_host()) {
    Tensor placed = tensor.to_device(*devices_.front(), queue, Blocking::no);
    placed_.push_back(placed.buffer().get());
    return placed;
  }
  const Buffer* buffer = tensor.buffer().get();
  if (!tensor.is_contiguous()) {
    // A strided view gets a dense slot of its own: every replay copies the new input into it.
    Tensor copy = tensor.clone(queue);
    placed_.push_back(copy.buffer().get());
    return copy;
  }
  if (std::find(placed_.begin(), placed_.end(), buffer) == placed_.end()) {
    placed_.push_back(buffer);
    return tensor;
  }
  // The same storage passed for two inputs: a slot of its own, or refreshing one input would
  // overwrite the other.
  Tensor copy = tensor.clone(queue);
  placed_.push_back(copy.buffer().get());
  log(LogLevel::debug, "tracer '{}': one tensor passed for two inputs; the second gets its own slot",
      options_.name);
  return copy;
}

void TracerCore::set_slots(std::vector<const Buffer*> buffers) {
  std::sort(buffers.begin(), buffers.end());
  slot_buffers_ = std::move(buffers);
  placed_.clear();
}

bool TracerCore::needs_snapshot(const Tensor& slot, const Tensor& incoming) const {
  if (incoming.is_keep_slot() || !incoming.on_device() || incoming.buffer() == slot.buffer()) {
    return false;
  }
  return std::binary_search(slot_buffers_.begin(), slot_buffers_.end(), incoming.buffer().get());
}

void TracerCore::check_output(const TreePath& path, const Tensor& tensor) const {
  if (tensor.is_null()) throw_tree_error(path, "is a null tensor");
  if (tensor.on_host()) {
    throw_tree_error(path, "is a host tensor; a traced function must return device tensors");
  }
  const Device* device = tensor.device();
  if (device == nullptr ||
      std::find(devices_.begin(), devices_.end(), device) == devices_.end()) {
    throw_tree_error(path, fmt::format("is on {}{}, which is not a device of tracer '{}'",
                                       tensor.buffer()->link().name,
                                       device ? "" : " (closed)", options_.name));
  }
}

// The phrase ttnn's tracing utilities use for these errors, kept for code that matches on it.
constexpr std::string_view kTensorMismatch = "tensor properties do not match the initial value";

void TracerCore::check_replay_input(const TreePath& path, const Tensor& slot,
                                    const Tensor& incoming) const {
  if (incoming.is_keep_slot()) return;  // the slot stays as it is
  if (incoming.is_null()) throw_tree_error(path, "is a null tensor");
  if (!(incoming.shape() == slot.shape())) [[unlikely]] {
    throw_tree_error(path, fmt::format("shape {} does not match the captured shape {} ({})",
                                       incoming.shape(), slot.shape(), kTensorMismatch));
  }
  if (incoming.dtype() != slot.dtype()) [[unlikely]] {
    throw_tree_error(path, fmt::format("dtype {} does not match the captured dtype {} ({})",
                                       incoming.dtype(), slot.dtype(), kTensorMismatch));
  }
  if (incoming.layout() != slot.layout()) [[unlikely]] {
    throw_tree_error(path, fmt::format("layout {} does not match the captured layout {} ({})",
                                       incoming.layout(), slot.layout(), kTensorMismatch));
  }
  if (incoming.on_device() && incoming.device() != slot.device()) [[unlikely]] {
    if (incoming.device() == nullptr) {
      RETRACE_FAIL(failed_precondition, "{}: lives on {}, which was closed", path.describe(),
                   incoming.buffer()->link().name);
    }
    throw_tree_error(path, fmt::format("is on {}, but the captured input is on {} (tensor device "
                                       "does not match the initial device)",
                                       incoming.device()->name(), slot.device()->name()));
  }
}

bool TracerCore::in_place(const Tensor& slot, const Tensor& incoming) noexcept {
  return incoming.is_keep_slot() || (incoming.on_device() && incoming.address() == slot.address() &&
                                     incoming.is_contiguous());
}

void TracerCore::refresh(Tensor& slot, const Tensor& incoming, QueueId queue) {
  if (in_place(slot, incoming)) {
    ++stats_.copies_skipped;
    return;
  }
  if (incoming.on_host()) {
    slot.device()->write(queue, *slot.buffer(), 0, incoming.host_bytes(), Blocking::no);
  } else {
    ops::copy(incoming, slot, queue);
  }
  ++stats_.copies;
  stats_.bytes_refreshed += slot.nbytes();
}

void TracerCore::start_call() noexcept {
  stats_.bytes_refreshed = 0;
  stats_.copies = 0;
  stats_.copies_skipped = 0;
}

void TracerCore::begin_capture(QueueId queue) {
  RETRACE_CHECK(state_ != TracerState::capturing, failed_precondition,
                "tracer '{}' was called while it is capturing (a re-entrant call from inside the "
                "traced function?)",
                options_.name);
  state_ = TracerState::capturing;
  traces_.clear();
  begun_ = 0;
  try {
    for (Device* device : devices_) {
      device->begin_trace_capture(queue);
      ++begun_;
    }
  } catch (...) {
    abort_capture(queue);
    throw;
  }
}

void TracerCore::end_capture(QueueId queue) {
  for (std::size_t i = traces_.size(); i < devices_.size(); ++i) {
    traces_.push_back(devices_[i]->end_trace_capture(queue));
  }
}

void TracerCore::abort_capture(QueueId queue) noexcept {
  for (std::size_t i = 0; i < begun_; ++i) {
    try {
      const TraceId trace =
          i < traces_.size() ? traces_[i] : devices_[i]->end_trace_capture(queue);
      devices_[i]->release_trace(trace);
    } catch (const std::exception& e) {
      log(LogLevel::error, "tracer '{}': could not release a partial trace on {}: {}",
          options_.name, devices_[i]->name(), e.what());
    }
  }
  traces_.clear();
  placed_.clear();
  begun_ = 0;
  state_ = TracerState::idle;
  log(LogLevel::debug, "tracer '{}': capture abandoned, partial traces released", options_.name);
}

void TracerCore::mark_captured() noexcept {
  state_ = TracerState::captured;
  reason_ = stats_.captures == 0 ? "first traced call" : "the previous trace was released";
  ++stats_.captures;
  if (log_level() <= LogLevel::debug) {
    std::vector<std::string> parts;
    for (std::size_t i = 0; i < traces_.size(); ++i) {
      const TraceInfo info = devices_[i]->trace_info(traces_[i]);
      parts.push_back(fmt::format("trace {} on {} ({} commands, {} bytes)", traces_[i],
                                  devices_[i]->name(), info.commands, info.bytes));
    }
    log(LogLevel::debug, "tracer '{}': captured {}", options_.name, fmt::join(parts, ", "));
  }
}

void TracerCore::execute(const CallOptions& options) {
  if (devices_.size() == 1) {
    devices_[0]->execute_trace(traces_[0], options.queue, options.blocking);
    return;
  }
  // Several devices: every replay is started before any is waited for (the members of a mesh
  // meet inside their collectives), then a blocking call waits for each device's queue and
  // raises the first failure once all were waited for.
  std::exception_ptr first;
  if (std::all_of(devices_.begin(), devices_.end(), [](const Device* d) {
        return d->supports(Capability::host_visible_memory);
      })) {
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      devices_[i]->execute_trace(traces_[i], options.queue, Blocking::no);
    }
  } else {
    // Accelerators (GPUs) are started from a thread each: a graph launch whose collectives
    // (NCCL) wait for a peer's may block until that peer's graph is launched too, and one
    // thread launching them in turn would then never get to it.
    std::vector<std::exception_ptr> failures(devices_.size());
    {
      std::vector<std::jthread> launchers;
      launchers.reserve(devices_.size() - 1);
      const auto launch = [&](std::size_t i) noexcept {
        try {
          devices_[i]->execute_trace(traces_[i], options.queue, Blocking::no);
        } catch (...) {
          failures[i] = std::current_exception();
        }
      };
      for (std::size_t i = 1; i < devices_.size(); ++i) launchers.emplace_back(launch, i);
      launch(0);
    }  // joined: every replay has started
    for (const std::exception_ptr& f : failures) {
      if (f && !first) first = f;
    }
    if (first && options.blocking == Blocking::no) std::rethrow_exception(first);
  }
  if (options.blocking == Blocking::no) return;
  for (Device* device : devices_) {
    try {
      device->synchronize(options.queue);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void TracerCore::require_function(bool has_function, std::string_view what) const {
  RETRACE_CHECK(has_function, failed_precondition,
                "tracer '{}' cannot {}: the function was released with release_function() (a "
                "tracer cannot be reused after the trace was released without its function)",
                options_.name, what);
}

void TracerCore::require_untraced_allowed(bool has_function) const {
  RETRACE_CHECK(state_ != TracerState::captured, failed_precondition,
                "untraced call of tracer '{}' is not allowed after a trace was captured; make a "
                "traced call, or call release_trace() first",
                options_.name);
  require_function(has_function, "run untraced");
}

void TracerCore::require_captured(std::string_view what) const {
  RETRACE_CHECK(state_ == TracerState::captured, failed_precondition,
                "{}: tracer '{}' has no captured trace; make a traced call first", what,
                options_.name);
}

bool TracerCore::stamps_output(const Tensor& output) const noexcept {
  const Buffer* buffer = output.buffer().get();
  if (buffer == nullptr || !buffer->trace()) return false;
  // Only the trace's own memory is overwritten by its replays; an input slot returned as an
  // output is a handle on the latest input, never stale.
  if (std::find(traces_.begin(), traces_.end(), *buffer->trace()) == traces_.end()) return false;
  return !std::binary_search(slot_buffers_.begin(), slot_buffers_.end(), buffer);
}

bool TracerCore::release() noexcept {
  if (state_ != TracerState::captured) return false;
  for (std::size_t i = 0; i < traces_.size(); ++i) {
    if (links_[i]->device.load() == nullptr) continue;  // the device closed and freed it
    try {
      devices_[i]->release_trace(traces_[i]);
    } catch (const std::exception& e) {
      log(LogLevel::error, "tracer '{}': releasing trace {} on {} failed: {}", options_.name,
          traces_[i], devices_[i]->name(), e.what());
    }
  }
  log(LogLevel::debug, "tracer '{}': released {} trace(s)", options_.name, traces_.size());
  traces_.clear();
  slots_.clear();
  stamped_.clear();
  state_ = TracerState::idle;
  return true;
}

}  // namespace retrace::detail
