// Device: the protocol every backend shares (checks, capture state machine, allocator and pools,
// trace records, counters, closing), on top of a Backend that moves bytes and runs kernels.
#include "device/device_core.hpp"
#include "retrace/backend.hpp"
#include "retrace/error.hpp"
#include "util/timing.hpp"

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
  static auto* owners = new TraceOwners;  // never destroyed: devices may outlive main
  return *owners;
}

void forget_trace_owner(std::uint64_t trace) {
  auto& owners = trace_owners();
  std::lock_guard lock(owners.mutex);
  owners.owner.erase(trace);
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

Buffer::Buffer(std::shared_ptr<detail::DeviceLink> link, void* data, std::uint64_t address,
               std::size_t size, std::optional<TraceId> trace) noexcept
    : link_(std::move(link)), data_(data), address_(address), size_(size), trace_(trace) {}

Buffer::~Buffer() {
  if (Device* device = link_->device.load()) device->free_buffer(*this);
}

std::shared_ptr<void> Buffer::add_derived(std::uint64_t key, std::shared_ptr<void> value) const {
  std::lock_guard lock(derived_mutex_);
  for (const auto& [k, stored] : derived_) {
    if (k == key) return stored;
  }
  derived_.emplace_back(key, value);
  return value;
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

namespace {
void check_device_options(std::string_view backend, const DeviceOptions& options,
                          const MemoryRegion& region) {
  RETRACE_CHECK(options.num_queues >= 1 && options.num_queues <= 64, invalid_argument,
                "{}:{}: num_queues must be in [1, 64], got {}", backend, options.id,
                options.num_queues);
  RETRACE_CHECK(region.base != nullptr && region.bytes > 0, invalid_argument,
                "{}:{}: the backend gave no memory region", backend, options.id);
  RETRACE_CHECK(region.alignment >= 64 && (region.alignment & (region.alignment - 1)) == 0,
                invalid_argument, "{}:{}: region alignment {} is not a power of two >= 64",
                backend, options.id, region.alignment);
  RETRACE_CHECK(options.guard_bytes == 0 || region.host_visible, invalid_argument,
                "{}:{}: guard_bytes need host-visible memory, which this backend does not have",
                backend, options.id);
}
}  // namespace

std::unique_ptr<Device> make_device(std::unique_ptr<Backend> backend,
                                    const DeviceOptions& options) {
  RETRACE_CHECK(backend != nullptr, invalid_argument, "make_device: the backend is null");
  RETRACE_CHECK(options.memory_bytes > 0, invalid_argument,
                "{}:{}: memory_bytes must be positive", backend->name(), options.id);
  return std::unique_ptr<Device>(new Device(std::move(backend), options));
}

Device::Device(std::unique_ptr<Backend> backend, const DeviceOptions& options)
    : backend_name_(backend->name()),
      id_(options.id),
      num_queues_(options.num_queues),
      link_(std::make_shared<detail::DeviceLink>()) {
  link_->uid = g_next_device_uid.fetch_add(1);
  link_->name = fmt::format("{}:{}", backend_name_, id_.value);
  const MemoryRegion region = backend->region();
  check_device_options(backend_name_, options, region);
  backend->device_ = this;
  core_ = std::make_unique<detail::DeviceCore>(std::move(backend), region, link_->name, options);
  link_->device.store(this);
}

Device::~Device() { close(); }

void Device::close() noexcept {
  if (link_->device.load() == nullptr) return;
  detail::DeviceCore& c = *core_;
  std::unordered_map<std::uint64_t, std::shared_ptr<detail::TraceRecord>> traces;
  std::optional<QueueId> capture_queue;
  TraceId capture_trace{};
  {
    std::lock_guard lock(c.mutex);
    traces.swap(c.traces);
    capture_queue = c.capture_queue;
    capture_trace = c.capture_trace;
    c.capture_queue.reset();
    c.capture.reset();
    c.capture_seen.clear();
    c.capturing.store(false);
  }
  if (capture_queue) {  // before anything waits: a capturing queue cannot be waited on
    c.backend->abort_capture(*capture_queue);
    c.arena.release_pool(capture_trace);
  }
  c.backend->shutdown();
  for (auto& [id, record] : traces) {
    forget_trace_owner(id);
    c.backend->release(*record->backend, record->info.id);
    c.arena.release_pool(record->info.id);
  }
  traces.clear();  // drops the outside buffers the traces kept alive
  link_->device.store(nullptr);
}

bool Device::supports(Capability capability) const noexcept {
  return core_->backend->supports(capability);
}

bool Device::supports(KernelId kernel) const noexcept { return core_->backend->supports(kernel); }

const char* Device::unsupported_reason(const KernelLaunch& launch) const noexcept {
  if (!core_->backend->supports(launch.kernel)) return "this kernel";
  return core_->backend->unsupported_reason(launch);
}

Backend& Device::backend_impl() const noexcept { return *core_->backend; }

std::string Device::description() const { return core_->backend->description(); }

std::string Device::queue_label(QueueId queue) const {
  return fmt::format("queue {} of {}", queue, name());
}

// --- checks -----------------------------------------------------------------------------------

void Device::require_open(std::string_view what) const { link_->require_open(what); }

QueueId Device::resolve_queue(QueueId queue, std::string_view what) const {
  require_open(what);
  if (queue == kDefaultQueue) {
    queue = t_default_queue;
    if (core_->capturing.load()) [[unlikely]] {
      std::lock_guard lock(core_->mutex);
      if (core_->capture_queue && core_->capture_thread == std::this_thread::get_id()) {
        queue = *core_->capture_queue;
      }
    }
  }
  RETRACE_CHECK(queue.value < num_queues_, invalid_argument,
                "{}: queue {} does not exist on {} (it has queues 0..{})", what, queue, name(),
                num_queues_ - 1);
  return queue;
}

bool Device::is_capturing_on_this_thread() const noexcept {
  const detail::DeviceCore& c = *core_;
  if (!c.capturing.load()) [[likely]] return false;
  std::lock_guard lock(c.mutex);
  return c.capture_queue && c.capture_thread == std::this_thread::get_id();
}

void Device::check_not_capturing(std::string_view what) const {
  if (!is_capturing_on_this_thread()) [[likely]] return;
  // This thread's capture cannot end while this thread is here.
  const detail::DeviceCore& c = *core_;
  std::lock_guard lock(c.mutex);
  RETRACE_FAIL(capture_violation,
               "{} is not allowed while {} is capturing trace {}; end the capture with "
               "end_trace_capture first",
               what, queue_label(*c.capture_queue), c.capture_trace);
}

void Device::check_queue_not_capturing(QueueId queue, std::string_view what) const {
  const detail::DeviceCore& c = *core_;
  if (!c.capturing.load()) [[likely]] return;
  check_not_capturing(what);
  std::lock_guard lock(c.mutex);
  RETRACE_CHECK(!c.capture_queue || *c.capture_queue != queue, capture_violation,
                "{} on {} is not allowed from another thread while that queue is capturing "
                "trace {} (captures are thread-local); use another queue",
                what, queue_label(queue), c.capture_trace);
}

void Device::check_own_buffer(const Buffer& buffer, std::string_view what) const {
  if (buffer.device() == this) [[likely]] return;
  const detail::DeviceLink& owner = buffer.link();
  RETRACE_CHECK(owner.device.load() != nullptr, failed_precondition,
                "{}: the buffer at 0x{:x} belongs to {}, which was closed", what,
                buffer.address(), owner.name);
  RETRACE_FAIL(invalid_argument, "{}: the buffer at 0x{:x} belongs to {}, not {}", what,
               buffer.address(), owner.name, name());
}

namespace {
std::shared_ptr<detail::TraceRecord> find_record(const detail::DeviceCore& c, const Device& device,
                                                 TraceId trace, std::string_view what) {
  {
    std::lock_guard lock(c.mutex);
    auto it = c.traces.find(trace.value);
    if (it != c.traces.end()) return it->second;
    RETRACE_CHECK(!(c.capture_queue && c.capture_trace == trace), failed_precondition,
                  "{}: trace {} on {} is still being captured on {}; end the capture first",
                  what, trace, device.name(), device.queue_label(*c.capture_queue));
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
                what, trace, owner, device.name());
  RETRACE_FAIL(invalid_argument,
               "{}: trace {} does not exist on {} (never captured, or already released)", what,
               trace, device.name());
}
}  // namespace

void Device::report_memory_damage() {
  std::string damage;
  {
    std::lock_guard lock(core_->damage_mutex);
    damage.swap(core_->damage);
  }
  RETRACE_CHECK(damage.empty(), device_error, "{}", damage);
}

// --- memory -----------------------------------------------------------------------------------

std::shared_ptr<Buffer> Device::allocate_block(std::size_t bytes, std::optional<TraceId> capture) {
  const detail::BlockInfo block = core_->arena.allocate(bytes, capture);
  return std::shared_ptr<Buffer>(new Buffer(link_, block.data, block.address, block.size, block.trace));
}

std::shared_ptr<Buffer> Device::allocate(std::size_t bytes) {
  require_open("allocate");
  detail::DeviceCore& c = *core_;
  std::optional<TraceId> capture;
  if (c.capturing.load()) {
    // Only the capturing thread allocates from the trace's pool.
    std::lock_guard lock(c.mutex);
    if (c.capture_queue && c.capture_thread == std::this_thread::get_id()) {
      capture = c.capture_trace;
    }
  }
  try {
    return allocate_block(bytes, capture);
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::out_of_memory) throw;
  }
  // Buffers whose handles are gone may still be held by queued eager work: let it finish and
  // drop them, then try once more (the second failure is reported).
  c.backend->reclaim();
  return allocate_block(bytes, capture);
}

void Device::free_buffer(const Buffer& buffer) noexcept {
  const detail::BlockInfo block{buffer.data(), buffer.address(), buffer.size(), buffer.trace()};
  if (auto damage = core_->arena.free(block)) {
    std::lock_guard lock(core_->damage_mutex);
    if (core_->damage.empty()) core_->damage = std::move(*damage);
  }
}

// --- work -------------------------------------------------------------------------------------

void Device::write(QueueId queue, const Buffer& dst, std::size_t offset,
                   std::span<const std::byte> src, Blocking blocking) {
  queue = resolve_queue(queue, "write");
  check_queue_not_capturing(queue, "writing host data to the device");
  check_own_buffer(dst, "write");
  RETRACE_CHECK(offset <= dst.size() && src.size() <= dst.size() - offset, invalid_argument,
                "write: {} bytes at offset {} do not fit the {}-byte buffer at 0x{:x} on {}",
                src.size(), offset, dst.size(), dst.address(), name());
  core_->backend->write(queue, dst, offset, src, blocking);
  if (blocking == Blocking::yes) report_memory_damage();
}

void Device::read(QueueId queue, const Buffer& src, std::size_t offset, std::span<std::byte> dst) {
  queue = resolve_queue(queue, "read");
  check_queue_not_capturing(queue, "reading a device buffer to the host");
  check_own_buffer(src, "read");
  RETRACE_CHECK(offset <= src.size() && dst.size() <= src.size() - offset, invalid_argument,
                "read: {} bytes at offset {} exceed the {}-byte buffer at 0x{:x} on {}",
                dst.size(), offset, src.size(), src.address(), name());
  core_->backend->read(queue, src, offset, dst);
  report_memory_damage();
}

void Device::enqueue(QueueId queue, const KernelLaunch& launch) {
  const bool explicit_queue = queue != kDefaultQueue;
  queue = resolve_queue(queue, launch.op);
  detail::DeviceCore& c = *core_;
  RETRACE_CHECK(launch.params_size <= kMaxKernelParamsBytes, invalid_argument,
                "{}: kernel parameters of {} bytes exceed the limit of {}", launch.op,
                launch.params_size, kMaxKernelParamsBytes);
  RETRACE_CHECK(c.backend->supports(launch.kernel), unimplemented,
                "{}: {} has no {} kernel", launch.op, name(), kernel_name(launch.kernel));
  if (const char* reason = c.backend->unsupported_reason(launch)) [[unlikely]] {
    RETRACE_FAIL(unimplemented, "{}: {} has no kernel for {}", launch.op, name(), reason);
  }
  for (const Buffer* buffer : launch.buffers) check_own_buffer(*buffer, launch.op);
  bool recording = false;
  if (c.capturing.load()) [[unlikely]] {
    std::lock_guard lock(c.mutex);
    const bool this_thread = c.capture_thread == std::this_thread::get_id();
    if (c.capture_queue && *c.capture_queue != queue) {
      RETRACE_CHECK(!explicit_queue || !this_thread, capture_violation,
                    "{}: enqueued on {} while this thread is capturing trace {} on {}; the op "
                    "would run now, outside the trace. Send the ops of a traced function to the "
                    "captured queue (or leave the queue argument at its default, which follows "
                    "the capture)",
                    launch.op, queue_label(queue), c.capture_trace, queue_label(*c.capture_queue));
    }
    RETRACE_CHECK(!c.capture_queue || *c.capture_queue != queue || this_thread, capture_violation,
                  "{}: enqueueing on {} from another thread while that queue is capturing trace "
                  "{} is not allowed (captures are thread-local); use another queue",
                  launch.op, queue_label(queue), c.capture_trace);
    recording = c.capture_queue && *c.capture_queue == queue;
  }
  c.backend->enqueue(queue, launch);
  if (recording) {
    record_command(launch);
  } else {
    c.commands_executed.fetch_add(1, std::memory_order_relaxed);
  }
}

// On the capturing thread: the trace's listing, and the outside buffers it must keep alive.
void Device::record_command(const KernelLaunch& launch) {
  detail::DeviceCore& c = *core_;
  detail::TraceRecord& record = *c.capture;
  record.info.ops.emplace_back(launch.op);
  auto& addresses = record.info.command_buffers.emplace_back();
  addresses.reserve(launch.buffers.size());
  for (Buffer* buffer : launch.buffers) {
    addresses.push_back(buffer->address());
    if (buffer->trace() == c.capture_trace) continue;  // its own pool: reserved already
    if (c.capture_seen.insert(buffer).second) record.retained.push_back(buffer->shared_from_this());
  }
  ++record.info.commands;
}

void Device::synchronize(QueueId queue) {
  queue = resolve_queue(queue, "synchronize");
  check_queue_not_capturing(queue, "synchronize");
  core_->backend->synchronize(queue);
  report_memory_damage();
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
      core_->backend->synchronize(QueueId{q});
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
  report_memory_damage();
}

Event Device::record_event(QueueId queue) {
  queue = resolve_queue(queue, "record_event");
  RETRACE_CHECK(core_->backend->supports(Capability::events), unimplemented,
                "record_event: {} has no events", name());
  check_queue_not_capturing(queue, "recording an event");
  return Event(core_->backend->record_event(queue), link_, queue);
}

void Device::wait_event(QueueId queue, const Event& event) {
  queue = resolve_queue(queue, "wait_event");
  check_queue_not_capturing(queue, "waiting on an event");
  RETRACE_CHECK(event.valid(), invalid_argument, "wait_event: the event was never recorded");
  RETRACE_CHECK(event.device() == this, invalid_argument,
                "wait_event: the event was recorded on {}, not {}", event.link_->name, name());
  core_->backend->wait_event(queue, event.state_);
}

// --- traces -----------------------------------------------------------------------------------

void Device::begin_trace_capture(QueueId queue) {
  queue = resolve_queue(queue, "begin_trace_capture");
  detail::DeviceCore& c = *core_;
  RETRACE_CHECK(c.backend->supports(Capability::trace_capture), unimplemented,
                "begin_trace_capture: {} cannot capture traces", name());
  const TraceId trace{g_next_trace_id.fetch_add(1)};
  {
    std::lock_guard lock(c.mutex);
    if (c.capture_queue) {
      RETRACE_CHECK(*c.capture_queue != queue, failed_precondition,
                    "begin_trace_capture: {} is already capturing trace {}; a queue records one "
                    "trace at a time, call end_trace_capture first",
                    queue_label(queue), c.capture_trace);
      RETRACE_FAIL(failed_precondition,
                   "begin_trace_capture on {}: {} is capturing trace {} (one capture per device "
                   "at a time); end that capture first",
                   queue_label(queue), queue_label(*c.capture_queue), c.capture_trace);
    }
    // Reserved before the backend hook runs (without the lock), so no other capture starts.
    c.arena.begin_pool(trace);
    c.capture_queue = queue;
    c.capture_trace = trace;
    c.capture_thread = std::this_thread::get_id();
    c.capture = std::make_shared<detail::TraceRecord>();
    c.capture->info.id = trace;
    c.capture->info.captured_on = queue;
    c.capture_seen.clear();
    c.capturing.store(true);
  }
  try {
    c.backend->begin_capture(queue, trace);
  } catch (...) {
    std::lock_guard lock(c.mutex);
    c.arena.release_pool(trace);
    c.capture_queue.reset();
    c.capture.reset();
    c.capturing.store(false);
    throw;
  }
}

TraceId Device::end_trace_capture(QueueId queue) {
  queue = resolve_queue(queue, "end_trace_capture");
  detail::DeviceCore& c = *core_;
  std::shared_ptr<detail::TraceRecord> record;
  {
    std::lock_guard lock(c.mutex);
    RETRACE_CHECK(c.capture_queue, failed_precondition,
                  "end_trace_capture: no capture is in progress on {}; call begin_trace_capture "
                  "first",
                  name());
    RETRACE_CHECK(*c.capture_queue == queue, failed_precondition,
                  "end_trace_capture: {} is not capturing ({} is capturing trace {})",
                  queue_label(queue), queue_label(*c.capture_queue), c.capture_trace);
    RETRACE_CHECK(c.capture_thread == std::this_thread::get_id(), capture_violation,
                  "end_trace_capture: trace {} on {} was begun by another thread; captures are "
                  "thread-local, end it on the thread that began it",
                  c.capture_trace, queue_label(queue));
    record = c.capture;
  }
  const TraceId trace = record->info.id;
  auto finish = [&] {
    std::lock_guard lock(c.mutex);
    c.capture_queue.reset();
    c.capture.reset();
    c.capture_seen.clear();
    c.capturing.store(false);
  };
  try {
    record->backend = c.backend->end_capture(queue);
  } catch (...) {
    // The backend discarded the capture (e.g. CUDA invalidated it): the queue is free again.
    c.arena.release_pool(trace);
    finish();
    throw;
  }
  const auto [bytes, blocks] = c.arena.seal_pool(trace);
  record->info.bytes = bytes;
  record->info.pool_buffers = blocks;
  record->info.external_buffers = record->retained.size();
  {
    auto& owners = trace_owners();
    std::lock_guard lock(owners.mutex);
    owners.owner.emplace(trace.value, link_);
  }
  {
    std::lock_guard lock(c.mutex);
    c.traces.emplace(trace.value, record);
  }
  finish();
  return trace;
}

void Device::execute_trace(TraceId trace, QueueId queue, Blocking blocking) {
  queue = resolve_queue(queue, "execute_trace");
  detail::DeviceCore& c = *core_;
  std::shared_ptr<detail::TraceRecord> record = find_record(c, *this, trace, "execute_trace");
  if (c.capturing.load()) {
    std::lock_guard lock(c.mutex);
    RETRACE_CHECK(c.capture_queue != queue, capture_violation,
                  "execute_trace: cannot replay trace {} on {} while that queue is capturing "
                  "trace {}; replay it on another queue or end the capture first",
                  trace, queue_label(queue), c.capture_trace);
  }
  // A blocking replay waits for its queue: a synchronize (CUDA would invalidate the capture).
  if (blocking == Blocking::yes) check_not_capturing("a blocking execute_trace");
  report_memory_damage();
  c.backend->execute(*record->backend, trace, queue, blocking);
  c.commands_executed.fetch_add(record->info.commands, std::memory_order_relaxed);
  c.traces_executed.fetch_add(1, std::memory_order_relaxed);
  if (blocking == Blocking::yes) report_memory_damage();
}

void Backend::execute_timed(BackendTrace&, TraceId id, QueueId, std::span<std::uint64_t>) {
  RETRACE_FAIL(unimplemented,
               "profile_trace: the {} backend cannot time the commands of trace {} one by one",
               name(), id);
}

TraceProfile Device::profile_trace(TraceId trace, QueueId queue, std::size_t replays) {
  queue = resolve_queue(queue, "profile_trace");
  detail::DeviceCore& c = *core_;
  std::shared_ptr<detail::TraceRecord> record = find_record(c, *this, trace, "profile_trace");
  RETRACE_CHECK(replays >= 1 && replays <= 1'000'000, invalid_argument,
                "profile_trace: replays must be from 1 to 1000000, got {}", replays);
  check_not_capturing("profile_trace");
  report_memory_damage();
  const std::size_t commands = record->info.commands;
  TraceProfile profile;
  profile.trace = trace;
  profile.replays = replays;
  profile.ops = record->info.ops;
  std::vector<std::vector<double>> samples(commands, std::vector<double>(replays));
  std::vector<std::uint64_t> one(commands);
  std::vector<double> totals(replays);
  for (std::size_t r = 0; r < replays; ++r) {
    std::fill(one.begin(), one.end(), 0);
    const auto t0 = timing::Clock::now();
    c.backend->execute_timed(*record->backend, trace, queue, one);
    totals[r] = timing::milliseconds_since(t0) * 1e6;
    for (std::size_t i = 0; i < commands; ++i) samples[i][r] = static_cast<double>(one[i]);
    c.commands_executed.fetch_add(commands, std::memory_order_relaxed);
    c.traces_executed.fetch_add(1, std::memory_order_relaxed);
  }
  report_memory_damage();
  profile.command_ns.reserve(commands);
  for (auto& s : samples) profile.command_ns.push_back(timing::median(std::move(s)));
  profile.replay_ns = timing::median(std::move(totals));
  return profile;
}

void Device::release_trace(TraceId trace) {
  require_open("release_trace");
  detail::DeviceCore& c = *core_;
  std::shared_ptr<detail::TraceRecord> record = find_record(c, *this, trace, "release_trace");
  {
    std::lock_guard lock(c.mutex);
    if (c.traces.erase(trace.value) == 0) return;  // released concurrently by another thread
  }
  forget_trace_owner(trace.value);
  c.backend->release(*record->backend, trace);
  c.arena.release_pool(trace);
  record->retained.clear();
}

bool Device::has_trace(TraceId trace) const {
  std::lock_guard lock(core_->mutex);
  return core_->traces.contains(trace.value);
}

TraceInfo Device::trace_info(TraceId trace) const {
  require_open("trace_info");
  return find_record(*core_, *this, trace, "trace_info")->info;
}

std::vector<TraceId> Device::live_traces() const {
  std::vector<TraceId> ids;
  {
    std::lock_guard lock(core_->mutex);
    for (const auto& [id, record] : core_->traces) ids.emplace_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool Device::is_capturing() const noexcept { return core_->capturing.load(); }

std::optional<TraceId> Device::capturing_trace(QueueId queue) const {
  std::lock_guard lock(core_->mutex);
  if (core_->capture_queue && *core_->capture_queue == queue) return core_->capture_trace;
  return std::nullopt;
}

DeviceStats Device::stats() const {
  require_open("stats");
  DeviceStats stats;
  {
    std::lock_guard lock(core_->mutex);
    stats.live_traces = core_->traces.size();
  }
  core_->arena.fill_stats(stats);
  stats.commands_executed = core_->commands_executed.load(std::memory_order_relaxed);
  stats.traces_executed = core_->traces_executed.load(std::memory_order_relaxed);
  return stats;
}

BackendTrace* backend_trace(Device& device, TraceId trace) {
  std::lock_guard lock(device.core_->mutex);
  auto it = device.core_->traces.find(trace.value);
  return it == device.core_->traces.end() ? nullptr : it->second->backend.get();
}

}  // namespace retrace
