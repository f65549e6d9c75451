// The figures of merit computed from measured samples, defined once here for every program
// (minicp-cp-bench today, the driver later), so a figure means the same everywhere.
//
// Quartile rule: sort the n samples; Q1, the median and Q3 are the samples at 0-based
// indices floor(n/4), floor(n/2) and floor(3n/4) (no interpolation; for even n the median
// is the upper of the two middle samples). A figure that cannot be measured (no samples,
// overlap without all three modes, T_comm <= 0) is NaN, written as null in JSON and left
// out of summary lines; never a sentinel such as -1.
#pragma once
#include <limits>
#include <string>
#include <vector>

namespace minicp::harness {

struct Quartiles {
  double q1, median, q3;
};

// By the rule above; all NaN for no samples.
Quartiles quartiles(std::vector<double> samples);
double median(std::vector<double> samples);

// How many samples a figure needs before it means something (fewer: NaN, with the reason
// where the figure has one). Quartiles: 5, so that neither Q1 nor Q3 is the smallest or the
// largest sample. The slowest sample against the median: 3, so that the median is not the
// slowest sample itself. A spread: 2.
constexpr int kQuartileSamples = 5, kSlowestSamples = 3, kSpreadSamples = 2;

// The spread of samples: Q3 - Q1 with kQuartileSamples or more, max - min with fewer (at
// least 2), NaN below that.
double spread(std::vector<double> samples);

// The slowest sample over the median (>= 1): a stall shows as a large ratio. NaN with fewer
// than kSlowestSamples samples.
double slowest_ratio(const std::vector<double>& samples);

// Overlap of communication with compute from paired repetitions: rep i ran `full` (time
// full[i]) and `compute-only` (compute[i]) back to back, so their difference cancels slow
// drifts of a shared machine.
//   exposed    = median_i(full[i] - compute[i])          (seconds of comm not hidden)
//   overlap    = 1 - exposed / t_comm                    (t_comm: median comm-only time)
//   overlap_q1 = 1 - Q3(full - compute) / t_comm,  overlap_q3 = 1 - Q1(...) / t_comm
// Resolution: the full-mode reps scatter by spread(full); when t_comm is not larger than that
// spread, the noise of the step is larger than the communication and the overlap is NaN with
// the reason in `unresolved`. A resolved estimate outside [0, 1] by no more than its noise
// (spread / t_comm) is consistent with the bound and set to it (`clamped_from` keeps the raw
// value; the quartiles are treated alike); one outside by more is left as it is, for the
// range check to flag.
struct Overlap {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  double exposed_s = kNaN, overlap = kNaN, overlap_q1 = kNaN, overlap_q3 = kNaN;
  double comm_s = kNaN, spread_s = kNaN;  // t_comm and spread(full)
  double clamped_from = kNaN;             // the raw overlap when it was set to a bound
  std::string unresolved;                 // "" or why overlap is NaN
  bool measured() const;                  // false: overlap NaN (exposed_s is still the median difference)
};
Overlap not_measured(const std::string& why = "");
// NaN figures (with the reason) when there are no pairs, t_comm <= 0 or it is not resolved;
// quartiles NaN below kQuartileSamples pairs; std::invalid_argument when the pair lists
// differ in length.
Overlap paired_overlap(const std::vector<double>& full, const std::vector<double>& compute, double t_comm);

// Load imbalance of per-rank values = max / mean (1 = balanced). All zero: 1 (nothing to
// balance); no values: NaN.
double imbalance(const std::vector<double>& per_rank);

}  // namespace minicp::harness
