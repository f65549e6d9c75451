// Aligned clocks (method, assumptions and error bound in clock.hpp).
#include "harness/clock.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include <sched.h>

namespace minicp::harness {

namespace {

// While a rank waits for its turn, or for the others to finish, it tests its request
// between short sleeps instead of spinning in a blocking call, leaving the cores to the
// two ranks that exchange (the ranks may outnumber the cores).
constexpr auto kPollSleep = std::chrono::microseconds(50);

void wait_sleeping(MPI_Request* request) {
  int done = 0;
  MPI_Test(request, &done, MPI_STATUS_IGNORE);
  while (!done) {
    std::this_thread::sleep_for(kPollSleep);
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
  }
}

// Waits for one exchange message: tests the request in a loop, and after kSpin without it
// also yields the CPU between tests. On separate cores the reply comes within the spin
// (a round trip well under a microsecond on shared memory); when the two ranks share a
// core, the yield lets the other one run instead of spinning through a whole time slice.
constexpr auto kSpin = std::chrono::microseconds(5);

void wait_yielding(MPI_Request* request) {
  int done = 0;
  MPI_Test(request, &done, MPI_STATUS_IGNORE);
  if (done) return;
  const auto spin_end = std::chrono::steady_clock::now() + kSpin;
  while (!done) {
    if (std::chrono::steady_clock::now() > spin_end) sched_yield();
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
  }
}

}  // namespace

ClockSync measure_offset(MPI_Comm comm, int rounds, std::function<double()> now) {
  if (rounds < 1) throw std::invalid_argument("measure_offset: rounds " + std::to_string(rounds) + ": must be >= 1");
  if (!now) now = [] { return MPI_Wtime(); };
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  ClockSync mine{0.0, 0.0, 0.0, 0.0};
  char empty = 0;
  if (rank == 0) {
    mine.t_local = now();
    const int exchanges = kClockWarmup + rounds;
    for (int r = 1; r < size; ++r) {
      // Rank r's turn: the count of exchanges, then one reply with rank 0's time per ping.
      MPI_Send(&exchanges, 1, MPI_INT, r, kClockTag, comm);
      for (int i = 0; i < exchanges; ++i) {
        MPI_Request ping;
        MPI_Irecv(&empty, 0, MPI_BYTE, r, kClockTag, comm, &ping);
        wait_yielding(&ping);
        const double t_root = now();
        MPI_Send(&t_root, 1, MPI_DOUBLE, r, kClockTag, comm);
      }
    }
  } else {
    int exchanges = 0;
    MPI_Request turn;
    MPI_Irecv(&exchanges, 1, MPI_INT, 0, kClockTag, comm, &turn);
    wait_sleeping(&turn);
    double best_rtt = std::numeric_limits<double>::infinity();
    for (int i = 0; i < exchanges; ++i) {
      double t_root = 0.0;
      MPI_Request reply;
      MPI_Irecv(&t_root, 1, MPI_DOUBLE, 0, kClockTag, comm, &reply);  // posted before the ping
      const double t0 = now();
      MPI_Send(&empty, 0, MPI_BYTE, 0, kClockTag, comm);
      wait_yielding(&reply);
      const double t1 = now();
      const double rtt = t1 - t0;
      if (i < kClockWarmup || !(rtt < best_rtt)) continue;
      best_rtt = rtt;
      mine.t_local = 0.5 * (t0 + t1);
      mine.offset_s = t_root - mine.t_local;
      mine.rtt_min_s = rtt;
      mine.uncertainty_s = 0.5 * rtt;
    }
  }
  // Nobody returns (and starts other traffic) before every rank has had its turn.
  MPI_Request all_done;
  MPI_Ibarrier(comm, &all_done);
  wait_sleeping(&all_done);
  return mine;
}

std::vector<ClockSync> gather_offsets(MPI_Comm comm, const ClockSync& mine) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::array<double, 4> packed{mine.offset_s, mine.uncertainty_s, mine.rtt_min_s, mine.t_local};
  std::vector<double> all(rank == 0 ? 4 * size_t(size) : 0);
  MPI_Gather(packed.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, comm);
  std::vector<ClockSync> out;
  if (rank != 0) return out;
  out.reserve(size_t(size));
  for (int r = 0; r < size; ++r) {
    const double* p = all.data() + 4 * size_t(r);
    out.push_back({p[0], p[1], p[2], p[3]});
  }
  return out;
}

double ClockModel::drift() const {
  const double dt = end.t_local - start.t_local;
  return dt == 0.0 ? 0.0 : (end.offset_s - start.offset_s) / dt;
}

double ClockModel::drift_uncertainty() const {
  const double dt = std::abs(end.t_local - start.t_local);
  const double u = start.uncertainty_s + end.uncertainty_s;
  if (dt == 0.0) return u == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return u / dt;
}

double ClockModel::to_root(double t_local) const {
  return t_local + start.offset_s + drift() * (t_local - start.t_local);
}

double ClockModel::uncertainty_s() const { return std::max(start.uncertainty_s, end.uncertainty_s); }

}  // namespace minicp::harness
