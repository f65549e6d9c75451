// The figures of merit of a case (see figures.hpp; definitions: docs/figures-of-merit.md).
#include "miniapp/run/figures.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>

#include "harness/output.hpp"
#include "harness/stats.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/predict/predict.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// One rep of one mode over the group: the slowest rank's step and its decomposition into
// the attention phases and the rest (step = attn + rest + tp_comm exactly), the same step
// without the attention and the all-reduce (tp_part: the TP collectives and the GEMMs beside
// them), and the event-based exposed times, each the largest over the ranks. The ranks end a step within nanoseconds of
// each other, so equal step times happen; the lowest rank of them is the slowest (the one
// rule every reader of the steps table applies), since their attention splits can differ.
struct Rep {
  int rank = -1;  // the slowest rank's (-1: no row yet)
  double step = 0, fwd = 0, bwd = 0, phases = 0, attn = 0, rest = 0, tp_part = 0;
  double attn_wait = 0, grad = 0, wait = 0, tp = 0;
  double grad_busy = 0;  // the collective thread's time on the all-reduces (NaN: none ran them)
};

std::map<cp::Mode, std::vector<Rep>> reps_by_mode(const std::vector<record::StepRow>& rows) {
  std::map<std::pair<int, int>, Rep> by;  // (mode, rep)
  for (const record::StepRow& r : rows) {
    Rep& x = by[{r.mode, r.rep}];
    if (x.rank < 0 || r.step_s > x.step || (r.step_s == x.step && r.rank < x.rank))
      x.rank = r.rank, x.step = r.step_s, x.fwd = r.forward_s, x.bwd = r.backward_s, x.phases = r.phases_s,
      x.attn = r.attn_s, x.rest = r.step_s - r.attn_s - r.tp_comm_s,
      x.tp_part = r.step_s - r.attn_s - r.grad_allreduce_s;
    x.attn_wait = std::max(x.attn_wait, r.attn_comm_wait_s);
    x.grad = std::max(x.grad, r.grad_allreduce_s);
    x.tp = std::max(x.tp, r.tp_comm_s);
    x.wait = std::max(x.wait, r.attn_comm_wait_s + r.grad_allreduce_s);
    x.grad_busy =
        std::isnan(r.grad_allreduce_busy_s) ? r.grad_allreduce_busy_s : std::max(x.grad_busy, r.grad_allreduce_busy_s);
  }
  std::map<cp::Mode, std::vector<Rep>> out;  // reps in rep order (the map is ordered)
  for (const auto& [key, rep] : by) out[all_modes().at(size_t(key.first))].push_back(rep);
  return out;
}

template <class F>
std::vector<double> field(const std::vector<Rep>& reps, F f) {
  std::vector<double> v;
  for (const Rep& r : reps) v.push_back(f(r));
  return v;
}

double max_of(const std::vector<double>& v) { return v.empty() ? kNaN : *std::max_element(v.begin(), v.end()); }
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? kNaN : s / double(v.size());
}

// One overlap figure (prefix "" for the whole step, "attn_", "grad_allreduce_") from the
// three modes' reps of one part of the step; NaN with the reason when it cannot be measured.
// comm_part: the part's time in comm-only mode (default: part itself).
void overlap_figures(record::Attrs& s, const std::string& prefix, const std::map<cp::Mode, std::vector<Rep>>& by,
                     double (*part)(const Rep&), bool talks, double (*comm_part)(const Rep&) = nullptr) {
  hn::Overlap ov = hn::not_measured(talks ? "needs the full, compute-only and comm-only modes" : "");
  const bool three = by.count(cp::Mode::Full) && by.count(cp::Mode::ComputeOnly) && by.count(cp::Mode::CommOnly);
  double t_comm = kNaN;
  if (talks && three) {
    t_comm = hn::median(field(by.at(cp::Mode::CommOnly), comm_part ? comm_part : part));
    ov = hn::paired_overlap(field(by.at(cp::Mode::Full), part), field(by.at(cp::Mode::ComputeOnly), part), t_comm);
  }
  s.real[prefix + "overlap"] = ov.overlap;
  s.real[prefix + "overlap_q1"] = ov.overlap_q1, s.real[prefix + "overlap_q3"] = ov.overlap_q3;
  s.real[prefix + "exposed_comm_s"] = ov.exposed_s;
  s.real[prefix + "comm_only_time_s"] = t_comm;
  std::string note = ov.unresolved;
  if (!std::isnan(ov.clamped_from)) {
    char b[160];
    std::snprintf(b, sizeof b, "set to %g from %.4f: within the noise (spread %.3g ms / comm %.3g ms)", ov.overlap,
                  ov.clamped_from, 1e3 * ov.spread_s, 1e3 * ov.comm_s);
    note = b;
  }
  s.text[prefix + "overlap_note"] = note;
}

