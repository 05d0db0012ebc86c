// CpuQueue: one in-order command queue of the CPU device.
//
// Work is a sequence of items (programs, event signals, event waits), each with a sequence
// number; items run strictly in that order, on the queue's worker thread or on a calling thread
// that waits for its turn (blocking submissions run on the caller: handing work to another core
// costs microseconds). Eager commands collect in an open batch that is handed over when it is
// full, when the worker is idle, or at any synchronisation point. While capturing, commands are
// appended to the trace's program instead.
//
// A command that throws fails the queue: the error is kept (sticky) and reported once by
// take_error(); programs queued behind it are skipped, event signals still fire.
#pragma once

#include "cpu/program.hpp"
#include "cpu/variant.hpp"
#include "retrace/backend.hpp"
#include "retrace/cpu.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace retrace::cpu {

class CpuEventState final : public retrace::detail::EventState {
 public:
  [[nodiscard]] bool is_complete() const override { return done_.load() != 0; }
  void wait() const override;
  void signal() noexcept;

 private:
  std::atomic<std::uint32_t> done_{0};
};

class CpuQueue {
 public:
  // `label` names the queue in errors; `thread_name` its worker thread (util/thread_name.hpp).
  CpuQueue(std::string label, std::string thread_name, const CpuDeviceOptions& options,
           const KernelVariant& kernels);
  ~CpuQueue();  // drains the queue, then stops the worker
  CpuQueue(const CpuQueue&) = delete;
  CpuQueue& operator=(const CpuQueue&) = delete;

  void enqueue(const KernelLaunch& launch);
  // Returns the program's sequence number; Blocking::yes returns after it ran.
  // With command_ns (program->size() entries) the submission is blocking and each command's
  // time is added to its entry.
  std::uint64_t submit(std::shared_ptr<const Program> program, Blocking blocking,
                       std::uint64_t* command_ns = nullptr);
  void signal(std::shared_ptr<CpuEventState> event);
  void wait(std::shared_ptr<const retrace::detail::EventState> event);
  void wait_idle();
  // Waits until item `seq` (and everything before it) ran. wait_for only waits; finish_through,
  // for threads other than the worker, first runs the items up to `seq` that the worker has not
  // taken yet (see help_until).
  void wait_for(std::uint64_t seq) const;
  void finish_through(std::uint64_t seq);
  // The sticky error, cleared as it is returned.
  [[nodiscard]] std::optional<std::string> take_error();

  void begin_capture(TraceId trace);
  [[nodiscard]] std::shared_ptr<Program> end_capture();

 private:
  enum class Kind : std::uint8_t { program, signal, wait };
  struct Item {
    Kind kind;
    std::uint64_t seq;
    std::shared_ptr<const Program> program;
    std::shared_ptr<const retrace::detail::EventState> event;
    std::uint64_t* command_ns = nullptr;  // programs: time each command into this
  };

  std::uint64_t push_locked(Item item);
  void flush_locked();
  void run_in_turn(const Item& item);
  void help_until(std::uint64_t seq);
  [[nodiscard]] bool outside_thread_may_run(const Item& item) const noexcept;
  void run(const Item& item) noexcept;
  void run_program(const Program& program, std::uint64_t* command_ns) noexcept;
  void worker_loop();
  bool pop(Item& item);
  void record_command(Program& program, const KernelLaunch& launch, KernelFn fn);

  std::string label_;
  const KernelVariant& kernels_;
  ExecutionMode mode_;
  std::uint32_t eager_batch_;
  std::uint32_t spin_us_;
  int kernel_cap_;  // kernel_threads: at most this many threads per kernel (0: no cap)

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<Item> pending_;
  std::shared_ptr<Program> open_batch_;
  std::shared_ptr<Program> capture_;
  std::vector<std::shared_ptr<const Program>> retired_;
  std::uint64_t next_seq_ = 1;
  bool stopping_ = false;
  std::string error_;
  // The latest failure, kept for the peers of skipped collectives (take_error clears error_).
  // Written and read only by the thread running the queue's items, in item order.
  std::string last_failure_;

  std::atomic<std::size_t> pending_count_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<bool> failed_{false};
  // Where spinning is futile (util::spin_while_idle): the CPU of the thread that last handed an
  // item over (the worker waits for the next from it), and of the thread running an item (-1
  // between items; waiters for its completion).
  std::atomic<int> submitter_cpu_{-1};
  std::atomic<int> runner_cpu_{-1};
  std::thread worker_;
};

}  // namespace retrace::cpu
