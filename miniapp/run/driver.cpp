// The minicp driver (see driver.hpp).
#include "miniapp/run/driver.hpp"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <memory>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/clock.hpp"
#include "harness/memory.hpp"
#include "harness/memtrack.hpp"
#include "harness/output.hpp"
#include "harness/stats.hpp"
#include "harness/watchdog.hpp"
#include "kernels/gemm.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/output/dump.hpp"
#include "miniapp/output/h5.hpp"
#include "miniapp/output/results.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;
using hn::UsageError;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The mask's name (output::mask_name) with its size where it has one.
std::string mask_of(const cp::Config& a) {
  const std::string name = output::mask_name(a);
  if (a.window > 0) return name + " " + std::to_string(a.window);
  if (a.doc_len > 0) return name + " of " + std::to_string(a.doc_len);
  return name;
}

void print_dry_run(const Plan& p, double avail_per_rank) {
  std::printf("minicp --dry-run: %zu cases; memory available per rank: %s (%d ranks on this node)\n", p.cases.size(),
              avail_per_rank >= 0 ? hn::human_bytes(avail_per_rank).c_str() : "unknown", p.local_ranks);
  std::printf("%-40s %-10s %7s %5s %-22s %16s  %s\n", "case", "scheme", "pass", "ranks", "mask",
              "memory/rank", "status");
  for (size_t i = 0; i < p.cases.size(); ++i) {
    const Case& c = p.cases[i];
    const bool fits = avail_per_rank < 0 || double(p.predicted_bytes[i]) <= avail_per_rank;
    std::printf("%-40s %-10s %7s %5d %-22s %16s  %s\n", c.id.c_str(), c.scheme.c_str(), model::to_string(c.stack.pass),
                c.stack.attn.ranks, mask_of(c.stack.attn).c_str(), hn::human_bytes(double(p.predicted_bytes[i])).c_str(),
                !c.refused.empty() ? ("refused: " + c.refused).c_str() : fits ? "ok" : "does not fit");
  }
}

}  // namespace

std::string scheme_list() {
  std::string s;
  for (const cp::SchemeInfo& info : cp::registry()) {
    std::string problems;
    for (cp::Problem pr : info.problems) problems += std::string(problems.empty() ? "" : ", ") + cp::to_string(pr);
    s += info.name + "  [" + problems + "]\n    " + info.summary + "\n";
    for (const cp::Setting& st : info.settings)
      s += "    setting " + st.name + " (default " + std::to_string(st.default_value) + ", >= " +
           std::to_string(st.min_value) + "): " + st.help + "\n";
    if (!info.refuses.empty()) s += "    refuses: " + info.refuses + "\n";
  }
  return s;
}

