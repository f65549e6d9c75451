// Measuring one case on its CP group: warm-up, then reps x modes interleaved (full,
// compute-only, comm-only, full, ...), every rank's raw step times, phases, events and memory,
// and the GEMM ceiling of the layer efficiency around the case. With run.rounds > 1 a case is
// measured once per round (the run's rounds interleave the cases) and its rows accumulate.
// What the figures of merit need is gathered to the group's rank 0 (figures.hpp turns it into
// the summary).
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/ceiling.hpp"
#include "miniapp/predict/calibration.hpp"
#include "miniapp/record/results.hpp"
#include "miniapp/run/driver.hpp"

namespace minicp::run {

// The modes in the order the tables number them (mode column: index here).
const std::vector<cp::Mode>& all_modes();
int mode_code(cp::Mode m);

// What a rank of a run is doing: the stall watchdog's phase code (Watchdog::Spot::phase),
// named in its message by stage_words. Set at each stage of start-up, of a case and of the end.
enum class Stage : int64_t {
  StartUp,
  Clocks,
  Ceiling,
  AttentionPaths,
  Calibrating,
  Calibrate,
  OpeningFile,
  LayerRows,
  SettingUp,
  CaseCeiling,
  Reps,
  Dump,
  Gathering,
  Writing,
  Finishing
};
void at(Stage s);
// "at start-up: measuring the SGEMM ceiling"; a case's stage: "setting it up" (its words
// follow the case's id), "" for a rep (numbered by the caller) and for a code out of range.
std::string stage_words(int64_t code);
bool stage_of_case(int64_t code);

// The GEMM ceiling per group size, reused while it is fresh. A machine's GEMM rate drifts
// (10-15% over tens of seconds on the development VM), so a measurement older than
// kFreshSeconds is taken again; within that window short cases share one, which keeps the
// measurement from costing more than the cases it serves. Whether to measure is group rank
// 0's decision, broadcast, so a group measures as one. Components that depend on the case
// (the layer's largest GEMM shape) are keyed by that shape as well.
class CeilingCache {
 public:
  static constexpr double kFreshSeconds = 30;
  struct Reading {
    kernels::GemmCeiling rates;     // this rank's, FLOP/s
    kernels::Bf16GemmCeiling bf16;  // this rank's bf16 engines (bf16 cases only; else zeros)
    double taken = 0;               // MPI_Wtime() when taken (this rank's clock)
  };
  // This rank's ceiling for a case of `ranks` ranks whose layer's largest GEMM is `shape`
  // (an empty shape: the BLAS square and tile components only); bf16: also the bf16 engines'
  // components (gemm<bf16> 2048^3 and at the shape, the bf16 tile kernel), and not SGEMM at
  // the shape, which a bf16 layer does not run.
  Reading get(MPI_Comm group, int ranks, kernels::GemmShape shape, bool bf16 = false);

 private:
  struct Timed {
    double rate = 0, taken = -1e300;
  };
  // The reading under key, measured again when stale.
  const Timed& component(MPI_Comm g, const std::vector<int64_t>& key, const std::function<double()>& measure);
  std::map<std::vector<int64_t>, Timed> cache_;
};

// One case's results. Every rank: its own rows, as the results file records them, and its
// full-mode samples; the group's rank 0, after the last round: the group's gathered inputs of
// the figures (figures.hpp).
struct CaseResult {
  record::CaseRecord record;                                                            // this rank's rows
  std::vector<double> rep_compute, rep_flops, rep_bytes, rep_grad_bytes, rep_tp_bytes;  // this rank's, per full rep
  std::vector<record::StepRow> steps;                                                   // every rank's (gathered)
  // per rank, full mode, median over reps: bytes = attn_bytes + grad_bytes + tp_bytes
  std::vector<double> compute, exec_flops, bytes, attn_bytes, grad_bytes, tp_bytes;
  double useful_flops = 0, tokens = 0;
  kernels::GemmCeiling before, after;                // summed over the group's ranks (FLOP/s)
  kernels::Bf16GemmCeiling bf16_before, bf16_after;  // the same, of the bf16 engines (bf16 cases)
  bool bf16 = false;                                 // a bf16 case: its ceiling is of the bf16 engines
  size_t elem = sizeof(float);                       // bytes per stored value of the case
  double before_age_s = 0;                           // how old the reading before the case was when it started
  model::PhaseTimes fwd_phases, bwd_phases;          // rank 0, all layers, the last full rep (the printed table)
  std::string start_utc, end_utc;
};

// Runs round `round` (0 .. run.rounds-1) of case c on comm (the case's CP group; every member
// calls), appending its reps to out (rep numbers continue over the rounds); the last round
// also reduces them to the figures' inputs. dump: when not empty, one more full-mode step
// written there (--dump) after the first round.
void measure_case(const Plan& p, const Case& c, comm::Communicator& comm, const std::string& dump,
                  CeilingCache& ceiling, CaseResult& out, int round);

// The calibration's layer rows (predict::LayerTime): for each row count and rank count P of the
// plan's cases, one such case's layers in compute-only mode on the first P ranks of `world`
// at once (collective over world; the others wait): the seconds of a layer's phases other
// than attention, forward and backward, of the slowest rank, and the seconds of the layer's
// GEMMs each in its own loop, timed between those steps, in `pieces` pieces whose median
// layer-over-GEMMs ratio is kept. Decode cases give forward-only rows (backward 0) at their
// decode_tokens rows. Appended to `out` on rank 0.
void measure_layer_rows(const Plan& p, comm::Communicator& world, predict::Calibration& out, int pieces = 3);

// Useful FLOPs of one step of a case over the whole problem (docs/figures-of-merit.md): what the
// layer efficiency and the ETA weigh a case by.
double step_useful_flops(const Case& c);

std::string iso_time_utc();

}  // namespace minicp::run