void time_figures(record::Attrs& s, const Case& c, const std::map<cp::Mode, std::vector<Rep>>& by) {
  const std::vector<Rep> full = by.count(cp::Mode::Full) ? by.at(cp::Mode::Full) : std::vector<Rep>{};
  const std::vector<double> steps = field(full, [](const Rep& r) { return r.step; });
  const double t = hn::median(steps);
  // The median rep is one of the samples (the quartile rule): its slowest rank's forward and
  // backward, so forward + backward = measured_time_s.
  const auto med = std::find_if(full.begin(), full.end(), [t](const Rep& r) { return r.step == t; });
  const bool train = c.stack.pass == model::Pass::Train;
  s.real["measured_time_s"] = t;
  // Without a backward the step is the forward (its fence after the forward included).
  s.real["forward_time_s"] = med == full.end() ? kNaN : train ? med->fwd : med->step;
  s.real["backward_time_s"] = med == full.end() || !train ? kNaN : med->bwd;
  s.real["phase_coverage"] = med == full.end() ? kNaN : med->phases / med->step;
  s.real["compute_only_time_s"] =
      by.count(cp::Mode::ComputeOnly)
          ? hn::median(field(by.at(cp::Mode::ComputeOnly), [](const Rep& r) { return r.step; }))
          : kNaN;
  s.real["slowest_rep_ratio"] = hn::slowest_ratio(steps);
  s.real["comm_wait_s"] = hn::median(field(full, [](const Rep& r) { return r.wait; }));
  s.real["attn_comm_wait_s"] = hn::median(field(full, [](const Rep& r) { return r.attn_wait; }));
  s.real["grad_allreduce_exposed_s"] = hn::median(field(full, [](const Rep& r) { return r.grad; }));
  s.real["tp_comm_wait_s"] = hn::median(field(full, [](const Rep& r) { return r.tp; }));
}

// A bf16 layer's ceiling: its GEMM engine's (gemm<bf16>) and its attention tiles' (the bf16
// tile kernel, or the fp32 tiles while the bf16 attention widens to them).
double bf16_ceiling(const kernels::Bf16GemmCeiling& x, const kernels::GemmCeiling& f32) {
  return std::max({x.square, x.layer, x.tile > 0 ? x.tile : f32.tile});
}

void ceiling_figures(record::Attrs& s, const CaseResult& m, double t) {
  const kernels::GemmCeiling& b = m.before;
  const kernels::GemmCeiling& a = m.after;
  const double before = m.bf16 ? bf16_ceiling(m.bf16_before, b) : b.best();
  const double after = m.bf16 ? bf16_ceiling(m.bf16_after, a) : a.best();
  const double ceiling = std::max(before, after);
  s.real["gemm_ceiling_flops_per_s"] = ceiling;
  s.real["gemm_ceiling_before_flops_per_s"] = before;
  s.real["gemm_ceiling_after_flops_per_s"] = after;
  s.real["gemm_ceiling_before_age_s"] = m.before_age_s;
  s.real["sgemm_flops_per_s"] = std::max(b.blas_square, a.blas_square);
  s.real["blas_layer_gemm_flops_per_s"] = std::max(b.blas_layer, a.blas_layer);
  s.real["tile_gemm_flops_per_s"] = std::max(b.tile, a.tile);
  if (m.bf16) {
    s.real["bf16_gemm_flops_per_s"] = std::max(m.bf16_before.square, m.bf16_after.square);
    s.real["bf16_layer_gemm_flops_per_s"] = std::max(m.bf16_before.layer, m.bf16_after.layer);
    s.real["bf16_tile_gemm_flops_per_s"] = std::max(m.bf16_before.tile, m.bf16_after.tile);
  }
  s.real["layer_efficiency"] = m.useful_flops / t / ceiling;
}

