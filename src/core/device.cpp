#include "retrace/device.hpp"

#include "retrace/error.hpp"

#include <algorithm>
#include <thread>

namespace retrace {

namespace {

std::atomic<std::uint64_t> g_next_device_uid{1};
std::atomic<std::uint64_t> g_next_trace_id{1};

// Live traces of every device in the process, so a trace id given to the wrong device can be
// told apart from a released one. Touched only at capture, release and in error paths.
struct TraceOwners {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, std::shared_ptr<detail::DeviceLink>> owner;
};
TraceOwners& trace_owners() {
  static TraceOwners* owners = new TraceOwners;  // never destroyed: devices may outlive main
  return *owners;
}

thread_local QueueId t_default_queue{0};

}  // namespace

DefaultQueueScope::DefaultQueueScope(QueueId queue) noexcept : previous_(t_default_queue) {
  if (queue != kDefaultQueue) t_default_queue = queue;
}

DefaultQueueScope::~DefaultQueueScope() { t_default_queue = previous_; }

Device& detail::DeviceLink::require_open(std::string_view what) const {
  Device* open = device.load();
  RETRACE_CHECK(open != nullptr, failed_precondition,
                "{}: {} was closed; its memory, traces and queues are gone", what, name);
  return *open;
}

// --- Buffer / Event ---------------------------------------------------------------------------

Buffer::Buffer(std::shared_ptr<detail::DeviceLink> link, BlockInfo block) noexcept
    : link_(std::move(link)), block_(block) {}

Buffer::~Buffer() {
  if (Device* device = link_->device.load()) device->do_free(block_);
}

Event::Event(std::shared_ptr<detail::EventState> state, std::shared_ptr<detail::DeviceLink> link,
             QueueId queue) noexcept
    : state_(std::move(state)), link_(std::move(link)), queue_(queue) {}

bool Event::is_complete() const {
  RETRACE_CHECK(state_, invalid_argument, "is_complete: the event was never recorded");
  link_->require_open("Event::is_complete");
  return state_->is_complete();
}

void Event::synchronize() const {
  RETRACE_CHECK(state_, invalid_argument, "synchronize: the event was never recorded");
  link_->require_open("Event::synchronize").check_not_capturing("waiting for an event on the host");
  state_->wait();
}

// --- Device: lifetime -------------------------------------------------------------------------

Device::Device(std::string_view backend, DeviceId id, std::uint32_t num_queues)
    : backend_(backend),
      id_(id),
      name_(fmt::format("{}:{}", backend, id.value)),
      num_queues_(num_queues),
      link_(std::make_shared<detail::DeviceLink>()) {
  RETRACE_CHECK(num_queues >= 1, invalid_argument, "{} needs at least one command queue", name_);
  link_->uid = g_next_device_uid.fetch_add(1);
  link_->name = name_;
  link_->device.store(this);
}

Device::~Device() {
  RETRACE_ASSERT(link_->device.load() == nullptr,
                 "backend destructor of {} did not call close()", name_);
}

void Device::close() noexcept {
  if (link_->device.load() == nullptr) return;
  do_shutdown();
  std::unordered_map<std::uint64_t, std::shared_ptr<TraceBase>> traces;
  {
    std::lock_guard lock(mutex_);
    traces.swap(traces_);
    capture_queue_.reset();
    capturing_.store(false);
  }
  {
    auto& owners = trace_owners();
    std::lock_guard lock(owners.mutex);
    for (const auto& [id, trace] : traces) owners.owner.erase(id);
  }
  for (auto& [id, trace] : traces) do_release_trace(*trace);
  link_->device.store(nullptr);
}

std::string Device::queue_label(QueueId queue) const {
  return fmt::format("queue {} of {}", queue, name_);
}

// --- checks -----------------------------------------------------------------------------------

void Device::require_open(std::string_view what) const { link_->require_open(what); }

QueueId Device::resolve_queue(QueueId queue, std::string_view what) const {
  require_open(what);
  if (queue == kDefaultQueue) {
    queue = t_default_queue;
    if (capturing_.load()) [[unlikely]] {
      std::lock_guard lock(mutex_);
      if (capture_queue_ && capture_thread_ == std::this_thread::get_id()) queue = *capture_queue_;
    }
  }
  check_queue(queue, what);
  return queue;
}

void Device::check_queue(QueueId queue, std::string_view what) const {
  RETRACE_CHECK(queue.value < num_queues_, invalid_argument,
                "{}: queue {} does not exist on {} (it has queues 0..{})", what, queue, name_,
                num_queues_ - 1);
}

void Device::check_not_capturing(std::string_view what) const {
  if (!capturing_.load()) [[likely]] return;
  std::lock_guard lock(mutex_);
  RETRACE_CHECK(!capture_queue_ || capture_thread_ != std::this_thread::get_id(),
                capture_violation,
                "{} is not allowed while {} is capturing trace {}; end the capture with "
                "end_trace_capture first",
                what, queue_label(*capture_queue_), capture_trace_);
}

void Device::check_queue_not_capturing(QueueId queue, std::string_view what) const {
  if (!capturing_.load()) [[likely]] return;
  check_not_capturing(what);
  std::lock_guard lock(mutex_);
  RETRACE_CHECK(!capture_queue_ || *capture_queue_ != queue, capture_violation,
                "{} on {} is not allowed from another thread while that queue is capturing "
                "trace {} (captures are thread-local); use another queue",
                what, queue_label(queue), capture_trace_);
}

void Device::check_own_buffer(const Buffer& buffer, std::string_view what) const {
  if (buffer.device() == this) [[likely]] return;
  const detail::DeviceLink& owner = buffer.link();
  RETRACE_CHECK(owner.device.load() != nullptr, failed_precondition,
                "{}: the buffer at 0x{:x} belongs to {}, which was closed", what,
                buffer.address(), owner.name);
  RETRACE_FAIL(invalid_argument, "{}: the buffer at 0x{:x} belongs to {}, not {}", what,
               buffer.address(), owner.name, name_);
}

std::shared_ptr<TraceBase> Device::find_trace(TraceId trace, std::string_view what) const {
  require_open(what);
  {
    std::lock_guard lock(mutex_);
    auto it = traces_.find(trace.value);
    if (it != traces_.end()) return it->second;
    RETRACE_CHECK(!(capture_queue_ && capture_trace_ == trace), failed_precondition,
                  "{}: trace {} on {} is still being captured on {}; end the capture first",
                  what, trace, name_, queue_label(*capture_queue_));
  }
  std::string owner;
  {
    auto& owners = trace_owners();
    std::lock_guard lock(owners.mutex);
    if (auto it = owners.owner.find(trace.value); it != owners.owner.end()) {
      owner = it->second->name;
    }
  }
  RETRACE_CHECK(owner.empty(), invalid_argument,
                "{}: trace {} belongs to another device ({}), not {}; trace ids are unique in "
                "the process",
                what, trace, owner, name_);
  RETRACE_FAIL(invalid_argument,
               "{}: trace {} does not exist on {} (never captured, or already released)", what,
               trace, name_);
}

// --- memory and work --------------------------------------------------------------------------

std::shared_ptr<Buffer> Device::allocate(std::size_t bytes) {
  require_open("allocate");
  std::optional<TraceId> capture;
  if (capturing_.load()) {
    // Only the capturing thread allocates from the trace's pool.
    std::lock_guard lock(mutex_);
    if (capture_queue_ && capture_thread_ == std::this_thread::get_id()) capture = capture_trace_;
  }
  try {
    return std::make_shared<Buffer>(link_, do_allocate(bytes, capture));
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::out_of_memory) throw;
  }
  // Buffers whose handles are gone may still be held by queued eager work: let it finish and
  // drop them, then try once more (the second failure is reported).
  do_reclaim();
  return std::make_shared<Buffer>(link_, do_allocate(bytes, capture));
}

