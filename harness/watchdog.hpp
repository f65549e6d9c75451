// The stall watchdog. A rank stopped for good (SIGSTOP, a frozen node, a kernel that never
// returns) leaves every other rank waiting in its next collective for ever, rank 0 spinning in
// MPI at 100% and nothing said. With the watchdog on, a thread on every rank sends a heartbeat
// about once a second, and at once when its rank starts a new case, over its own duplicate of
// the communicator (so it never matches the program's messages), with where its rank is (its
// Spot: the case, the rep, the program's phase, the layer, the pass, the part of the layer and
// the scheme's step) and a counter that every change of the spot advances. Ranks > 0 beat to
// rank 0, rank 0 to rank 1. Rank 0's thread ends the job with one message and MPI_Abort when
//   - a rank has sent nothing for longer than the limit (stopped, or its node is gone), or
//   - no rank at all has advanced for longer than the limit (a hang in which every rank still
//     beats, e.g. a deadlock): it names the rank that advanced least recently;
// rank 1's thread does the same when rank 0 has sent nothing for longer than the limit (rank 0's
// own thread stops with its process, so another rank must watch it; MPI_Abort from rank 1 ends
// the stopped rank 0 too). A rank waiting on others (at a barrier, outside a case's group)
// still beats, and the others advance, so a normal run never trips it as long as the limit is
// longer than the longest stretch without a change of spot on the busiest rank. stop() is
// watched too: each thread says goodbye and watches on until every rank it watches has said
// its own. Cost: one small message per rank per second, a look at the spot (and on ranks 0 and
// 1 a probe) ten times a second, a few relaxed stores per change of spot. minicp starts it at
// the top of its run, before the run's first collective (miniapp/run/driver.cpp, execute()).
//
// Needs MPI_THREAD_MULTIPLE (harness::main asks for it); without it start() leaves it off.
//
// For the tests only: MINICP_TEST_STOP="RANK:POINT[:CASE]" makes world rank RANK stop itself
// (SIGSTOP, after its watchdog has sent where it is) the first time it reaches the named point
// (test_stop(POINT)), in case index CASE if given. Unset, test_stop() is one load and a branch.
#pragma once
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace minicp::harness {

class Watchdog {
 public:
  // Where a rank is, in the program's codes (-1: not given). `phase` is the program's own code
  // of what it is doing; `part` the part of the layer (e.g. the program's phase of a layer),
  // `pass` 0 forward, 1 backward, `step` the scheme's step inside the part.
  struct Spot {
    int64_t case_index = -1, rep = -1, phase = -1, layer = -1, pass = -1, part = -1, step = -1;
  };
  // The rest of the sentence after "made no progress for N s ", e.g. "in case X, rep 0, layer
  // 1 backward (attention step 1); ending the job", from the stalled rank's spot and the case
  // rank 0 is at (the ranks end each case together, so the cases before it are done).
  using Where = std::function<std::string(const Spot& at, int64_t root_case)>;

  // The process's watchdog (the driver and the code it calls report to the same one).
  static Watchdog& instance();
  ~Watchdog();

  // Collective over comm. limit_s <= 0 leaves it off (the setters are then stores, stop() a
  // no-op). prog starts the message ("minicp: rank 1 ...").
  void start(MPI_Comm comm, int64_t limit_s, Where where, std::string prog);
  // Collective over the communicator of start(): every rank's goodbye is delivered, the
  // threads end, the communicator is freed. Watched until then.
  void stop();
  // Ends the thread without a word to the other ranks (the run ends by an error; MPI may be
  // finalised). A no-op once stopped.
  void abandon();
  bool running() const { return comm_ != MPI_COMM_NULL; }

  // The setters: any thread; each advances the rank's counter. A setter clears the fields
  // below its own (a new rep has no layer yet, a new layer no part).
  void progress(int64_t case_index, int64_t rep, int64_t phase) { set(0, {case_index, rep, phase}); }
  void phase(int64_t code) { set(kPhase, {code}); }
  void layer(int64_t layer, int64_t pass) { set(kLayer, {layer, pass}); }
  void part(int64_t part) { set(kPart, {part}); }
  void step(int64_t step) { set(kStep, {step}); }
  // The same spot, one step further (a loop of timed calls, a piece of a long measurement).
  void tick() { count_.fetch_add(1, std::memory_order_relaxed); }

  // For the tests (see above): stops this process here when MINICP_TEST_STOP names it.
  void test_stop(const char* point);

 private:
  static constexpr int kPhase = 2, kLayer = 3, kPart = 5, kStep = 6, kFields = 7;
  static constexpr int kBeatLen = kFields + 1;  // the spot and the counter
  struct Seen {                                 // what a watching rank knows of a rank
    int64_t beat[kBeatLen];                     // its last heartbeat
    double heard, moved;                        // when it last beat, when its counter last changed
    bool gone;                                  // it said goodbye: no longer watched
  };
  Watchdog() = default;
  void set(int first, std::initializer_list<int64_t> v);
  bool wait_for_stop(int ms);
  void run_loop();
  void send_beat(int to, int tag);
  int receive(std::vector<Seen>& seen, int from);
  void check(const std::vector<Seen>& seen, double now) const;
  [[noreturn]] void end_job(int rank, const Seen& s, double now) const;

  std::atomic<int64_t> spot_[kFields] = {-1, -1, -1, -1, -1, -1, -1};
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> flush_asked_{0}, flushed_{0};  // test_stop: a heartbeat asked for, sent
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double limit_s_ = 0;
  Where where_;
  std::string prog_;
  std::vector<std::string> hosts_;  // rank 0: each rank's host; rank 1: rank 0's (first)
  int64_t out_[kBeatLen] = {};      // the heartbeat in flight
  MPI_Request pending_ = MPI_REQUEST_NULL;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> abandoning_{false};
};

// The watchdog over a scope: started on construction, stopped by stop() (both collective);
// an exception that leaves the scope first abandons it (the run ends by an error).
class Watched {
 public:
  Watched(MPI_Comm comm, int64_t limit_s, Watchdog::Where where, std::string prog) {
    Watchdog::instance().start(comm, limit_s, std::move(where), std::move(prog));
  }
  ~Watched() { Watchdog::instance().abandon(); }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
  void stop() { Watchdog::instance().stop(); }
};

}  // namespace minicp::harness