void cp_efficiency(record::Attrs& s, const Case& c, const NoneTimes& none, int threads, double t) {
  // Against `none` of the same problem in this sweep (none_key): on the same total cores only (else
  // NaN); cp_efficiency_core_scaled assumes none would speed up linearly.
  double cpe = kNaN, scaled = kNaN;
  if (none.count(none_key(c))) {
    // `none` runs one sequence; a case with DP runs one per replica.
    const double tn = none.at(none_key(c)) * c.stack.mesh.dp();
    const int cores_case = c.stack.mesh.ranks() * threads, cores_none = threads;
    if (cores_case == cores_none) cpe = tn / t;
    scaled = tn * cores_none / (t * cores_case);
  }
  s.real["cp_efficiency"] = cpe;
  s.real["cp_efficiency_core_scaled"] = scaled;
  s.integer["cp_efficiency_measured"] = std::isnan(cpe) ? 0 : 1;
}

}  // namespace

std::string none_key(const std::string& pass, int64_t seq_len, int64_t decode_tokens, const std::string& documents) {
  return pass + "_" + std::to_string(seq_len) + (pass == "decode" ? "_T" + std::to_string(decode_tokens) : "") +
         (documents.empty() ? "" : "_docs" + documents);
}

std::string none_key(const Case& c) {
  return none_key(model::to_string(c.stack.pass), c.stack.attn.seq_len, c.stack.attn.decode_tokens, c.documents_label);
}

void message_sizes(record::Attrs& s, const Case& c, size_t elem) {
  s.integer["block_bytes_per_value"] = int64_t(elem);
  s.integer["partial_bytes_per_value"] = int64_t(kernels::acc_size(elem));
  s.integer["dkv_bytes_per_value"] = int64_t(cp::dkv_elem(c.stack.attn, elem));
  s.integer["grad_allreduce_bytes_per_value"] = int64_t(model::grad_allreduce_elem(c.stack, elem));
}

