// The stall watchdog (see watchdog.hpp).
#include "harness/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace minicp::harness {

namespace {

constexpr int kBeat = 1, kBye = 2;  // tags on the watchdog's own communicator
constexpr double kBeatS = 1.0;      // a rank's heartbeat period
constexpr int kPollMs = 100;        // a thread's look at its spot and its messages: a new case is sent at once
constexpr int kByePollMs = 10;      // the same while stopping (the goodbyes come within milliseconds)
constexpr double kAwayS = 2.0;      // a pause of the thread this long is its own rank's
constexpr int kHostLen = 256;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Each rank's host name on rank 0 (for the message), rank 0's on the others (rank 1 names it).
std::vector<std::string> gather_hosts(MPI_Comm comm, int rank, int size) {
  char mine[kHostLen] = {};
  if (::gethostname(mine, kHostLen - 1) != 0) mine[0] = '?';
  std::vector<char> all(rank == 0 ? size_t(size) * kHostLen : 1);
  MPI_Gather(mine, kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, 0, comm);
  MPI_Bcast(mine, kHostLen, MPI_CHAR, 0, comm);
  if (rank != 0) return {mine};
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.emplace_back(all.data() + size_t(r) * kHostLen);
  return hosts;
}

// MINICP_TEST_STOP="RANK:POINT[:CASE]" (watchdog.hpp); rank < 0: unset or not of that form.
struct TestStop {
  int rank = -1;
  std::string point;
  int64_t case_index = -1;
};
TestStop test_stop_from_env() {
  const char* v = std::getenv("MINICP_TEST_STOP");
  TestStop t;
  if (!v) return t;
  const std::string s = v;
  const size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || a == 0) return t;
  try {
    t.point = s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    if (b != std::string::npos) t.case_index = std::stoll(s.substr(b + 1));
    t.rank = std::stoi(s.substr(0, a));
  } catch (const std::exception&) {
    t.rank = -1;
  }
  return t;
}

}  // namespace

Watchdog& Watchdog::instance() {
  static Watchdog w;
  return w;
}

Watchdog::~Watchdog() { abandon(); }

