// Figures of merit (definitions and the quartile rule in stats.hpp).
#include "harness/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace minicp::harness {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

Quartiles quartiles(std::vector<double> v) {
  if (v.empty()) return {kNaN, kNaN, kNaN};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {v[n / 4], v[n / 2], v[(3 * n) / 4]};
}

double median(std::vector<double> v) { return quartiles(std::move(v)).median; }

bool Overlap::measured() const { return !std::isnan(overlap); }

Overlap not_measured() { return {kNaN, kNaN, kNaN, kNaN}; }

Overlap paired_overlap(const std::vector<double>& full, const std::vector<double>& compute, double t_comm) {
  if (full.size() != compute.size())
    throw std::invalid_argument("paired_overlap: " + std::to_string(full.size()) + " full and " +
                                std::to_string(compute.size()) + " compute-only samples");
  if (full.empty() || !(t_comm > 0)) return not_measured();
  std::vector<double> diff(full.size());
  for (size_t i = 0; i < full.size(); ++i) diff[i] = full[i] - compute[i];
  const Quartiles d = quartiles(diff);
  return {d.median, 1.0 - d.median / t_comm, 1.0 - d.q3 / t_comm, 1.0 - d.q1 / t_comm};
}

double imbalance(const std::vector<double>& x) {
  if (x.empty()) return kNaN;
  double mx = x[0], sum = 0;
  for (double e : x) mx = std::max(mx, e), sum += e;
  return sum > 0 ? mx / (sum / double(x.size())) : 1.0;
}

}  // namespace minicp::harness