record::Attrs figures(const Case& c, const CaseResult& m, const NoneTimes& none, int threads) {
  record::Attrs s;
  auto& r = s.real;
  const auto by = reps_by_mode(m.steps);
  time_figures(s, c, by);
  const double t = r["measured_time_s"];
  r["useful_flops_per_s"] = m.useful_flops / t;
  double flops = 0;
  for (double f : m.exec_flops) flops += f;
  r["exec_flops_per_s"] = flops / t;
  r["tokens_per_s"] = m.tokens / t;
  ceiling_figures(s, m, t);
  r["bytes_sent_per_rank"] = mean_of(m.bytes), r["bytes_sent_max_rank"] = max_of(m.bytes);
  r["attn_bytes_sent_per_rank"] = mean_of(m.attn_bytes);
  r["grad_allreduce_bytes_per_rank"] = mean_of(m.grad_bytes);
  r["tp_bytes_sent_per_rank"] = mean_of(m.tp_bytes);
  r["imbalance"] = hn::imbalance(m.compute);
  r["flop_imbalance"] = hn::imbalance(m.exec_flops);
  // The mask's area as the scheme shares it out, and the bytes it needs moved (all layers):
  // the traffic's redundancy, NaN when it needs none.
  const bool train = c.stack.pass == model::Pass::Train, decode = c.stack.pass == model::Pass::Decode;
  // One CP group's share; the mesh runs tp x dp such groups (each TP rank its heads, each DP
  // replica its sequence), so the whole job's area and bytes are that many times the group's.
  const predict::MaskShare share = predict::mask_share(c.stack.attn, *c.info, m.elem, train);
  const double groups = double(c.stack.mesh.ranks() / c.stack.mesh.cp());
  double pairs = 0;
  for (double a : share.area) pairs += a;
  r["attention_area_pairs"] = groups * pairs;
  r["area_imbalance"] = hn::imbalance(share.area);
  const double need = decode ? 0 : groups * c.stack.shape.layers * share.needed_bytes;
  double sent = 0;
  for (double b : m.attn_bytes) sent += b;
  r["traffic_redundancy"] = need > 0 ? sent / need : kNaN;
  r["attn_bytes_needed_per_rank"] = decode ? kNaN : need / c.stack.mesh.ranks();
  overlap_figures(
      s, "", by, [](const Rep& x) { return x.step; }, max_of(m.bytes) > 0);
  overlap_figures(
      s, "attn_", by, [](const Rep& x) { return x.attn; }, max_of(m.attn_bytes) > 0);
  // The all-reduce's time alone is its own run time on the collective thread where one runs
  // it: in comm-only mode it overlaps the next layer's attention traffic, so the rest of the
  // step would understate it.
  const auto comm_only = by.find(cp::Mode::CommOnly);
  const bool busy = comm_only != by.end() && !std::isnan(comm_only->second.front().grad_busy);
  overlap_figures(
      s, "grad_allreduce_", by, [](const Rep& x) { return x.rest; }, max_of(m.grad_bytes) > 0,
      busy ? +[](const Rep& x) { return x.grad_busy; } : nullptr);
  overlap_figures(
      s, "tp_", by, [](const Rep& x) { return x.tp_part; }, max_of(m.tp_bytes) > 0);
  s.integer["overlap_measured"] = std::isnan(r["overlap"]) ? 0 : 1;
  cp_efficiency(s, c, none, threads, t);
  message_sizes(s, c, m.elem);
  s.text["units"] =
      "*_s: seconds; *_flops_per_s: FLOP/s; tokens_per_s: tokens/s; bytes_*: bytes per step; efficiencies, "
      "overlap, imbalance, ratios, phase_coverage: dimensionless";
  check_ranges(s);
  return s;
}

const std::vector<FigureRange>& figure_ranges() {
  static const char* kFraction = "not a fraction";
  static const char* kSlowerBeside =
      "the exposed time exceeds the comm-only time: communication cost more beside compute than alone (on busy "
      "cores the transport's copies compete with the kernels)";
  static const char* kFasterFull = "full-mode steps faster than compute-only ones by more than their noise";
  static const std::vector<FigureRange> ranges = {
      {"layer_efficiency", 0, 1, kFraction, "the GEMM ceiling is below the layer's own rate"},
      {"cp_efficiency", 0, 1, kFraction, "CP faster than the single-rank reference on the same cores"},
      {"cp_efficiency_core_scaled", 0, 1, kFraction, "CP faster than a linear share of the reference"},
      {"overlap", 0, 1, kSlowerBeside, kFasterFull},
      {"overlap_q1", 0, 1, kSlowerBeside, kFasterFull},
      {"overlap_q3", 0, 1, kSlowerBeside, kFasterFull},
      {"attn_overlap", 0, 1, kSlowerBeside, kFasterFull},
      {"attn_overlap_q1", 0, 1, kSlowerBeside, kFasterFull},
      {"attn_overlap_q3", 0, 1, kSlowerBeside, kFasterFull},
      {"grad_allreduce_overlap", 0, 1, kSlowerBeside, kFasterFull},
      {"grad_allreduce_overlap_q1", 0, 1, kSlowerBeside, kFasterFull},
      {"grad_allreduce_overlap_q3", 0, 1, kSlowerBeside, kFasterFull},
      {"tp_overlap", 0, 1, kSlowerBeside, kFasterFull},
      {"tp_overlap_q1", 0, 1, kSlowerBeside, kFasterFull},
      {"tp_overlap_q3", 0, 1, kSlowerBeside, kFasterFull},
      {"imbalance", 1, kInf, "max below mean", ""},
      {"flop_imbalance", 1, kInf, "max below mean", ""},
      {"area_imbalance", 1, kInf, "max below mean", ""},
      {"traffic_redundancy", 0, kInf, "negative bytes", ""},
      {"slowest_rep_ratio", 1, kInf, "max below median", ""},
      {"phase_coverage", 0.99, 1.01, "time outside every phase", "phases longer than the step"},
  };
  return ranges;
}

