// The minicp driver (see driver.hpp).
#include "miniapp/run/driver.hpp"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"
#include "harness/stats.hpp"
#include "kernels/gemm.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/output/dump.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;
using hn::UsageError;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string mask_of(const cp::Config& a) {
  if (a.window > 0) return "window " + std::to_string(a.window);
  if (a.doc_len > 0) return "documents of " + std::to_string(a.doc_len);
  return a.causal ? "causal" : "full";
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
  app.add_flag("--dry-run", o.dry_run,
               "print the resolved cases with the predicted memory per rank and run nothing; exit 2 when a case "
               "would not fit (default: off)");
  app.add_flag("--quiet", o.quiet, "print only the one-line summary (default: off)");
  app.add_flag("--list-schemes", o.list_schemes,
               "print every scheme: problems, summary, settings, refusals (default: off)");
  hn::parse(app, a, [] { std::printf("\n%s", deck_keys_help().c_str()); });
  if (o.list_schemes) {
    if (a.rank() == 0) std::printf("%s", scheme_list().c_str());
    throw hn::HelpShown{};
  }
  if (o.deck.empty()) throw UsageError("--deck: required (an input deck, e.g. --deck inputs/tiny.toml)");
  // A dry run plans for any job size (a cluster deck can be checked on a laptop).
  p.deck = load_deck(o.deck, o.sets, o.dry_run ? INT32_MAX : a.size());
  if (o.out.empty()) o.out = p.deck.output_file;
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
  if (!o.out.empty() && o.out == o.dump) throw UsageError("--out and --dump name the same file: " + o.out);
  return p;
}

namespace {

// SGEMM 2048^3 on every rank at once (each with its own threads, as the cases run): this
// rank's GFLOP/s, best of 3 after one warm-up.
double measure_sgemm() {
  const int n = 2048;
  kernels::View2<float> A("sgemm_a", n, n), B("sgemm_b", n, n), C("sgemm_c", n, n);
  Kokkos::deep_copy(A, 1.0f);
  Kokkos::deep_copy(B, 0.5f);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    kernels::gemm<float>(kernels::Trans::N, kernels::Trans::N, 1.0f, A, B, 0.0f, C);
    Kokkos::fence();
    if (i > 0) best = std::min(best, MPI_Wtime() - t0);
  }
  return kernels::gemm_flops(n, n, n) / best / 1e9;
}

// One case's timings, medians over reps (the slowest rank's time of each rep).
struct CaseResult {
  bool ran = false;
  double step_s = 0, fwd_s = 0, bwd_s = 0;  // full mode, all layers
  double useful_flops = 0;                  // per step
  double sgemm_gflops_group = 0;            // SGEMM capacity of the group (sum over its ranks)
  double tokens = 0;                        // tokens per step
  double grad_exposed_s = 0;
  model::PhaseTimes fwd_phases, bwd_phases;  // all layers, the last full-mode rep, this rank
};

// dump: when not empty, one more full-mode step after the timed reps, written there.
template <class T>
CaseResult run_case(const Plan& p, const Case& c, comm::Communicator& comm, double sgemm, const std::string& dump) {
  const cp::SchemeInfo& info = cp::find(c.scheme);
  model::Stack<T> st(c.stack, info, comm);
  cp::Context ctx{comm, model::attention_config(c.stack)};
  const bool train = c.stack.pass == model::Pass::Train;
  MPI_Comm g = *static_cast<MPI_Comm*>(comm.world().native);
  std::vector<double> step, fwd, bwd, exposed;
  model::PhaseTimes last_fwd, last_bwd;
  for (int rep = 0; rep < p.deck.warmup + p.deck.reps; ++rep)
    for (cp::Mode mode : p.deck.modes) {
      ctx.cfg.mode = mode;
      ctx.reset();
      MPI_Barrier(g);
      const double t0 = MPI_Wtime();
      st.forward(ctx);
      Kokkos::fence();
      const double t1 = MPI_Wtime();
      if (train) st.backward(ctx);
      Kokkos::fence();
      double t[3] = {t1 - t0, MPI_Wtime() - t1, MPI_Wtime() - t0};
      MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, g);
      if (rep < p.deck.warmup || mode != cp::Mode::Full) continue;
      fwd.push_back(t[0]), bwd.push_back(t[1]), step.push_back(t[2]);
      exposed.push_back(st.grad_allreduce_exposed_s());
      last_fwd = last_bwd = model::PhaseTimes{};
      for (int l = 0; l < c.stack.shape.layers; ++l) {
        last_fwd += st.forward_times(l);
        if (train) last_bwd += st.backward_times(l);
      }
    }
  if (!dump.empty()) {
    ctx.cfg.mode = cp::Mode::Full;
    ctx.reset();
    st.forward(ctx);
    if (train) st.backward(ctx);
    output::write_dump(dump, st, c.stack, c.scheme, comm);
  }
  CaseResult r;
  r.fwd_phases = last_fwd, r.bwd_phases = last_bwd;
  r.ran = true;
  r.step_s = hn::median(step), r.fwd_s = hn::median(fwd), r.bwd_s = hn::median(bwd);
  r.grad_exposed_s = hn::median(exposed);
  const cp::Config a = model::attention_config(c.stack);
  const bool decode = c.stack.pass == model::Pass::Decode;
  const double Nq = double(cp::global_q_tokens(a)), Nk = decode ? double(a.seq_len + a.decode_tokens) : Nq;
  r.useful_flops = c.stack.shape.layers * model::layer_flops(c.stack.shape, Nq, Nk, a.causal, train, decode).total();
  r.tokens = Nq;
  r.sgemm_gflops_group = sgemm;
  MPI_Allreduce(MPI_IN_PLACE, &r.sgemm_gflops_group, 1, MPI_DOUBLE, MPI_SUM, g);
  return r;
}

}  // namespace