Plan parse(const hn::Args& a) {
  Plan p;
  Options& o = p.o;
  CLI::App app{"minicp: Llama-style decoder layers, forward and backward, on every context-parallel scheme, "
               "driven by an input deck (TOML)"};
  app.add_option("--deck", o.deck, "input deck (TOML), e.g. inputs/tiny.toml (required; no default)")
      ->type_name("FILE");
  app.add_option("--set", o.sets, "override one deck key: section.key=value (a TOML value), repeatable (default: none)")
      ->type_name("KEY=VALUE");
  app.add_option("--out", o.out, "HDF5 results file (default: the deck's output.file; no file when that is unset)")
      ->type_name("FILE.h5");
  app.add_option("--dump", o.dump,
                 "write the first case's global tensors (x, y, dy, dx, weights, gradients) to this HDF5 file "
                 "(default: no dump)")
      ->type_name("FILE.h5");
  app.add_option("--resume", o.resume,
                 "keep the complete cases of this results file (of the same deck), run the others, and write "
                 "the whole file again (to --out, default: this file) (default: none)")
      ->type_name("FILE.h5");
  app.add_flag("--overwrite", o.overwrite,
               "replace an existing --out or --dump that is not a minicp file of its kind (results, dump); an "
               "input (--deck, --resume) is never replaced (default: off)");
  app.add_flag("--dry-run", o.dry_run,
               "print the resolved cases with the predicted memory per rank and run nothing; exit 2 when a case "
               "would not fit (default: off)");
  app.add_flag("--quiet", o.quiet, "print only the one-line summary (default: off)");
  app.add_flag("--no-events", o.no_events,
               "record no trace events (the events tables stay empty; for measuring the tracing overhead) "
               "(default: off)");
  app.add_flag("--list-schemes", o.list_schemes,
               "print every scheme: problems, summary, settings, refusals (default: off)");
  hn::parse(app, a, [] { std::printf("\n%s", deck_keys_help().c_str()); });
  const std::pair<const char*, const std::string*> files[] = {
      {"--out", &o.out}, {"--dump", &o.dump}, {"--resume", &o.resume}};
  for (const auto& [flag, path] : files)
    if (app.count(flag) > 0 && path->empty()) throw UsageError(std::string(flag) + " '': needs a file name");
  if (o.list_schemes) {
    if (a.rank() == 0) std::printf("%s", scheme_list().c_str());
    throw hn::HelpShown{};
  }
  if (o.deck.empty()) throw UsageError("--deck: required (an input deck, e.g. --deck inputs/tiny.toml)");
  // A dry run plans for any job size (a cluster deck can be checked on a laptop).
  p.deck = load_deck(o.deck, o.sets, a.size(), o.dry_run);
  if (o.out.empty()) o.out = o.resume.empty() ? p.deck.output_file : o.resume;
  p.cases = make_cases(p.deck);
  const size_t elem = p.deck.dtype == "f64" ? sizeof(double) : sizeof(float);
  int64_t most = 0;
  std::string most_id;
  for (const Case& c : p.cases) {
    const int64_t b = c.refused.empty() ? model::predicted_stack_bytes(c.stack, cp::find(c.scheme), elem) : 0;
    p.predicted_bytes.push_back(b);
    if (b > most) most = b, most_id = c.id;
  }
  p.local_ranks = comm::Communicator::node_topology().local_size;
  if (o.dry_run) {
    const int64_t node = hn::node_available_bytes();
    const double avail = node < 0 ? -1.0 : double(node) / p.local_ranks;
    if (a.rank() == 0) print_dry_run(p, avail);
    std::fflush(stdout);  // the table before any refusal below
  }
  hn::check_memory(a, "case " + most_id, double(most), p.local_ranks);
  if (o.dry_run) throw hn::HelpShown{};
  hn::check_outputs(a, {{"--out", o.out}, {"--dump", o.dump}});
  claim_outputs(a, p);
  return p;
}

namespace {

// Where a rank was when the stall watchdog ends the job, and what the results file keeps:
// every case before the one rank 0 is in (run or resumed) and the resumed ones after it.
hn::Watchdog::Where stall_where(const Plan& p, const output::Results* results) {
  return [&p, results](int64_t case_index, int64_t rep, int64_t root_case) {
    std::string at = case_index < 0 ? "before the first case" : "in case " + p.cases[size_t(case_index)].id;
    if (case_index >= 0)
      at += rep >= 0                ? ", rep " + std::to_string(rep)
            : rep >= -p.deck.warmup ? ", warm-up rep " + std::to_string(rep + p.deck.warmup)
                                    : ", setting it up";
    int kept = 0;
    for (const Case& c : p.cases) kept += c.index < root_case || (results && results->has_case(c.id)) ? 1 : 0;
    return at + "; ending the job (" +
           (results ? "the results file keeps the " + std::to_string(kept) + " complete cases" : "no results file") +
           ")";
  };
}

const std::vector<cp::Mode> kAllModes = {cp::Mode::Full, cp::Mode::ComputeOnly, cp::Mode::CommOnly};
int mode_code(cp::Mode m) { return int(std::find(kAllModes.begin(), kAllModes.end(), m) - kAllModes.begin()); }
constexpr int kTotalPhase = model::kPhases;  // the "total" row of a layer (sum of its phases)
const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<std::string> mode_names() {
  std::vector<std::string> n;
  for (cp::Mode m : kAllModes) n.push_back(cp::to_string(m));
  return n;
}
std::vector<std::string> phase_names() {
  std::vector<std::string> n;
  for (int i = 0; i < model::kPhases; ++i) n.push_back(model::to_string(model::Phase(i)));
  n.push_back("total");
  return n;
}
std::vector<std::string> kind_names() {
  std::vector<std::string> n;
  for (int k = 0; k <= int(comm::EventKind::Kernel); ++k) n.push_back(comm::to_string(comm::EventKind(k)));
  return n;
}

// SGEMM 2048^3 on every rank of comm at once (each with its own threads, as the cases run):
// this rank's GFLOP/s, best of 3 after one warm-up (~0.2 s).
double measure_sgemm(MPI_Comm comm) {
  const int n = 2048;
  kernels::View2<float> A("sgemm_a", n, n), B("sgemm_b", n, n), C("sgemm_c", n, n);
  Kokkos::deep_copy(A, 1.0f);
  Kokkos::deep_copy(B, 0.5f);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    kernels::gemm<float>(kernels::Trans::N, kernels::Trans::N, 1.0f, A, B, 0.0f, C);
    Kokkos::fence();
    if (i > 0) best = std::min(best, MPI_Wtime() - t0);
  }
  return kernels::gemm_flops(n, n, n) / best / 1e9;
}