namespace {
// The catalog itself: constant data, in the order the docs list it.
constexpr FigureInfo kFigures[] = {
    // times of a step (the slowest rank of the median full-mode rep unless said)
    {"measured_time_s", "s", "median full-mode step time of the slowest rank", true},
    {"forward_time_s", "s", "the forward part of the median rep's step (slowest rank)", true},
    {"backward_time_s", "s", "the backward part of the median rep's step (NaN without a backward)", true},
    {"compute_only_time_s", "s", "median compute-only step time (communication skipped)", true},
    {"comm_only_time_s", "s", "median comm-only step time (compute skipped)", true},
    {"measured_<phase>_s", "s", "the median rep's time in one phase of the layer (timing table)", false},
    {"phase_coverage", "1", "the phases' sum over the step time", true},
    {"slowest_rep_ratio", "1", "the slowest full-mode rep over the median one", true},
    // rates
    {"useful_flops_per_s", "FLOP/s", "useful FLOPs of all layers per step over the step time", true},
    {"exec_flops_per_s", "FLOP/s", "executed FLOPs (whole computed tiles) per second", true},
    {"tokens_per_s", "tokens/s", "tokens of one step (train, prefill: S; decode: T) over the step time", true},
    {"layer_efficiency", "1", "useful FLOP/s over the GEMM ceiling", true},
    {"gemm_ceiling_flops_per_s", "FLOP/s", "the case's GEMM ceiling: the larger of the readings before and after",
     true},
    {"gemm_ceiling_before_flops_per_s", "FLOP/s", "the GEMM ceiling read before the case", true},
    {"gemm_ceiling_after_flops_per_s", "FLOP/s", "the GEMM ceiling read after the case", true},
    {"gemm_ceiling_before_age_s", "s", "age of the reading before the case (a young one is reused)", true},
    {"sgemm_flops_per_s", "FLOP/s", "BLAS SGEMM 2048^3 of the case's ranks together (a ceiling component)", true},
    {"blas_layer_gemm_flops_per_s", "FLOP/s", "BLAS SGEMM at the layer's largest GEMM shape (0 in a bf16 case)", true},
    {"tile_gemm_flops_per_s", "FLOP/s", "the attention tile kernel's products (a ceiling component)", true},
    {"bf16_gemm_flops_per_s", "FLOP/s", "bf16 case: gemm<bf16> 2048^3", false},
    {"bf16_layer_gemm_flops_per_s", "FLOP/s", "bf16 case: gemm<bf16> at the layer's largest GEMM shape", false},
    {"bf16_tile_gemm_flops_per_s", "FLOP/s", "bf16 case: the bf16 attention tiles' products", false},
    // CP
    {"cp_efficiency", "1", "T(none) / T(scheme) on the same total cores (NaN on others)", true},
    {"cp_efficiency_measured", "flag", "1 when cp_efficiency is a number (none of the same problem, same cores)",
     false},
    {"cp_efficiency_core_scaled", "1", "T(none) x its cores / (T(scheme) x the case's cores): none scaled linearly",
     true},
    {"imbalance", "1", "max / mean over ranks of the per-rank compute time", true},
    {"flop_imbalance", "1", "max / mean over ranks of the executed FLOPs", true},
    {"area_imbalance", "1",
     "max / mean over ranks of the visible (query, key) pairs each rank's attention computes (the mask's area as "
     "the scheme shares it out; its schedule, counted)",
     true},
    {"attn_bytes_needed_per_rank", "B",
     "the bytes the mask needs moved (traffic_redundancy's denominator) per rank and step; 0: no rank's queries see "
     "another rank's keys, so every attention byte sent is redundant; NaN for decode",
     false},
    {"traffic_redundancy", "1",
     "attention bytes sent over the bytes the mask needs moved: each key another rank's queries see, its K and V "
     "once to that rank (and its dK and dV back, train); NaN when none is needed (one rank, decode)",
     false},
    {"attention_area_pairs", "pairs",
     "visible (query, key) pairs of one forward's attention over every rank and query head: the mask's area times the "
     "heads and the DP replicas",
     true},
    // communication
    {"block_bytes_per_value", "B/value", "bytes per value of K/V/Q blocks, activations and Ulysses' exchanges", false},
    {"partial_bytes_per_value", "B/value", "bytes per value of partial results and LSEs", false},
    {"dkv_bytes_per_value", "B/value", "bytes per value of travelling dK/dV accumulators (run.dkv_accumulator)", false},
    {"grad_allreduce_bytes_per_value", "B/value", "bytes per value of the weight-gradient all-reduce", false},
    {"bytes_sent_per_rank", "B", "bytes that left a rank per step, mean over ranks (comm::bytes_leaving)", true},
    {"bytes_sent_max_rank", "B", "bytes that left the rank that sent most, per step", true},
    {"attn_bytes_sent_per_rank", "B", "the attention's bytes per step and rank", true},
    {"grad_allreduce_bytes_per_rank", "B", "the weight-gradient all-reduce's bytes per step and rank", true},
    {"tp_bytes_sent_per_rank", "B",
     "the tensor-parallel collectives' bytes per step and rank (all-gathers and reduce-scatters, or all-reduces; 0 "
     "without TP)",
     true},
    {"overlap", "1", "1 - exposed / T_comm of the whole step (paired reps)", true},
    {"overlap_q1", "1", "first quartile of the whole step's overlap", true},
    {"overlap_q3", "1", "third quartile of the whole step's overlap", true},
    {"exposed_comm_s", "s", "full minus compute-only step time, median over paired reps", true},
    {"overlap_note", "text", "why the step's overlap is NaN where it could have been measured", true},
    {"overlap_measured", "flag", "1 when the step's overlap was resolved", false},
    {"attn_overlap", "1", "overlap of the attention's traffic (phases attn_compute + attn_comm)", true},
    {"attn_overlap_q1", "1", "first quartile of attn_overlap", true},
    {"attn_overlap_q3", "1", "third quartile of attn_overlap", true},
    {"attn_exposed_comm_s", "s", "the attention's exposed communication, median over paired reps", true},
    {"attn_comm_only_time_s", "s", "the attention's time in comm-only mode", true},
    {"attn_overlap_note", "text", "why attn_overlap is NaN where it could have been measured", true},
    {"attn_comm_wait_s", "s", "event-based: the attention's time blocked waiting, per step", true},
    {"grad_allreduce_overlap", "1", "overlap of the weight-gradient all-reduce", true},
    {"grad_allreduce_overlap_q1", "1", "first quartile of grad_allreduce_overlap", true},
    {"grad_allreduce_overlap_q3", "1", "third quartile of grad_allreduce_overlap", true},
    {"grad_allreduce_exposed_comm_s", "s", "the all-reduce's exposed time, median over paired reps", true},
    {"grad_allreduce_comm_only_time_s", "s", "the all-reduce's own time in comm-only mode", true},
    {"grad_allreduce_overlap_note", "text", "why grad_allreduce_overlap is NaN where it could have been measured",
     true},
    {"grad_allreduce_exposed_s", "s", "event-based: time blocked waiting for the all-reduce, per step", true},
    {"tp_overlap", "1",
     "overlap of the tensor-parallel collectives (the step without its attention and all-reduce phases; "
     "run.tp_overlap)",
     true},
    {"tp_overlap_q1", "1", "first quartile of tp_overlap", true},
    {"tp_overlap_q3", "1", "third quartile of tp_overlap", true},
    {"tp_exposed_comm_s", "s", "the tensor-parallel collectives' exposed time, median over paired reps", true},
    {"tp_comm_only_time_s", "s", "the tensor-parallel collectives' time in comm-only mode", true},
    {"tp_overlap_note", "text", "why tp_overlap is NaN where it could have been measured", true},
    {"tp_comm_wait_s", "s",
     "phase tp_comm: the time posting and waiting for the tensor-parallel collectives per step, the rank that spent "
     "most, median over full reps",
     true},
    {"comm_wait_s", "s", "event-based: both exposed times together, per step", true},
    // checks
    {"out_of_range", "text", "each figure outside its range, with the reason (empty: none)", true},
    {"figures_in_range", "flag", "1 when every figure with a range is inside it", true},
    {"clock_uncertainty_s", "s", "uncertainty of the events' aligned times", false},
    {"clock_drift", "1", "|d offset / d t| of the ranks' clocks", false},
    // model
    {"predicted_time_s", "s", "the performance model's step time (NaN without a calibration table)", false},
    {"predicted_forward_time_s", "s", "the model's forward time", false},
    {"predicted_backward_time_s", "s", "the model's backward time", false},
    {"predicted_<phase>_s", "s", "the model's time in one phase of the layer", false},
    {"prediction_ratio", "1", "predicted over measured step time", false},
    {"prediction_rate_scale", "1", "the drift scale the prediction applied (the case's SGEMM over the table's)", false},
    {"prediction_note", "text", "what the model approximated, or why there is no prediction", false},
    {"units", "text", "the units of the summary in words", true},
};
}  // namespace

