// Figures of merit (definitions and the quartile rule in stats.hpp).
#include "harness/stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

double spread(std::vector<double> v) {
  if (v.size() < size_t(kSpreadSamples)) return kNaN;
  if (v.size() >= size_t(kQuartileSamples)) {
    const Quartiles q = quartiles(std::move(v));
    return q.q3 - q.q1;
  }
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

double slowest_ratio(const std::vector<double>& v) {
  if (v.size() < size_t(kSlowestSamples)) return kNaN;
  return *std::max_element(v.begin(), v.end()) / median(v);
}

bool Overlap::measured() const { return !std::isnan(overlap); }

Overlap not_measured(const std::string& why) {
  Overlap o;
  o.unresolved = why;
  return o;
}

namespace {
std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g ms", 1e3 * s);
  return b;
}
}  // namespace

Overlap paired_overlap(const std::vector<double>& full, const std::vector<double>& compute, double t_comm) {
  if (full.size() != compute.size())
    throw std::invalid_argument("paired_overlap: " + std::to_string(full.size()) + " full and " +
                                std::to_string(compute.size()) + " compute-only samples");
  if (full.empty()) return not_measured("no full / compute-only pairs");
  if (!(t_comm > 0)) return not_measured("comm-only time is zero");
  const double noise = spread(full);
  Overlap o = not_measured();
  o.comm_s = t_comm, o.spread_s = noise;
  std::vector<double> diff(full.size());
  for (size_t i = 0; i < full.size(); ++i) diff[i] = full[i] - compute[i];
  const Quartiles d = quartiles(diff);
  o.exposed_s = d.median;  // reported even when the overlap is not resolved
  if (std::isnan(noise)) {
    o.unresolved = "one rep: the spread of the full-mode reps cannot be estimated";
    return o;
  }
  if (t_comm <= noise) {
    o.unresolved = "comm-only time " + ms(t_comm) + " is within the spread " + ms(noise) + " of the full-mode reps";
    return o;
  }
  o.overlap = 1.0 - d.median / t_comm;
  if (diff.size() >= size_t(kQuartileSamples)) o.overlap_q1 = 1.0 - d.q3 / t_comm, o.overlap_q3 = 1.0 - d.q1 / t_comm;
  const double band = noise / t_comm;
  auto to_bound = [band](double& x) {  // x within its noise of [0, 1]: set to the bound
    const double b = std::clamp(x, 0.0, 1.0);
    if (b == x || !(std::abs(b - x) <= band)) return false;
    x = b;
    return true;
  };
  const double raw = o.overlap;
  if (to_bound(o.overlap)) o.clamped_from = raw;
  to_bound(o.overlap_q1), to_bound(o.overlap_q3);
  return o;
}

double imbalance(const std::vector<double>& x) {
  if (x.empty()) return kNaN;
  double mx = x[0], sum = 0;
  for (double e : x) mx = std::max(mx, e), sum += e;
  return sum > 0 ? mx / (sum / double(x.size())) : 1.0;
}

}  // namespace minicp::harness