// Resets the process's peak RSS (VmHWM) to its current RSS (Linux: /proc/self/clear_refs).
void reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  std::fputs("5", f);
  std::fclose(f);
}

// What the ranks of one case measured, for the figures of merit (on the group's rank 0).
struct Measured {
  std::map<cp::Mode, std::vector<double>> step;  // per rep: the slowest rank's step time
  std::vector<double> fwd, bwd;                  // full mode, per rep, slowest rank
  std::vector<double> wait;                      // full mode, per rep, max over ranks of comm wait
  std::vector<double> compute, exec_flops;       // full mode, per rank: median over reps
  std::vector<double> bytes;                     // full mode, per rank: bytes sent per step
  double grad_exposed_s = 0;                     // full mode, median, slowest rank
  double useful_flops = 0, tokens = 0, sgemm_gflops_group = 0;
  model::PhaseTimes fwd_phases, bwd_phases;      // rank 0, all layers, the last full rep
};

// Medians over reps of x, then gathered to the group's rank 0 (one value per rank).
std::vector<double> gather_median(const std::vector<double>& x, MPI_Comm g) {
  double m = hn::median(x);
  int size = 1;
  MPI_Comm_size(g, &size);
  std::vector<double> all(static_cast<size_t>(size));
  MPI_Gather(&m, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, g);
  return all;
}

struct CaseRun {
  Measured m;
  output::CaseData data;  // this rank's rows
};

// The SGEMM reference of a case is this rank's SGEMM rate measured right before and right
// after it, on the case's group (the mean of the two): a machine's SGEMM rate drifts (10-15%
// over tens of seconds on the development VM), and a rate measured once at start-up made a
// late case's efficiency read that drift. The measurement after a case serves as the one
// before the next when that has as many ranks (the same group): `ranks` is the group size
// of the last measurement, known alike on every rank, so a group measures or not as one.
struct SgemmReference {
  int ranks = 0;       // group size of the last measurement; 0: none yet
  double gflops = 0;   // this rank's rate then (GFLOP/s)
};

