// The stall watchdog. A rank stopped for good (SIGSTOP, a frozen node, a kernel that never
// returns) leaves every other rank waiting in its next collective for ever, rank 0 spinning in
// MPI at 100% and nothing said. With the watchdog on, a thread on every rank sends rank 0 a
// heartbeat about once a second, and at once when its rank starts a new case, over its own
// duplicate of the communicator (so it never matches the program's messages) with where its
// rank is: the case, the rep and a step counter that each progress() call advances. Rank 0's
// thread ends the job with one message and MPI_Abort when
//   - a rank has sent nothing for longer than the limit (stopped, or its node is gone), or
//   - no rank at all has advanced for longer than the limit (a hang in which every rank still
//     beats, e.g. a deadlock): it names the rank that advanced least recently.
// A rank that waits on others (at a barrier, outside a case's group) still beats, and the
// others advance, so a normal run never trips it as long as the limit is longer than the
// longest stretch between two progress() calls of the busiest rank. Cost: one small message
// per rank per second (a look at two counters ten times a second) and a probe on rank 0 four
// times a second.
//
// Needs MPI_THREAD_MULTIPLE (harness::main asks for it); without it start() leaves it off.
#pragma once
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace minicp::harness {

class Watchdog {
 public:
  // Where a rank was, for the message: its (case index, rep) as given to progress(), and the
  // case rank 0 is at (the ranks end each case together, so the cases before it are done) ->
  // the rest of the sentence after "made no progress for N s ", e.g. "in case X, rep 0;
  // ending the job".
  using Where = std::function<std::string(int64_t case_index, int64_t rep, int64_t root_case)>;

  // The process's watchdog (the driver and the code it calls report to the same one).
  static Watchdog& instance();
  ~Watchdog();

  // Collective over comm. limit_s <= 0 leaves it off (progress() is then a store, stop() a
  // no-op). prog starts the message ("minicp: rank 1 ...").
  void start(MPI_Comm comm, int64_t limit_s, Where where, std::string prog);
  // This rank is at (case_index, rep); every call advances its step counter. Any thread.
  void progress(int64_t case_index, int64_t rep) {
    case_.store(case_index, std::memory_order_relaxed);
    rep_.store(rep, std::memory_order_relaxed);
    step_.fetch_add(1, std::memory_order_relaxed);
  }
  // Collective over the communicator of start(): every rank's last heartbeat is delivered,
  // the threads end, the communicator is freed.
  void stop();
  bool running() const { return comm_ != MPI_COMM_NULL; }

 private:
  struct Seen {           // what rank 0 knows of a rank
    int64_t beat[3];      // case, rep, step of its last heartbeat
    double heard, moved;  // when it last beat, when its step last changed (s, steady clock)
  };
  Watchdog() = default;
  bool wait_for_stop(int ms);
  void beat_loop();   // ranks > 0
  void watch_loop();  // rank 0
  void check(const std::vector<Seen>& seen, double now) const;
  [[noreturn]] void end_job(int rank, const Seen& s, double now) const;

  std::atomic<int64_t> case_{-1}, rep_{-1}, step_{0};
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double limit_s_ = 0;
  Where where_;
  std::string prog_;
  std::vector<std::string> hosts_;  // rank 0: each rank's host
  int64_t out_[3] = {0, 0, 0};      // the heartbeat in flight (ranks > 0)
  MPI_Request pending_ = MPI_REQUEST_NULL;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace minicp::harness
