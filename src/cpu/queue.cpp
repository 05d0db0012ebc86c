#include "cpu/queue.hpp"

#include "cpu/parallel.hpp"
#include "util/spin.hpp"

#include "retrace/error.hpp"
#include "util/thread_name.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

namespace retrace::cpu {

void CpuEventState::wait() const {
  if (util::spin_while_idle([this] { return done_.load() != 0; }, std::chrono::microseconds(20))) {
    return;
  }
  while (done_.load() == 0) done_.wait(0);
}

void CpuEventState::signal() noexcept {
  done_.store(1);
  done_.notify_all();
}

CpuQueue::CpuQueue(std::string label, std::string thread_name, const CpuDeviceOptions& options,
                   const KernelVariant& kernels)
    : label_(std::move(label)),
      kernels_(kernels),
      mode_(options.execution),
      eager_batch_(std::max<std::uint32_t>(options.eager_batch, 1)),
      spin_us_(options.worker_spin_us),
      kernel_cap_(static_cast<int>(std::min<std::uint32_t>(options.kernel_threads, INT_MAX))) {
  if (mode_ == ExecutionMode::worker) {
    worker_ = std::thread([this, name = std::move(thread_name)] {
      util::name_this_thread(name);
      worker_loop();
    });
  }
}

CpuQueue::~CpuQueue() {
  {
    std::lock_guard lock(mutex_);
    flush_locked();
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// --- recording --------------------------------------------------------------------------------

void CpuQueue::record_command(Program& program, const KernelLaunch& launch, KernelFn fn) {
  if (launch.kernel == KernelId::collective) {
    program.collectives.push_back({program.size(), program.stream.size() + 1});
  }
  // The buffers it writes, a trace's own pool aside, have their write counts raised as it runs.
  const Buffer* few[8];
  std::vector<const Buffer*> many;
  const Buffer** marks = few;
  if (launch.buffers.size() > std::size(few)) {
    many.resize(launch.buffers.size());
    marks = many.data();
  }
  std::size_t count = 0;
  for (std::size_t i = 0; i < launch.buffers.size(); ++i) {
    const Buffer* buffer = launch.buffers[i];
    if (!launch.writes(i) || (program.trace && buffer->trace() == program.trace) ||
        std::find(marks, marks + count, buffer) != marks + count) {
      continue;
    }
    marks[count++] = buffer;
  }
  program.append(fn, launch.op, launch.params, launch.params_size, {marks, count});
  // An eager batch keeps its buffers alive until it ran; a trace's are kept by the device core.
  if (program.trace) return;
  for (Buffer* buffer : launch.buffers) program.retained.push_back(buffer->shared_from_this());
}

void CpuQueue::enqueue(const KernelLaunch& launch) {
  const KernelFn fn = kernels_.resolve(launch);  // may throw: before anything is recorded
  std::lock_guard lock(mutex_);
  if (capture_) {
    record_command(*capture_, launch, fn);
    return;
  }
  if (!open_batch_) open_batch_ = std::make_shared<Program>();
  record_command(*open_batch_, launch, fn);
  // Hand the batch over when the worker waits for work (it starts at once) or when it is full;
  // otherwise keep collecting and save the hand-off.
  // A collective goes at once: its peers wait for it.
  if (mode_ == ExecutionMode::inline_ || open_batch_->size() >= eager_batch_ ||
      launch.kernel == KernelId::collective) {
    flush_locked();
  }
}

void CpuQueue::begin_capture(TraceId trace) {
  std::lock_guard lock(mutex_);
  flush_locked();
  capture_ = std::make_shared<Program>();
  capture_->trace = trace;
}

std::shared_ptr<Program> CpuQueue::end_capture() {
  std::lock_guard lock(mutex_);
  return std::move(capture_);
}

// --- submission -------------------------------------------------------------------------------

void CpuQueue::flush_locked() {
  retired_.clear();  // programs the worker finished: their buffers are freed on this thread
  if (!open_batch_) return;
  push_locked(Item{Kind::program, 0, std::move(open_batch_), nullptr, nullptr});
  open_batch_.reset();
}

std::uint64_t CpuQueue::push_locked(Item item) {
  item.seq = next_seq_++;
  const std::uint64_t seq = item.seq;
  if (mode_ == ExecutionMode::inline_) {  // in order by construction: we hold the lock
    run(item);
    completed_.store(seq);
    completed_.notify_all();
    return seq;
  }
  pending_.push_back(std::move(item));
  submitter_cpu_.store(util::current_cpu(), std::memory_order_relaxed);
  pending_count_.fetch_add(1);
  work_cv_.notify_one();
  return seq;
}

std::uint64_t CpuQueue::submit(std::shared_ptr<const Program> program, Blocking blocking,
                               std::uint64_t* command_ns) {
  if (command_ns != nullptr) blocking = Blocking::yes;  // the caller reads the times
  std::unique_lock lock(mutex_);
  flush_locked();
  if (blocking == Blocking::no || mode_ == ExecutionMode::inline_) {
    return push_locked(Item{Kind::program, 0, std::move(program), nullptr, command_ns});
  }
  if (!program->collectives.empty()) {
    // Collectives run on the worker, never on a thread that may still have to start their
    // peers' work: a blocking replay waits for the worker, and returns once the peers' replays
    // (started from other threads) met it, or fails after the group's timeout.
    const std::uint64_t seq =
        push_locked(Item{Kind::program, 0, std::move(program), nullptr, command_ns});
    lock.unlock();
    wait_for(seq);
    return seq;
  }
  // Blocking: run on this thread once the queue's earlier work is done.
  Item item{Kind::program, next_seq_++, std::move(program), nullptr, command_ns};
  lock.unlock();
  help_until(item.seq - 1);
  run_in_turn(item);
  return item.seq;
}

void CpuQueue::signal(std::shared_ptr<CpuEventState> event) {
  std::lock_guard lock(mutex_);
  flush_locked();
  push_locked(Item{Kind::signal, 0, nullptr, std::move(event), nullptr});
}

void CpuQueue::wait(std::shared_ptr<const retrace::detail::EventState> event) {
  std::lock_guard lock(mutex_);
  flush_locked();
  push_locked(Item{Kind::wait, 0, nullptr, std::move(event), nullptr});
}

void CpuQueue::wait_idle() {
  std::uint64_t last = 0;
  {
    std::lock_guard lock(mutex_);
    flush_locked();
    last = next_seq_ - 1;
  }
  finish_through(last);
  std::lock_guard lock(mutex_);
  retired_.clear();
}

void CpuQueue::finish_through(std::uint64_t seq) {
  help_until(seq);
  wait_for(seq);
}

// Here and in pop: no spinning on the CPU of the thread waited for (it could not run meanwhile).
void CpuQueue::wait_for(std::uint64_t seq) const {
  if (util::spin_while_idle([&] { return completed_.load() >= seq; },
                            std::chrono::microseconds(spin_us_),
                            [this] { return util::on_this_cpu(runner_cpu_); })) {
    return;
  }
  for (std::uint64_t done = completed_.load(); done < seq; done = completed_.load()) {
    completed_.wait(done);
  }
}

std::optional<std::string> CpuQueue::take_error() {
  if (!failed_.load()) return std::nullopt;
  std::lock_guard lock(mutex_);
  std::optional<std::string> error = std::move(error_);
  error_.clear();
  failed_.store(false);
  return error;
}

// --- execution --------------------------------------------------------------------------------

// A thread other than the worker that is about to wait for item `seq` runs the items up to it
// that the worker has not taken although nothing before them is left to run: the worker sleeps
// or is not scheduled (on a busy machine, for a whole time slice). While the worker is still
// running an earlier item, the next one is left to it: it follows at once, on the core whose
// caches hold the earlier item's results. Collectives and waits on events are left to the worker
// (a collective must not run on a thread that may still have to start its peers' work).
void CpuQueue::help_until(std::uint64_t seq) {
  if (mode_ != ExecutionMode::worker) return;
  for (;;) {
    Item item;
    {
      std::lock_guard lock(mutex_);
      if (pending_.empty() || pending_.front().seq > seq ||
          completed_.load() + 1 != pending_.front().seq ||
          !outside_thread_may_run(pending_.front())) {
        return;
      }
      item = std::move(pending_.front());
      pending_.pop_front();
      pending_count_.fetch_sub(1);
    }
    run_in_turn(item);
  }
}

bool CpuQueue::outside_thread_may_run(const Item& item) const noexcept {
  switch (item.kind) {
    case Kind::program:
      return item.program->collectives.empty();
    case Kind::signal:
      return true;
    case Kind::wait:
      return false;
  }
  return false;
}

void CpuQueue::run_in_turn(const Item& item) {
  wait_for(item.seq - 1);
  runner_cpu_.store(util::current_cpu(), std::memory_order_relaxed);
  run(item);
  runner_cpu_.store(-1, std::memory_order_relaxed);
  completed_.store(item.seq);
  completed_.notify_all();
}

void CpuQueue::run(const Item& item) noexcept {
  switch (item.kind) {
    case Kind::program:
      if (!failed_.load()) {
        run_program(*item.program, item.command_ns);
      } else if (!item.program->collectives.empty()) {
        item.program->skip_collectives(0, last_failure_);
      }
      break;
    case Kind::signal:  // fires even after a failure, so waiters never hang
      std::const_pointer_cast<CpuEventState>(
          std::static_pointer_cast<const CpuEventState>(item.event))
          ->signal();
      break;
    case Kind::wait:
      item.event->wait();
      break;
  }
}

void CpuQueue::run_program(const Program& program, std::uint64_t* command_ns) noexcept {
  std::string what;
  const KernelThreadCap scope(kernel_cap_);
  const std::size_t ran = program.run(what, command_ns);
  if (ran == program.size()) return;
  try {
    const std::string where = program.trace ? fmt::format("command {} of {} in trace {}", ran,
                                                          program.size(), *program.trace)
                                            : std::string("eager");
    // error_ is written only here, before failed_ is set, and read only once failed_ is seen.
    error_ = fmt::format("op '{}' failed on {} ({}): {}", program.ops[ran], label_, where, what);
  } catch (...) {
    error_ = "a queued op failed";
  }
  last_failure_ = error_;
  failed_.store(true);
  program.skip_collectives(ran + 1, last_failure_);
}

bool CpuQueue::pop(Item& item) {
  (void)util::spin_while_idle([this] { return pending_count_.load() > 0; },
                              std::chrono::microseconds(spin_us_),
                              [this] { return util::on_this_cpu(submitter_cpu_); });
  std::unique_lock lock(mutex_);
  if (pending_.empty()) {
    work_cv_.wait(lock, [this] { return !pending_.empty() || stopping_; });
    if (pending_.empty()) return false;
  }
  item = std::move(pending_.front());
  pending_.pop_front();
  pending_count_.fetch_sub(1);
  return true;
}

void CpuQueue::worker_loop() {
  Item item;
  while (pop(item)) {
    wait_for(item.seq - 1);
    run(item);
    if (item.program && item.program.use_count() == 1) {
      // The submitting side drops finished programs (and frees their buffers) at its next
      // submission or synchronize: freeing here would contend with its allocations.
      std::lock_guard lock(mutex_);
      retired_.push_back(std::move(item.program));
    }
    const std::uint64_t seq = item.seq;
    item = Item{};
    completed_.store(seq);
    completed_.notify_all();
  }
}

}  // namespace retrace::cpu