// One case on its CP group: warm-up, then reps x modes interleaved (full, compute-only,
// comm-only, full, ...). dump: when not empty, one more full-mode step written there.
template <class T>
void run_case(const Plan& p, const Case& c, comm::Communicator& comm, const std::string& dump, SgemmReference& ref,
              CaseRun& out) {
  const cp::SchemeInfo& info = cp::find(c.scheme);
  MPI_Comm g = *static_cast<MPI_Comm*>(comm.world().native);
  const double sgemm_before = ref.ranks == c.stack.attn.ranks ? ref.gflops : measure_sgemm(g);
  hn::MemTracker& mem = hn::MemTracker::instance();
  cp::release_scratch();  // the schemes' scratch of the cases before: this case is charged for its own
  mem.reset_peak();
  reset_peak_rss();
  const int64_t base = mem.current_bytes();
  model::Stack<T> st(c.stack, info, comm);
  cp::Context ctx{comm, model::attention_config(c.stack)};
  const bool train = c.stack.pass == model::Pass::Train;
  const int rank = comm.world().rank, L = c.stack.shape.layers;
  comm::Trace& trace = comm.trace();
  trace.set_enabled(!p.o.no_events);
  trace.clear();
  Measured& m = out.m;
  std::vector<double> my_compute, my_flops, my_bytes, exposed;
  const double gemm_flops_step = [&] {  // this rank's GEMM FLOPs per step (the same on every rank)
    const cp::Config a = model::attention_config(c.stack);
    const double n = double(st.rows().size());
    model::LayerFlops f = model::layer_flops(c.stack.shape, n, n, a.causal, train, false);
    return L * f.gemm;
  }();
  for (int rep = 0; rep < p.deck.warmup + p.deck.reps; ++rep)
    for (cp::Mode mode : p.deck.modes) {
      const int r = rep - p.deck.warmup;
      hn::Watchdog::instance().progress(c.index, r);
      ctx.cfg.mode = mode;
      ctx.reset();
      trace.context().rep = r;
      trace.context().mode = mode_code(mode);
      MPI_Barrier(g);
      const double t0 = MPI_Wtime();
      st.forward(ctx);
      Kokkos::fence();
      const double t1 = MPI_Wtime();
      if (train) st.backward(ctx);
      Kokkos::fence();
      const double t2 = MPI_Wtime();
      double t[3] = {t1 - t0, t2 - t1, t2 - t0};
      MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, g);
      if (r < 0) {
        trace.clear();  // warm-up: not recorded
        continue;
      }
      m.step[mode].push_back(t[2]);
      model::PhaseTimes fsum, bsum;
      for (int l = 0; l < L; ++l)
        for (int dir = 0; dir < (train ? 2 : 1); ++dir) {
          const model::PhaseTimes& ph = dir == 0 ? st.forward_times(l) : st.backward_times(l);
          (dir == 0 ? fsum : bsum) += ph;
          for (int i = 0; i < model::kPhases; ++i)
            out.data.timing.push_back({mode_code(mode), r, rank, l, dir, i, ph.s[i]});
          out.data.timing.push_back({mode_code(mode), r, rank, l, dir, kTotalPhase, ph.total()});
        }
      if (mode != cp::Mode::Full) continue;
      m.fwd.push_back(t[0]), m.bwd.push_back(t[1]);
      double wait = ctx.stats.comm_wait_s + st.grad_allreduce_exposed_s();
      MPI_Allreduce(MPI_IN_PLACE, &wait, 1, MPI_DOUBLE, MPI_MAX, g);
      m.wait.push_back(wait);
      const double comm_s = fsum.s[int(model::Phase::AttnComm)] + bsum.s[int(model::Phase::AttnComm)] +
                            bsum.s[int(model::Phase::GradAllreduce)];
      my_compute.push_back(fsum.total() + bsum.total() - comm_s);
      my_flops.push_back(ctx.stats.flops + gemm_flops_step);
      my_bytes.push_back(double(ctx.bytes_sent()));
      exposed.push_back(st.grad_allreduce_exposed_s());
      m.fwd_phases = fsum, m.bwd_phases = bsum;
    }
  // Memory of the case on this rank: what the stack and its schemes added (Kokkos), the
  // process's peak RSS, the memory model.
  const size_t elem = sizeof(T);
  out.data.memory.push_back({rank, mem.peak_bytes() - base, hn::peak_rss_bytes(),
                             model::predicted_stack_bytes(c.stack, info, elem)});
  if (!dump.empty()) {
    ctx.cfg.mode = cp::Mode::Full;
    ctx.reset();
    trace.set_enabled(false);
    st.forward(ctx);
    if (train) st.backward(ctx);
    output::write_dump(dump, st, c.stack, c.scheme, comm);
  }
  for (const comm::Event& e : trace.events())
    out.data.events.push_back({rank, e.rep, e.mode, e.layer, e.pass, e.step, int32_t(e.kind), e.peer, e.group,
                               e.label, e.bytes, e.flops, e.t_begin, e.t_end});
  trace.clear();
  trace.set_enabled(false);
  cp::release_scratch();
  m.compute = gather_median(my_compute, g);
  m.exec_flops = gather_median(my_flops, g);
  m.bytes = gather_median(my_bytes, g);
  double ex = hn::median(exposed);
  MPI_Allreduce(MPI_IN_PLACE, &ex, 1, MPI_DOUBLE, MPI_MAX, g);
  m.grad_exposed_s = ex;
  const cp::Config a = model::attention_config(c.stack);
  const bool decode = c.stack.pass == model::Pass::Decode;
  const double Nq = double(cp::global_q_tokens(a)), Nk = decode ? double(a.seq_len + a.decode_tokens) : Nq;
  m.useful_flops = L * model::layer_flops(c.stack.shape, Nq, Nk, a.causal, train, decode).total();
  m.tokens = Nq;
  ref.gflops = measure_sgemm(g);
  m.sgemm_gflops_group = 0.5 * (sgemm_before + ref.gflops);
  MPI_Allreduce(MPI_IN_PLACE, &m.sgemm_gflops_group, 1, MPI_DOUBLE, MPI_SUM, g);
}

