// What a run tells: the record of the platform and of each case (HDF5 attributes: what a
// reader needs to reproduce or explain a number), the printed per-case table, the ETA, and
// the start-up line.
#pragma once
#include <string>

#include "comm/comm.hpp"
#include "harness/blas.hpp"
#include "harness/main.hpp"
#include "miniapp/record/results.hpp"
#include "miniapp/run/driver.hpp"
#include "miniapp/run/measure.hpp"

namespace minicp::run {

// How the ranks' communicators are made (recorded as such).
struct ProgressSettings {
  comm::Progress progress = comm::Progress::Thread;
  int poll_us = 50;  // the progress thread's poll interval
  std::string cpus;  // its CPUs ("" = not pinned)
};

// The root attributes: build, BLAS, CPU, environment, binding, launcher, MPI, hosts, deck.
// Collective over MPI_COMM_WORLD (every rank's CPU affinity is gathered).
record::Attrs platform_attrs(const harness::Args& a, const Plan& p, const comm::Communicator& world,
                             const harness::BlasInfo& blas, const ProgressSettings& prog);

// A case's attributes: scheme, pass, mask, status, seq_len, ranks, every setting of its scheme
// as it ran (a default rule resolved on the case's communicator topology), and the deck keys
// whose rows are case attributes (deck_keys(): dtype, the shape, reps, warmup, ...).
record::Attrs case_attrs(const Case& c, const Deck& d, const comm::Topology& topo);

// The case's lines of the human table (rank 0).
void print_case(const Case& c, const record::Attrs& summary, const CaseResult& m);
// Both of a case's reports: its lines for the user (print_case, unless quiet), and its token of
// the closing MINICP line (summary_token), returned.
std::string report_case(const Case& c, const record::Attrs& summary, const CaseResult& m, bool quiet);

// One token of the closing MINICP line: "<pass>_<scheme>_S<S>_P<P>=<layer efficiency>".
std::string summary_token(const Case& c, const record::Attrs& summary);

// Remaining time, weighting each case by its useful FLOPs x reps x modes (the time model a
// case's cost follows) and scaling by the seconds the cases done so far took.
class Eta {
 public:
  Eta(const Plan& p, const std::vector<const Case*>& todo);
  // Called when case c starts; returns "" before any case is done, else " ETA 12.3 s".
  std::string start(const Case& c, double elapsed_s);

 private:
  double cost(const Case& c) const;
  const Plan& p_;
  double left_ = 0, done_ = 0, prev_ = 0;
};

}  // namespace minicp::run