void Watchdog::set(int first, std::initializer_list<int64_t> v) {
  int i = first;
  for (int64_t x : v) spot_[i++].store(x, std::memory_order_relaxed);
  for (; i < kFields; ++i) spot_[i].store(-1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Watchdog::start(MPI_Comm comm, int64_t limit_s, Where where, std::string prog) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (limit_s <= 0 || level < MPI_THREAD_MULTIPLE || running()) return;
  MPI_Comm_dup(comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  limit_s_ = double(limit_s);
  where_ = std::move(where);
  prog_ = std::move(prog);
  hosts_ = gather_hosts(comm_, rank_, size_);
  stopping_ = abandoning_ = false;
  thread_ = std::thread([this] { run_loop(); });
}

bool Watchdog::wait_for_stop(int ms) {
  std::unique_lock<std::mutex> l(mutex_);
  return wake_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void Watchdog::send_beat(int to, int tag) {
  for (int i = 0; i < kFields; ++i) out_[i] = spot_[i].load(std::memory_order_relaxed);
  out_[kFields] = count_.load(std::memory_order_relaxed);
  MPI_Isend(out_, kBeatLen, MPI_INT64_T, to, tag, comm_, &pending_);
}

// Takes every heartbeat and goodbye that has come from `from` (a rank or MPI_ANY_SOURCE);
// returns how many goodbyes.
int Watchdog::receive(std::vector<Seen>& seen, int from) {
  int byes = 0;
  for (int flag = 1; flag;) {
    MPI_Status st;
    MPI_Iprobe(from, MPI_ANY_TAG, comm_, &flag, &st);
    if (!flag) break;
    int64_t b[kBeatLen];
    MPI_Recv(b, kBeatLen, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, comm_, MPI_STATUS_IGNORE);
    Seen& s = seen[size_t(st.MPI_SOURCE)];
    const double t = now_s();
    if (b[kFields] != s.beat[kFields]) s.moved = t;
    std::copy(b, b + kBeatLen, s.beat);
    s.heard = t;
    if (st.MPI_TAG == kBye) s.gone = true, ++byes;
  }
  return byes;
}

// Ranks > 0 beat to rank 0, rank 0 to rank 1; rank 0 watches every rank, rank 1 rank 0. Once
// stopping, each says goodbye instead and watches on until each rank it watches has said its own.
void Watchdog::run_loop() {
  const double t0 = now_s();
  std::vector<Seen> seen(size_t(size_), Seen{{-1, -1, -1, -1, -1, -1, -1, -1}, t0, t0, false});
  const int to = rank_ == 0 ? 1 : 0;
  int byes_due = rank_ == 0 ? size_ - 1 : rank_ == 1 ? 1 : 0;
  bool said_bye = size_ == 1;
  double sent_at = -1e300, looked = t0;
  int64_t pending_ask = 0;  // the test_stop request the heartbeat in flight answers
  for (bool stopping = false;;) {
    if (!stopping)
      stopping = wait_for_stop(kPollMs);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(kByePollMs));
    if (abandoning_) return;
    // This rank was itself stopped (or not run) meanwhile: it heard nothing then, through no
    // fault of the others (e.g. continued by the launcher's SIGCONT as the job ends).
    const double gap = now_s() - looked;
    looked += gap;
    if (gap > kAwayS)
      for (Seen& s : seen) s.heard += gap, s.moved += gap;
    int done = 1;
    if (pending_ != MPI_REQUEST_NULL) MPI_Test(&pending_, &done, MPI_STATUS_IGNORE);
    if (done) flushed_.store(pending_ask);
    const int64_t ask = flush_asked_.load();
    const bool due = spot_[0].load() != out_[0] || now_s() - sent_at >= kBeatS || ask > pending_ask;
    if (done && !said_bye && (stopping || due)) {  // one heartbeat in flight at a time
      send_beat(to, stopping ? kBye : kBeat);
      said_bye = stopping, sent_at = now_s(), pending_ask = ask;
    }
    if (rank_ <= 1 && size_ > 1) byes_due -= receive(seen, rank_ == 0 ? MPI_ANY_SOURCE : 0);
    if (said_bye && pending_ == MPI_REQUEST_NULL && byes_due == 0) return;
    if (rank_ == 0) {  // its own spot, as if it had beaten
      Seen& own = seen[0];
      const int64_t c = count_.load();
      if (c != own.beat[kFields]) own.moved = now_s();
      for (int i = 0; i < kFields; ++i) own.beat[i] = spot_[i].load();
      own.beat[kFields] = c, own.heard = now_s();
    }
    check(seen, now_s());
  }
}

void Watchdog::check(const std::vector<Seen>& seen, double now) const {
  if (rank_ == 1) {
    if (!seen[0].gone && now - seen[0].heard > limit_s_) end_job(0, seen[0], now);
    return;
  }
  if (rank_ != 0) return;
  int silent = -1, oldest = 0;
  bool all_still = true;
  for (int r = 0; r < size_; ++r) {
    const Seen& s = seen[size_t(r)];
    if (s.gone) continue;
    if (now - s.heard > limit_s_ && (silent < 0 || s.heard < seen[size_t(silent)].heard)) silent = r;
    if (now - s.moved <= limit_s_) all_still = false;
    if (s.moved < seen[size_t(oldest)].moved) oldest = r;
  }
  if (silent >= 0) end_job(silent, seen[size_t(silent)], now);
  if (all_still) end_job(oldest, seen[size_t(oldest)], now);
}

void Watchdog::end_job(int rank, const Seen& s, double now) const {
  const int64_t* b = s.beat;
  const Spot at{b[0], b[1], b[2], b[3], b[4], b[5], b[6]};
  const int64_t root_case = rank_ == 0 ? spot_[0].load() : b[0];  // rank 1 names rank 0
  const std::string msg = prog_ + ": rank " + std::to_string(rank) + " (host " + hosts_[size_t(rank)] +
                          ") made no progress for " + std::to_string(int64_t(now - s.moved)) + " s " +
                          (where_ ? where_(at, root_case) : "; ending the job");
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void Watchdog::stop() {
  if (!running()) return;
  {
    std::lock_guard<std::mutex> l(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  MPI_Comm_free(&comm_);
}

void Watchdog::abandon() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mutex_);
    stopping_ = abandoning_ = true;
  }
  wake_.notify_all();
  thread_.join();
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized && pending_ != MPI_REQUEST_NULL) MPI_Request_free(&pending_);
  comm_ = MPI_COMM_NULL;  // left to MPI_Finalize: freeing it would wait for the other ranks
}

void Watchdog::test_stop(const char* point) {
  static const TestStop armed = test_stop_from_env();
  static std::atomic<bool> stopped{false};
  if (armed.rank < 0 || armed.point != point) return;
  if (armed.case_index >= 0 && spot_[0].load() != armed.case_index) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != armed.rank || stopped.exchange(true)) return;
  // Where this rank is must reach its watcher first (a heartbeat may be a second old).
  const int64_t ask = flush_asked_.fetch_add(1) + 1;
  for (int i = 0; running() && flushed_.load() < ask && i < 500; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::raise(SIGSTOP);
}

}  // namespace minicp::harness