double max_of(const std::vector<double>& v) { return v.empty() ? kNaN : *std::max_element(v.begin(), v.end()); }
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? kNaN : s / double(v.size());
}

// The figures of merit of a case (README, "Figures of merit"), from what rank 0 gathered.
output::Attrs figures(const Case& c, const Measured& m, const std::map<std::string, double>& none_time,
                      int threads) {
  output::Attrs s;
  auto& r = s.real;
  const double t = hn::median(m.step.count(cp::Mode::Full) ? m.step.at(cp::Mode::Full) : std::vector<double>{});
  r["measured_time_s"] = t;
  r["forward_time_s"] = hn::median(m.fwd);
  r["backward_time_s"] = hn::median(m.bwd);
  r["useful_flops_per_s"] = m.useful_flops / t;
  r["exec_flops_per_s"] = [&] {
    double sum = 0;
    for (double f : m.exec_flops) sum += f;
    return sum / t;
  }();
  r["layer_efficiency"] = m.useful_flops / t / (m.sgemm_gflops_group * 1e9);
  r["sgemm_flops_per_s"] = m.sgemm_gflops_group * 1e9;
  r["tokens_per_s"] = m.tokens / t;
  r["bytes_sent_per_rank"] = mean_of(m.bytes);
  r["bytes_sent_max_rank"] = max_of(m.bytes);
  r["comm_wait_s"] = hn::median(m.wait);
  r["grad_allreduce_exposed_s"] = m.grad_exposed_s;
  r["imbalance"] = hn::imbalance(m.compute);
  r["flop_imbalance"] = hn::imbalance(m.exec_flops);
  hn::Overlap ov = hn::not_measured();
  double t_comm = kNaN;
  // Overlap is defined for a case that communicates and ran the three modes.
  const bool talks = max_of(m.bytes) > 0;
  if (talks && m.step.count(cp::Mode::Full) && m.step.count(cp::Mode::ComputeOnly) &&
      m.step.count(cp::Mode::CommOnly)) {
    t_comm = hn::median(m.step.at(cp::Mode::CommOnly));
    ov = hn::paired_overlap(m.step.at(cp::Mode::Full), m.step.at(cp::Mode::ComputeOnly), t_comm);
    r["compute_only_time_s"] = hn::median(m.step.at(cp::Mode::ComputeOnly));
  }
  r["comm_only_time_s"] = t_comm;
  r["overlap"] = ov.overlap, r["overlap_q1"] = ov.overlap_q1, r["overlap_q3"] = ov.overlap_q3;
  r["exposed_comm_s"] = ov.exposed_s;
  s.integer["overlap_measured"] = ov.measured() ? 1 : 0;
  // CP efficiency against `none` of the same pass and S in this sweep: on the same total
  // cores only (else NaN); cp_efficiency_core_scaled assumes none would speed up linearly.
  const std::string key = std::string(model::to_string(c.stack.pass)) + "_" + std::to_string(c.stack.attn.seq_len);
  double cpe = kNaN, scaled = kNaN;
  if (none_time.count(key)) {
    const double tn = none_time.at(key);
    const int cores_case = c.stack.attn.ranks * threads, cores_none = threads;
    if (cores_case == cores_none) cpe = tn / t;
    scaled = tn * cores_none / (t * cores_case);
  }
  r["cp_efficiency"] = cpe;
  r["cp_efficiency_core_scaled"] = scaled;
  s.integer["cp_efficiency_measured"] = std::isnan(cpe) ? 0 : 1;
  // Every rep is kept; the slowest full-mode rep against the median shows a stall.
  const auto& full = m.step.count(cp::Mode::Full) ? m.step.at(cp::Mode::Full) : std::vector<double>{};
  r["slowest_rep_ratio"] = full.empty() ? kNaN : max_of(full) / t;
  s.text["units"] =
      "*_s: seconds; *_flops_per_s: FLOP/s; tokens_per_s: tokens/s; bytes_*: bytes per step; efficiencies, "
      "overlap, imbalance, ratios: dimensionless";
  return s;
}