void Device::write(QueueId queue, const Buffer& dst, std::size_t offset,
                   std::span<const std::byte> src, Blocking blocking) {
  queue = resolve_queue(queue, "write");
  check_queue_not_capturing(queue, "writing host data to the device");
  check_own_buffer(dst, "write");
  RETRACE_CHECK(offset <= dst.size() && src.size() <= dst.size() - offset, invalid_argument,
                "write: {} bytes at offset {} do not fit the {}-byte buffer at 0x{:x} on {}",
                src.size(), offset, dst.size(), dst.address(), name_);
  do_write(queue, dst, offset, src, blocking);
}

void Device::read(QueueId queue, const Buffer& src, std::size_t offset, std::span<std::byte> dst) {
  queue = resolve_queue(queue, "read");
  check_queue_not_capturing(queue, "reading a device buffer to the host");
  check_own_buffer(src, "read");
  RETRACE_CHECK(offset <= src.size() && dst.size() <= src.size() - offset, invalid_argument,
                "read: {} bytes at offset {} exceed the {}-byte buffer at 0x{:x} on {}",
                dst.size(), offset, src.size(), src.address(), name_);
  do_read(queue, src, offset, dst);
}

void Device::enqueue(QueueId queue, const KernelLaunch& launch) {
  const bool explicit_queue = queue != kDefaultQueue;
  queue = resolve_queue(queue, launch.op);
  RETRACE_CHECK(launch.params_size <= kMaxKernelParamsBytes, invalid_argument,
                "{}: kernel parameters of {} bytes exceed the limit of {}", launch.op,
                launch.params_size, kMaxKernelParamsBytes);
  for (const Buffer* buffer : launch.buffers) check_own_buffer(*buffer, launch.op);
  if (capturing_.load()) [[unlikely]] {
    std::lock_guard lock(mutex_);
    if (capture_queue_ && *capture_queue_ != queue) {
      RETRACE_CHECK(!explicit_queue || capture_thread_ != std::this_thread::get_id(),
                    capture_violation,
                    "{}: enqueued on {} while this thread is capturing trace {} on {}; the op "
                    "would run now, outside the trace. Send the ops of a traced function to the "
                    "captured queue (or leave the queue argument at its default, which follows "
                    "the capture)",
                    launch.op, queue_label(queue), capture_trace_, queue_label(*capture_queue_));
    }
    RETRACE_CHECK(!capture_queue_ || *capture_queue_ != queue ||
                      capture_thread_ == std::this_thread::get_id(),
                  capture_violation,
                  "{}: enqueueing on {} from another thread while that queue is capturing trace "
                  "{} is not allowed (captures are thread-local); use another queue",
                  launch.op, queue_label(queue), capture_trace_);
  }
  do_enqueue(queue, launch);
}