int execute(const hn::Args& a, const Plan& p) {
  const int world_rank = a.rank();
  const bool say = world_rank == 0 && !p.o.quiet;
  hn::remove_old_outputs(a, {{"--out", p.o.out}, {"--dump", p.o.dump}});
  const int threads = int(kernels::Exec().concurrency());
  const double sgemm = measure_sgemm();
  double sgemm_mean = sgemm;
  MPI_Allreduce(MPI_IN_PLACE, &sgemm_mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  sgemm_mean /= a.size();
  if (say)
    std::printf("minicp: %s, %zu cases, %d ranks x %d threads, %s, SGEMM %.1f GFLOP/s per rank (mean)\n",
                p.o.deck.c_str(), p.cases.size(), a.size(), threads, p.deck.dtype.c_str(), sgemm_mean);
  const double t_start = MPI_Wtime();
  std::string summary;
  int done = 0;
  for (const Case& c : p.cases) {
    const double elapsed = MPI_Wtime() - t_start;
    if (say) {
      std::printf("[%d/%zu] %s (elapsed %.1f s", c.index + 1, p.cases.size(), c.id.c_str(), elapsed);
      if (done > 0) std::printf(", ETA %.1f s", elapsed / done * double(p.cases.size() - size_t(c.index)));
      std::printf(")\n");
      std::fflush(stdout);
    }
    if (!c.refused.empty()) {
      if (say) std::printf("  refused: %s\n", c.refused.c_str());
      continue;
    }
    const comm::Progress progress = comm::parse_progress(p.deck.progress);
    auto comm = comm::make_mpi_comm(progress, 50, {}, comm::Staging::Direct, c.stack.attn.ranks);
    CaseResult r;
    const std::string dump = &c == &p.cases.front() ? p.o.dump : "";  // --dump: the first case
    if (world_rank < c.stack.attn.ranks)  // the CP group; the other ranks wait at the barrier
      r = p.deck.dtype == "f64" ? run_case<double>(p, c, *comm, sgemm, dump)
                                : run_case<float>(p, c, *comm, sgemm, dump);
    if (say && !dump.empty()) std::printf("  --dump: %s written\n", dump.c_str());
    MPI_Barrier(MPI_COMM_WORLD);
    ++done;
    if (world_rank != 0) continue;
    const int L = c.stack.shape.layers;
    const double flops_rate = r.useful_flops / r.step_s, eff = flops_rate / (r.sgemm_gflops_group * 1e9);
    if (say) {
      std::printf("  %-10s %6s %9s %5s %14s %14s %10s %12s %14s %8s\n", "scheme", "pass", "S", "ranks",
                  "fwd/layer[ms]", "bwd/layer[ms]", "step[s]", "tokens/s", "useful GFLOP/s", "/SGEMM");
      std::printf("  %-10s %6s %9lld %5d %14.3f %14.3f %10.4f %12.1f %14.1f %8.3f\n", c.scheme.c_str(),
                  model::to_string(c.stack.pass), (long long)c.stack.attn.seq_len, c.stack.attn.ranks,
                  1e3 * r.fwd_s / L, 1e3 * r.bwd_s / L, r.step_s, r.tokens / r.step_s, flops_rate / 1e9, eff);
    }
    if (say) {
      for (int dir = 0; dir < 2; ++dir) {
        const model::PhaseTimes& ph = dir == 0 ? r.fwd_phases : r.bwd_phases;
        if (ph.total() <= 0) continue;
        std::printf("  %s phases per layer [ms]:", dir == 0 ? "fwd" : "bwd");
        for (int i = 0; i < model::kPhases; ++i)
          std::printf(" %s %.2f", model::to_string(model::Phase(i)), 1e3 * ph.s[i] / L);
        std::printf("\n");
      }
    }
    summary += " " + std::string(model::to_string(c.stack.pass)) + "_" + c.scheme + "_S" + std::to_string(c.stack.attn.seq_len) + "_P" +
               std::to_string(c.stack.attn.ranks) + "=" + fmt("%.3f", eff);
  }
  if (world_rank == 0)
    std::printf("MINICP deck=%s cases=%zu sgemm_gflops=%.1f layer_efficiency:%s\n", p.o.deck.c_str(), p.cases.size(),
                sgemm_mean, summary.c_str());
  return 0;
}

}  // namespace minicp::run