output::Attrs case_attrs(const Case& c, const Deck& d) {
  output::Attrs a;
  const cp::Config& cfg = c.stack.attn;
  a.text["scheme"] = c.scheme;
  a.text["pass"] = model::to_string(c.stack.pass);
  a.text["mask"] = output::mask_name(model::attention_config(c.stack));
  a.text["dtype"] = d.dtype;
  a.text["status"] = c.refused.empty() ? "ok" : "refused: " + c.refused;
  a.integer["seq_len"] = cfg.seq_len, a.integer["ranks"] = cfg.ranks;
  a.integer["window"] = cfg.window, a.integer["doc_len"] = cfg.doc_len;
  a.integer["causal"] = cfg.causal ? 1 : 0;
  for (const cp::Setting& st : cp::all_settings()) a.integer[st.name] = cfg.*st.field;
  const model::Shape& m = c.stack.shape;
  a.integer["hidden"] = m.hidden, a.integer["heads"] = m.heads, a.integer["kv_heads"] = m.kv_heads;
  a.integer["head_dim"] = m.head_dim, a.integer["ffn"] = m.ffn, a.integer["layers"] = m.layers;
  a.real["rope_theta"] = m.rope_theta, a.real["norm_eps"] = m.norm_eps;
  a.integer["reps"] = d.reps, a.integer["warmup"] = d.warmup;
  return a;
}

std::string iso_time_utc() {
  const std::time_t now = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return b;
}

output::Attrs root_attrs(const hn::Args& a, const Plan& p, const comm::Communicator& world, double sgemm_mean) {
  output::Attrs r;
  r.text["minicp_version"] = MINICP_VERSION;
  r.text["git_sha"] = MINICP_GIT_SHA;
  r.text["compiler"] = MINICP_COMPILER;
  r.text["compiler_flags"] = MINICP_CXX_FLAGS;
  r.text["kokkos_version"] = std::to_string(KOKKOS_VERSION);
  r.text["kokkos_exec_space"] = kernels::Exec::name();
  r.integer["kokkos_concurrency"] = kernels::Exec().concurrency();
  r.text["comm_backend"] = world.backend();
  r.text["progress"] = p.deck.progress;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  r.text["mpi_library"] = std::string(lib, size_t(len));
  std::string hosts;
  for (const std::string& h : world.topology().hosts) hosts += (hosts.empty() ? "" : ",") + h;
  r.text["hosts"] = hosts;
  r.integer["world_ranks"] = a.size();
  for (const char* v : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST"}) {
    const char* e = std::getenv(v);
    r.text[std::string(v) == "SLURM_JOB_ID" ? "slurm_job_id" : "slurm_job_nodelist"] = e ? e : "";
  }
  r.text["start_time"] = iso_time_utc();
  r.text["deck"] = p.deck.resolved;
  std::string cmd;
  for (const std::string& w : a.args()) cmd += (cmd.empty() ? "" : " ") + w;
  r.text["command_line"] = cmd;
  r.real["sgemm_gflops_per_rank"] = sgemm_mean;
  return r;
}

}  // namespace