void Device::synchronize(QueueId queue) {
  queue = resolve_queue(queue, "synchronize");
  check_queue_not_capturing(queue, "synchronize");
  do_synchronize(queue);
}

void Device::synchronize() {
  require_open("synchronize");
  check_not_capturing("synchronize");
  // Wait for every queue before reporting the first failure, so nothing is left running. Another
  // thread's capture in progress is skipped: its queue is recording, not running.
  std::optional<Error> first;
  for (std::uint32_t q = 0; q < num_queues_; ++q) {
    if (capturing_trace(QueueId{q})) continue;
    try {
      do_synchronize(QueueId{q});
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

Event Device::record_event(QueueId queue) {
  queue = resolve_queue(queue, "record_event");
  check_queue_not_capturing(queue, "recording an event");
  return Event(do_record_event(queue), link_, queue);
}

void Device::wait_event(QueueId queue, const Event& event) {
  queue = resolve_queue(queue, "wait_event");
  check_queue_not_capturing(queue, "waiting on an event");
  RETRACE_CHECK(event.valid(), invalid_argument, "wait_event: the event was never recorded");
  RETRACE_CHECK(event.device() == this, invalid_argument,
                "wait_event: the event was recorded on {}, not {}",
                event.device() ? event.device()->name() : std::string("a closed device"), name_);
  do_wait_event(queue, event);
}

// --- traces -----------------------------------------------------------------------------------

void Device::begin_trace_capture(QueueId queue) {
  queue = resolve_queue(queue, "begin_trace_capture");
  std::lock_guard lock(mutex_);
  if (capture_queue_) {
    RETRACE_CHECK(*capture_queue_ != queue, failed_precondition,
                  "begin_trace_capture: {} is already capturing trace {}; a queue records one "
                  "trace at a time, call end_trace_capture first",
                  queue_label(queue), capture_trace_);
    RETRACE_FAIL(failed_precondition,
                 "begin_trace_capture on {}: {} is capturing trace {} (one capture per device "
                 "at a time); end that capture first",
                 queue_label(queue), queue_label(*capture_queue_), capture_trace_);
  }
  const TraceId trace{g_next_trace_id.fetch_add(1)};
  do_begin_capture(queue, trace);
  capture_queue_ = queue;
  capture_trace_ = trace;
  capture_thread_ = std::this_thread::get_id();
  capturing_.store(true);
}

TraceId Device::end_trace_capture(QueueId queue) {
  queue = resolve_queue(queue, "end_trace_capture");
  std::lock_guard lock(mutex_);
  RETRACE_CHECK(capture_queue_, failed_precondition,
                "end_trace_capture: no capture is in progress on {}; call begin_trace_capture "
                "first",
                name_);
  RETRACE_CHECK(*capture_queue_ == queue, failed_precondition,
                "end_trace_capture: {} is not capturing ({} is capturing trace {})",
                queue_label(queue), queue_label(*capture_queue_), capture_trace_);
  RETRACE_CHECK(capture_thread_ == std::this_thread::get_id(), capture_violation,
                "end_trace_capture: trace {} on {} was begun by another thread; captures are "
                "thread-local, end it on the thread that began it",
                capture_trace_, queue_label(queue));
  std::shared_ptr<TraceBase> trace;
  try {
    trace = do_end_capture(queue);
  } catch (...) {
    // The backend discarded the capture (e.g. CUDA invalidated it): the queue is free again.
    capture_queue_.reset();
    capturing_.store(false);
    throw;
  }
  trace->info.id = capture_trace_;
  trace->info.captured_on = queue;
  {
    auto& owners = trace_owners();
    std::lock_guard owners_lock(owners.mutex);
    owners.owner.emplace(capture_trace_.value, link_);
  }
  traces_.emplace(capture_trace_.value, std::move(trace));
  capture_queue_.reset();
  capturing_.store(false);
  return capture_trace_;
}

void Device::execute_trace(TraceId trace, QueueId queue, Blocking blocking) {
  queue = resolve_queue(queue, "execute_trace");
  std::shared_ptr<TraceBase> found = find_trace(trace, "execute_trace");
  if (capturing_.load()) {
    std::lock_guard lock(mutex_);
    RETRACE_CHECK(capture_queue_ != queue, capture_violation,
                  "execute_trace: cannot replay trace {} on {} while that queue is capturing "
                  "trace {}; replay it on another queue or end the capture first",
                  trace, queue_label(queue), capture_trace_);
  }
  // A blocking replay waits for its queue: a synchronize (CUDA would invalidate the capture).
  if (blocking == Blocking::yes) check_not_capturing("a blocking execute_trace");
  do_execute_trace(*found, queue, blocking);
}

void Device::release_trace(TraceId trace) {
  std::shared_ptr<TraceBase> found = find_trace(trace, "release_trace");
  {
    std::lock_guard lock(mutex_);
    if (traces_.erase(trace.value) == 0) return;  // released concurrently by another thread
  }
  {
    auto& owners = trace_owners();
    std::lock_guard lock(owners.mutex);
    owners.owner.erase(trace.value);
  }
  do_release_trace(*found);
}

bool Device::has_trace(TraceId trace) const {
  std::lock_guard lock(mutex_);
  return traces_.contains(trace.value);
}

TraceInfo Device::trace_info(TraceId trace) const {
  return find_trace(trace, "trace_info")->info;
}

std::vector<TraceId> Device::live_traces() const {
  std::vector<TraceId> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, trace] : traces_) ids.emplace_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::optional<TraceId> Device::capturing_trace(QueueId queue) const {
  std::lock_guard lock(mutex_);
  if (capture_queue_ && *capture_queue_ == queue) return capture_trace_;
  return std::nullopt;
}

DeviceStats Device::stats() const {
  require_open("stats");
  DeviceStats stats;
  {
    std::lock_guard lock(mutex_);
    stats.live_traces = traces_.size();
  }
  do_fill_stats(stats);
  return stats;
}

}  // namespace retrace
