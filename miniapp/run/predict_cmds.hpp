// The performance model's commands of minicp (--calibrate, --predict, --advise, --against)
// and the model's part of a run (a calibration at start-up, a prediction per case).
#pragma once
#include <string>
#include <vector>

#include "harness/main.hpp"
#include "miniapp/predict/calibration_measure.hpp"
#include "miniapp/predict/predict.hpp"
#include "miniapp/record/results.hpp"
#include "miniapp/run/deck.hpp"

namespace minicp::comm {
class Communicator;
}

namespace minicp::run {

struct Plan;

struct PredictOptions {
  bool calibrate = false, predict = false, advise = false;
  std::string calibration;  // --calibration FILE: the table read (or, with --calibrate, written)
  std::string against;      // --against FILE.h5: compare the predictions with a results file
  int ranks_per_node = 0;   // --ranks-per-node (0: the fabric's rule)
  int threads = 0;          // --threads (0: the table's)
  int gpus = 0;             // --gpus (--advise): rank every mesh tp x cp of this many ranks (0: the deck's)
  bool any() const { return calibrate || predict || advise; }
};

// Rows per rank of a case's layers: its tokens over its ranks (decode: the new tokens).
int64_t rows_of(const Case& c);

// What the calibration of a deck measures: its shape, rows per rank and precision, and the
// blocking collectives its cases' schedules and TP layers wait for, laid out ranks_per_node
// to a node.
predict::CalibrationPlan calibration_plan(const Deck& d, const std::vector<Case>& cases, int ranks_per_node);

// The machine a deck's cases are predicted on: the table's rates at `threads`, the links of
// the deck's fabric (the table's rows for it, else the profile's [link] figures), the ranks
// laid out ranks_per_node to a node. Throws harness::UsageError naming what is missing.
predict::Machine machine_for(const Deck& d, const predict::Calibration& cal, int threads, int ranks_per_node);

// The commands: each prints on rank 0 and returns (the caller ends the program).
void run_calibrate(const harness::Args& a, const Plan& p, comm::Communicator& world);
void run_predict(const Plan& p);
void run_advise(const Plan& p);

// A case's prediction as summary attributes (predicted_time_s, predicted_<phase>_s, ...)
// beside the measured ones; NaN with prediction_note when the table cannot predict it.
void prediction_figures(record::Attrs& s, const Case& c, const predict::Machine& m, const Deck& d,
                        const double measured_phase_s[], double group_sgemm_flops_per_s);

}  // namespace minicp::run
