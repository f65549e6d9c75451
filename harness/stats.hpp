// The figures of merit computed from measured samples, defined once here for every program
// (minicp-cp-bench today, the driver later), so a figure means the same everywhere.
//
// Quartile rule: sort the n samples; Q1, the median and Q3 are the samples at 0-based
// indices floor(n/4), floor(n/2) and floor(3n/4) (no interpolation; for even n the median
// is the upper of the two middle samples). A figure that cannot be measured (no samples,
// overlap without all three modes, T_comm <= 0) is NaN, written as null in JSON and left
// out of summary lines; never a sentinel such as -1.
#pragma once
#include <vector>

namespace minicp::harness {

struct Quartiles {
  double q1, median, q3;
};

// By the rule above; all NaN for no samples.
Quartiles quartiles(std::vector<double> samples);
double median(std::vector<double> samples);

// Overlap of communication with compute from paired repetitions: rep i ran `full` (time
// full[i]) and `compute-only` (compute[i]) back to back, so their difference cancels slow
// drifts of a shared machine.
//   exposed    = median_i(full[i] - compute[i])          (seconds of comm not hidden)
//   overlap    = 1 - exposed / t_comm                    (t_comm: median comm-only time)
//   overlap_q1 = 1 - Q3(full - compute) / t_comm,  overlap_q3 = 1 - Q1(...) / t_comm
struct Overlap {
  double exposed_s, overlap, overlap_q1, overlap_q3;
  bool measured() const;  // false: all NaN
};
Overlap not_measured();
// NaN figures when there are no pairs or t_comm <= 0; std::invalid_argument when the pair
// lists differ in length.
Overlap paired_overlap(const std::vector<double>& full, const std::vector<double>& compute, double t_comm);

// Load imbalance of per-rank values = max / mean (1 = balanced). All zero: 1 (nothing to
// balance); no values: NaN.
double imbalance(const std::vector<double>& per_rank);

}  // namespace minicp::harness
