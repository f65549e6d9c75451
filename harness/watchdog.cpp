// The stall watchdog (see watchdog.hpp).
#include "harness/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace minicp::harness {

namespace {

constexpr int kBeat = 1, kBye = 2;  // tags on the watchdog's own communicator
constexpr double kBeatS = 1.0;      // a rank's heartbeat period
constexpr int kPollMs = 100;        // a rank's look at its progress: a new case is sent at once
constexpr int kWatchMs = 250;       // rank 0's look at the heartbeats
constexpr int kHostLen = 256;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Each rank's host name, on rank 0 (for the message).
std::vector<std::string> gather_hosts(MPI_Comm comm, int rank, int size) {
  char mine[kHostLen] = {};
  if (::gethostname(mine, kHostLen - 1) != 0) mine[0] = '?';
  std::vector<char> all(rank == 0 ? size_t(size) * kHostLen : 1);
  MPI_Gather(mine, kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, 0, comm);
  std::vector<std::string> hosts;
  for (int r = 0; rank == 0 && r < size; ++r) hosts.emplace_back(all.data() + size_t(r) * kHostLen);
  return hosts;
}

}  // namespace

Watchdog& Watchdog::instance() {
  static Watchdog w;
  return w;
}

Watchdog::~Watchdog() {
  // Never stopped (the run ended by an error): end the thread and leave MPI alone.
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
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
  stopping_ = false;
  thread_ = std::thread([this] { rank_ == 0 ? watch_loop() : beat_loop(); });
}

bool Watchdog::wait_for_stop(int ms) {
  std::unique_lock<std::mutex> l(mutex_);
  return wake_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void Watchdog::beat_loop() {
  double sent_at = 0;
  while (!wait_for_stop(kPollMs)) {
    if (case_.load() == out_[0] && now_s() - sent_at < kBeatS) continue;
    int done = 1;
    if (pending_ != MPI_REQUEST_NULL) MPI_Test(&pending_, &done, MPI_STATUS_IGNORE);
    if (!done) continue;  // rank 0 has not taken the last one yet: send no more until it does
    out_[0] = case_.load(), out_[1] = rep_.load(), out_[2] = step_.load();
    MPI_Isend(out_, 3, MPI_INT64_T, 0, kBeat, comm_, &pending_);
    sent_at = now_s();
  }
}

void Watchdog::watch_loop() {
  const double t0 = now_s();
  std::vector<Seen> seen(size_t(size_), Seen{{-1, -1, -1}, t0, t0});
  auto note = [&](int r, const int64_t* b, double t) {
    Seen& s = seen[size_t(r)];
    if (b[2] != s.beat[2]) s.moved = t;
    std::copy(b, b + 3, s.beat);
    s.heard = t;
  };
  while (!wait_for_stop(kWatchMs)) {
    for (int flag = 1; flag;) {
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kBeat, comm_, &flag, &st);
      if (!flag) break;
      int64_t b[3];
      MPI_Recv(b, 3, MPI_INT64_T, st.MPI_SOURCE, kBeat, comm_, MPI_STATUS_IGNORE);
      note(st.MPI_SOURCE, b, now_s());
    }
    const int64_t own[3] = {case_.load(), rep_.load(), step_.load()};
    note(0, own, now_s());
    check(seen, now_s());
  }
}

void Watchdog::check(const std::vector<Seen>& seen, double now) const {
  int silent = -1, oldest = 0;
  bool all_still = true;
  for (int r = 0; r < size_; ++r) {
    const Seen& s = seen[size_t(r)];
    if (now - s.heard > limit_s_ && (silent < 0 || s.heard < seen[size_t(silent)].heard)) silent = r;
    if (now - s.moved <= limit_s_) all_still = false;
    if (s.moved < seen[size_t(oldest)].moved) oldest = r;
  }
  if (silent >= 0) end_job(silent, seen[size_t(silent)], now);
  if (all_still) end_job(oldest, seen[size_t(oldest)], now);
}

void Watchdog::end_job(int rank, const Seen& s, double now) const {
  const std::string msg = prog_ + ": rank " + std::to_string(rank) + " (host " + hosts_[size_t(rank)] +
                          ") made no progress for " + std::to_string(int64_t(now - s.moved)) + " s " +
                          (where_ ? where_(s.beat[0], s.beat[1], case_.load()) : "; ending the job");
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
  // Every rank's heartbeats, then its goodbye (in that order: one sender's messages on one
  // communicator are not reordered), so nothing is left in flight when the communicator goes.
  int64_t b[3] = {0, 0, 0};
  if (rank_ == 0) {
    for (int byes = 0; byes < size_ - 1;) {
      MPI_Status st;
      MPI_Recv(b, 3, MPI_INT64_T, MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &st);
      byes += st.MPI_TAG == kBye ? 1 : 0;
    }
  } else {
    MPI_Wait(&pending_, MPI_STATUS_IGNORE);
    MPI_Send(b, 3, MPI_INT64_T, 0, kBye, comm_);
  }
  MPI_Comm_free(&comm_);
}

}  // namespace minicp::harness
