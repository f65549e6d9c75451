// Aligned clocks: putting every rank's MPI_Wtime on rank 0's clock.
//
// Each process's MPI_Wtime has its own origin (MPI_WTIME_IS_GLOBAL is false in Open MPI;
// Open MPI 4.1 starts each process's MPI_Wtime at 0 on its first call), and on different
// hosts the clocks also run at slightly different rates. Per-rank traces (event t_begin /
// t_end in MPI_Wtime seconds) are mapped to rank 0's clock with an offset measured here:
//
//     t_on_rank0 = t_local + offset_s
//
// Method (Cristian's algorithm). Rank 0 serves the other ranks one at a time. For rank r,
// after a few warm-up exchanges, `rounds` exchanges of one small message each way: r reads
// its clock (t0), sends to rank 0, rank 0 reads its own clock (T) and sends T back, r reads
// its clock again (t1). The exchange with the smallest round trip rtt = t1 - t0 is kept:
//
//     offset_s      = T - (t0 + t1) / 2
//     uncertainty_s = rtt_min / 2
//
// Error bound: rank 0 read T at some instant between r's two readings t0 and t1, so the
// true offset lies in [T - t1, T - t0], i.e. within +- rtt_min / 2 of the estimate, whatever
// the two directions of the path cost. This needs only that the clocks do not drift
// noticeably during one exchange (a few microseconds). Assumption behind taking the
// midpoint: the path is symmetric (a message takes as long from r to 0 as back); then the
// actual error is much smaller than the bound. The smallest round trip is the exchange
// least disturbed by the scheduler or other traffic, so it gives the tightest bound.
//
// Drift: two measurements (at start-up and at the end of a run) give a ClockModel that
// interpolates the offset linearly in local time. Assumption: each clock runs at a
// constant rate between the two measurements. Then inside the interval the error of
// to_root() stays within the larger of the two uncertainties; outside it grows by the
// drift error, at most (u_start + u_end) / (t_end - t_start), per second of distance to
// the nearer measurement.
//
// Sign convention: drift() = d offset / d t_local = (rate of rank 0's clock) / (rate of the
// local clock) - 1. It is negative when the local clock runs fast: a local clock that runs
// 1e-4 faster than rank 0's has drift -1e-4 / (1 + 1e-4) ~ -1e-4.
//
// Traffic: point-to-point on the given communicator with the tag kClockTag only; the
// caller runs no other traffic with that tag during the measurement. Ranks that wait for
// their turn (and ranks done before the others) poll with 50 us sleeps rather than spin,
// so on an oversubscribed node the two ranks that exchange get the cores; inside an
// exchange a rank spins 5 us for the message, then yields the CPU between polls, so two
// ranks that share one core still exchange in about 10 us instead of a time slice. Cost:
// about (rounds + warm-up) x (P - 1) round trips, each under a microsecond to about 10 us
// on one host.
#pragma once
#include <mpi.h>

#include <functional>
#include <vector>

namespace minicp::harness {

// The only tag measure_offset uses on its communicator.
constexpr int kClockTag = 32013;
// Warm-up exchanges per rank before the measured ones (not used in the estimate).
constexpr int kClockWarmup = 3;

struct ClockSync {
  double offset_s;       // t_on_rank0 = t_local + offset_s
  double uncertainty_s;  // the true offset lies within offset_s +- uncertainty_s (rtt_min_s / 2)
  double rtt_min_s;      // the smallest round trip seen (local clock)
  double t_local;        // local time the estimate belongs to (midpoint of that round trip)
};

// Collective over comm: every rank returns its own estimate; rank 0 returns offset 0 and
// uncertainty 0 (its t_local: its clock when the measurement started). `rounds` exchanges
// per rank after kClockWarmup warm-ups (the same value on every rank; rank 0's decides).
// `now` is the clock to align: MPI_Wtime unless a test wraps it (an empty function also
// means MPI_Wtime). rounds < 1: std::invalid_argument before any message is sent.
ClockSync measure_offset(MPI_Comm comm, int rounds = 100, std::function<double()> now = MPI_Wtime);

// Collective: every rank's ClockSync on rank 0 (index = rank), an empty vector elsewhere.
std::vector<ClockSync> gather_offsets(MPI_Comm comm, const ClockSync& mine);

// Offset of one rank from two measurements, e.g. one at start-up and one at the end.
struct ClockModel {
  ClockSync start, end;

  // (end.offset_s - start.offset_s) / (end.t_local - start.t_local), dimensionless; 0 when
  // both measurements have the same t_local. Sign: see "Sign convention" above.
  double drift() const;
  // Bound on the error of drift(): (start.uncertainty_s + end.uncertainty_s) / interval.
  double drift_uncertainty() const;
  // t_local on rank 0's clock: t_local + offset, the offset interpolated linearly between the
  // two measurements (extrapolated outside them).
  double to_root(double t_local) const;
  // max(start.uncertainty_s, end.uncertainty_s): the bound of to_root() between the two
  // measurements (outside, add drift_uncertainty() times the distance to the nearer one).
  double uncertainty_s() const;
};

}  // namespace minicp::harness