const std::vector<FigureInfo>& figure_catalog() {
  static const std::vector<FigureInfo> all(std::begin(kFigures), std::end(kFigures));
  return all;
}

namespace {
// The range of the figure named `name`; nullptr for one without.
const FigureRange* range_of(const char* name) {
  for (const FigureRange& r : figure_ranges())
    if (r.name == std::string(name)) return &r;
  return nullptr;
}
std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

std::string figure_catalog_json(int indent) {
  hn::Json all = hn::Json::array();
  for (const FigureInfo& f : figure_catalog()) {
    hn::Json range = nullptr;  // JSON has no infinity: an open end is null
    if (const FigureRange* r = range_of(f.name))
      range = {r->lo, std::isinf(r->hi) ? hn::Json(nullptr) : hn::Json(r->hi)};
    all.push_back(
        {{"name", f.name}, {"unit", f.unit}, {"range", range}, {"definition", f.definition}, {"required", f.required}});
  }
  return all.dump(indent);
}

std::string figure_catalog_text() {
  std::string out;
  for (const FigureInfo& f : figure_catalog()) {
    std::string range;
    if (const FigureRange* r = range_of(f.name))
      range = " in [" + number(r->lo) + ", " + (std::isinf(r->hi) ? std::string("inf") : number(r->hi)) + "]";
    out += std::string(f.name) + " [" + f.unit + "]" + range + ": " + f.definition + "\n";
  }
  return out;
}

std::string check_ranges(record::Attrs& s) {
  // "a=-0.5, b=-0.7 (below [0, 1]: why); c=1.2 (above [0, 1]: why)": figures that are out
  // for the same reason share it.
  std::vector<std::pair<std::string, std::string>> groups;  // (bound and reason, figures)
  for (const FigureRange& rg : figure_ranges()) {
    const auto it = s.real.find(rg.name);
    if (it == s.real.end() || std::isnan(it->second)) continue;
    const double v = it->second;
    if (v >= rg.lo && v <= rg.hi) continue;
    char fig[96], why[512];
    std::snprintf(fig, sizeof fig, "%s=%.4g", rg.name, v);
    std::snprintf(why, sizeof why, "%s [%g, %g]: %s", v < rg.lo ? "below" : "above", rg.lo, rg.hi,
                  v < rg.lo ? rg.below : rg.above);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == why; });
    if (g == groups.end()) g = groups.insert(groups.end(), {why, ""});
    g->second += (g->second.empty() ? "" : ", ") + std::string(fig);
  }
  std::string out;
  for (const auto& [why, figs] : groups) out += (out.empty() ? "" : "; ") + figs + " (" + why + ")";
  s.text["out_of_range"] = out;
  s.integer["figures_in_range"] = out.empty() ? 1 : 0;
  return out;
}

}  // namespace minicp::run