int execute(const hn::Args& a, const Plan& p) {
  const int world_rank = a.rank();
  const bool say = world_rank == 0 && !p.o.quiet;
  hn::MemTracker::instance().start();
  if (p.o.resume.empty()) hn::remove_old_outputs(a, {{"--out", p.o.out}, {"--dump", p.o.dump}});
  for (const std::string& f : {p.o.out, p.o.dump})  // this run holds their locks: no live run wrote these
    if (world_rank == 0 && !f.empty()) output::remove_stale_temporaries(f);
  const int threads = int(kernels::Exec().concurrency());
  const comm::Progress progress = comm::parse_progress(p.deck.progress);
  auto world = comm::make_mpi_comm(comm::Progress::None);
  const hn::ClockSync clock0 = hn::measure_offset(MPI_COMM_WORLD);
  double sgemm_mean = measure_sgemm(MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &sgemm_mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  sgemm_mean /= a.size();
  std::unique_ptr<output::Results> results;
  if (!p.o.out.empty())
    results = std::make_unique<output::Results>(p.o.out, MPI_COMM_WORLD, root_attrs(a, p, *world, sgemm_mean),
                                                p.o.resume, p.deck.resolved);
  hn::Watchdog::instance().start(MPI_COMM_WORLD, p.deck.stall_timeout_s, stall_where(p, results.get()), a.prog());
  if (say)
    std::printf("minicp: %s, %zu cases, %d ranks x %d threads, %s, SGEMM %.1f GFLOP/s per rank (mean)%s\n",
                p.o.deck.c_str(), p.cases.size(), a.size(), threads, p.deck.dtype.c_str(), sgemm_mean,
                results && !results->done().empty()
                    ? (", resuming: " + std::to_string(results->done().size()) + " cases done").c_str()
                    : "");
  const double t_start = MPI_Wtime();
  std::string summary;
  std::map<std::string, double> none_time = p.resumed_none_time;  // "<pass>_<S>" -> measured_time_s of `none`
  double write_s = 0;
  int done = 0, todo = 0;
  // The ETA weighs the cases by their useful FLOPs times their reps and modes (the time
  // model a case's cost follows), scaled by the seconds the cases done so far took.
  auto cost = [&](const Case& c) {
    if (!c.refused.empty()) return 0.0;
    const cp::Config at = model::attention_config(c.stack);
    const bool dec = c.stack.pass == model::Pass::Decode, tr = c.stack.pass == model::Pass::Train;
    const double Nq = double(cp::global_q_tokens(at)), Nk = dec ? double(at.seq_len + at.decode_tokens) : Nq;
    return c.stack.shape.layers * model::layer_flops(c.stack.shape, Nq, Nk, at.causal, tr, dec).total() *
           (p.deck.warmup + p.deck.reps) * double(p.deck.modes.size());
  };
  double cost_left = 0, cost_done = 0, cost_prev = 0;
  SgemmReference sgemm_ref;
  for (const Case& c : p.cases)
    if (!(results && results->has_case(c.id))) ++todo, cost_left += cost(c);
  for (const Case& c : p.cases) {
    if (results && results->has_case(c.id)) continue;
    hn::Watchdog::instance().progress(c.index, -p.deck.warmup - 1);
    cost_done += cost_prev, cost_left -= cost_prev, cost_prev = cost(c);  // the previous case is done
    const double elapsed = MPI_Wtime() - t_start;
    if (say) {
      std::printf("[%d/%d] %s (elapsed %.1f s", done + 1, todo, c.id.c_str(), elapsed);
      if (cost_done > 0) std::printf(", ETA %.1f s", elapsed / cost_done * cost_left);
      std::printf(")\n");
      std::fflush(stdout);
    }
    output::CaseData data;
    data.id = c.id;
    data.attrs = case_attrs(c, p.deck);
    data.mode_names = mode_names(), data.phase_names = phase_names(), data.kind_names = kind_names();
    if (!c.refused.empty()) {
      if (say) std::printf("  refused: %s\n", c.refused.c_str());
      if (results) write_s += results->add_case(data);
      ++done;
      continue;
    }
    auto comm = comm::make_mpi_comm(progress, 50, {}, comm::Staging::Direct, c.stack.attn.ranks);
    comm->trace().set_enabled(false);
    CaseRun run;
    const std::string dump = &c == &p.cases.front() ? p.o.dump : "";  // --dump: the first case
    if (world_rank < c.stack.attn.ranks) {  // the CP group; the other ranks wait at the barrier
      if (p.deck.dtype == "f64")
        run_case<double>(p, c, *comm, dump, sgemm_ref, run);
      else
        run_case<float>(p, c, *comm, dump, sgemm_ref, run);
    }
    sgemm_ref.ranks = c.stack.attn.ranks;  // on every rank, members of the group or not
    MPI_Barrier(MPI_COMM_WORLD);
    // Events on rank 0's clock: the offset measured at start and now, interpolated.
    hn::ClockModel clock{clock0, hn::measure_offset(MPI_COMM_WORLD)};
    for (output::EventRow& e : run.data.events) e.t_begin = clock.to_root(e.t_begin), e.t_end = clock.to_root(e.t_end);
    double clock_err[2] = {clock.uncertainty_s(), std::abs(clock.drift())};  // the worst rank's
    MPI_Allreduce(MPI_IN_PLACE, clock_err, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    data.timing = std::move(run.data.timing);
    data.memory = std::move(run.data.memory);
    data.events = std::move(run.data.events);
    if (world_rank == 0) {
      data.summary = figures(c, run.m, none_time, threads);
      data.summary.real["clock_uncertainty_s"] = clock_err[0];  // of the events' t_begin / t_end
      data.summary.real["clock_drift"] = clock_err[1];          // |d offset / d t|, dimensionless
      if (c.scheme == std::string("none"))
        none_time[std::string(model::to_string(c.stack.pass)) + "_" + std::to_string(c.stack.attn.seq_len)] =
            data.summary.real["measured_time_s"];
    }
    if (results) write_s += results->add_case(data);
    ++done;
    if (world_rank != 0) continue;
    const auto& f = data.summary.real;
    const int L = c.stack.shape.layers;
    if (say) {
      std::printf("  %-10s %6s %9s %5s %13s %13s %9s %11s %10s %11s %7s %8s %9s\n", "scheme", "pass", "S", "ranks",
                  "fwd/layer[ms]", "bwd/layer[ms]", "step[s]", "tokens/s", "GFLOP/s", "SGEMM[GF/s]", "/SGEMM",
                  "overlap", "wait[ms]");
      std::printf("  %-10s %6s %9lld %5d %13.3f %13.3f %9.4f %11.1f %10.1f %11.1f %7.3f %8s %9.2f\n",
                  c.scheme.c_str(), model::to_string(c.stack.pass), (long long)c.stack.attn.seq_len,
                  c.stack.attn.ranks, 1e3 * f.at("forward_time_s") / L, 1e3 * f.at("backward_time_s") / L,
                  f.at("measured_time_s"), f.at("tokens_per_s"), f.at("useful_flops_per_s") / 1e9,
                  f.at("sgemm_flops_per_s") / 1e9, f.at("layer_efficiency"),
                  std::isnan(f.at("overlap")) ? "-" : fmt("%.3f", f.at("overlap")).c_str(), 1e3 * f.at("comm_wait_s"));
      for (int dir = 0; dir < 2; ++dir) {
        const model::PhaseTimes& ph = dir == 0 ? run.m.fwd_phases : run.m.bwd_phases;
        if (ph.total() <= 0) continue;
        std::printf("  %s phases per layer [ms]:", dir == 0 ? "fwd" : "bwd");
        for (int i = 0; i < model::kPhases; ++i)
          std::printf(" %s %.2f", model::to_string(model::Phase(i)), 1e3 * ph.s[i] / L);
        std::printf("\n");
      }
      if (f.at("slowest_rep_ratio") > 2.0)
        std::printf("  WARNING: a rep took %.1fx the median step (%.3f s): a rank stalled or the machine was "
                    "busy; every rep is in the results file\n",
                    f.at("slowest_rep_ratio"), f.at("slowest_rep_ratio") * f.at("measured_time_s"));
    }
    summary += " " + std::string(model::to_string(c.stack.pass)) + "_" + c.scheme + "_S" +
               std::to_string(c.stack.attn.seq_len) + "_P" + std::to_string(c.stack.attn.ranks) + "=" +
               fmt("%.3f", f.at("layer_efficiency"));
  }
  const double run_s = MPI_Wtime() - t_start;
  if (results) {
    output::Attrs end;
    end.text["end_time"] = iso_time_utc();
    end.real["run_time_s"] = run_s;
    end.real["results_write_time_s"] = write_s;
    results->finish(end);
  }
  hn::Watchdog::instance().stop();
  hn::MemTracker::instance().stop();
  if (world_rank == 0) {
    std::printf("MINICP deck=%s cases=%zu run_s=%.1f sgemm_gflops=%.1f layer_efficiency:%s\n", p.o.deck.c_str(),
                p.cases.size(), run_s, sgemm_mean, summary.c_str());
    if (say && results)
      std::printf("minicp: results in %s (writing took %.3f s, %.2f%% of the run)\n", p.o.out.c_str(), write_s,
                  100.0 * write_s / run_s);
  }
  return 0;
}

}  // namespace minicp::run
