// minicp-cp-bench: runs one CP scheme on this MPI job's ranks in the modes full,
// compute-only and comm-only and prints per-rank compute, the load imbalance (max/mean of
// per-rank compute time) and overlap = 1 - (T_full - T_compute) / T_comm.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "miniapp/cp/scheme.hpp"

namespace {
using namespace minicp;

struct Options {
  std::string scheme = "zigzag";
  int64_t seq = 8192;
  int heads = 8, kv_heads = 8, head_dim = 128;
  int causal = 1;
  int64_t window = 0, doc_len = 0;
  int tile = 0;
  std::string pass = "fwdbwd", modes = "full,compute-only,comm-only", progress = "thread", progress_cpus, staging = "direct", json;
  int reps = 3, warmup = 1, poll_us = 50;
};

// Deterministic value in [-1, 1) from (seed, global index).
double hash_unit(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Local rows of a global [tokens, heads, D] tensor seeded by the global token index.
kernels::View3<float> local_rows(const std::vector<int64_t>& idx, int64_t offset, int heads, int D, uint64_t seed) {
  kernels::View3<float> v("x", idx.size(), heads, D);
  auto h = Kokkos::create_mirror_view(v);
  for (size_t i = 0; i < idx.size(); ++i)
    for (int a = 0; a < heads; ++a)
      for (int d = 0; d < D; ++d)
        h(i, a, d) = float(hash_unit(seed, (uint64_t(idx[i] - offset) * heads + a) * D + d));
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct ModeResult {
  double t_max = 0;                          // median over reps of the slowest rank's time
  std::vector<double> compute, wait, flops, busy;  // per rank (median over reps); busy: progress thread in MPI
  int64_t bytes = 0;                         // this rank's bytes per rep (rank 0's shown)
};

int run(int argc, char** argv, int rank, int P) {
  Options o;
  CLI::App app{"minicp-cp-bench: one CP scheme in modes full / compute-only / comm-only"};
  std::string names;
  for (const auto& sc : cp::registry()) names += (names.empty() ? "" : ", ") + sc.name;
  app.add_option("--scheme", o.scheme, "CP scheme: " + names)->capture_default_str();
  app.add_option("--seq", o.seq, "global sequence length S, tokens")->capture_default_str();
  app.add_option("--heads", o.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key/value heads")->capture_default_str();
  app.add_option("--head-dim", o.head_dim, "head dimension D")->capture_default_str();
  app.add_option("--causal", o.causal, "1 causal mask, 0 full")->capture_default_str();
  app.add_option("--window", o.window, "sliding window, tokens (0 none)")->capture_default_str();
  app.add_option("--doc-len", o.doc_len, "packed documents of this many tokens (0 one document)")
      ->capture_default_str();
  cp::Config cfg;
  for (const cp::Setting& st : cp::all_settings()) {  // the schemes' own settings, from the registry
    std::string flag = "--" + st.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_option(flag, cfg.*st.field, st.help)->capture_default_str();
  }
  app.add_option("--tile", o.tile, "attention tile size, tokens (0 kernel default)")->capture_default_str();
  app.add_option("--pass", o.pass, "fwd, bwd (timed alone, after an untimed fwd) or fwdbwd")->capture_default_str();
  app.add_option("--modes", o.modes, "comma list of full, compute-only, comm-only")->capture_default_str();
  app.add_option("--reps", o.reps, "timed repetitions per mode (median reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed repetitions per mode")->capture_default_str();
  app.add_option("--progress", o.progress, "communication progress: none or thread")->capture_default_str();
  app.add_option("--poll-us", o.poll_us, "progress thread polling interval, microseconds")->capture_default_str();
  app.add_option("--progress-cpus", o.progress_cpus,
                 "pin each node-local rank's progress thread to a CPU of this comma list (local rank i: entry i "
                 "mod length); default: not pinned")
      ->capture_default_str();
  app.add_option("--staging", o.staging,
                 "MPI buffers: direct (MPI reads the tensors) or host (copied through host staging buffers, "
                 "for device memory and an MPI that is not GPU-aware)")
      ->capture_default_str();
  app.add_option("--json", o.json, "write the results to this JSON file (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }
  auto fail = [&](const std::string& msg) {
    if (rank == 0) std::fprintf(stderr, "minicp-cp-bench: %s\n", msg.c_str());
    return 2;
  };
  if (o.pass != "fwd" && o.pass != "bwd" && o.pass != "fwdbwd")
    return fail("--pass '" + o.pass + "' is not one of: fwd, bwd, fwdbwd");
  if (o.reps < 1) return fail("--reps " + std::to_string(o.reps) + " must be >= 1");
  if (o.warmup < 0) return fail("--warmup " + std::to_string(o.warmup) + " must be >= 0");
  if (o.causal != 0 && o.causal != 1) return fail("--causal " + std::to_string(o.causal) + " must be 0 or 1");
  std::vector<cp::Mode> modes;
  comm::Progress progress;
  std::vector<int> progress_cpus;
  comm::Staging staging;
  const cp::SchemeInfo* info = nullptr;
  try {
    for (const auto& m : split(o.modes)) modes.push_back(cp::parse_mode(m));
    progress = comm::parse_progress(o.progress);
    progress_cpus = comm::parse_cpu_list(o.progress_cpus, "--progress-cpus");
    staging = comm::parse_staging(o.staging);
    if (!progress_cpus.empty() && progress != comm::Progress::Thread)
      return fail("--progress-cpus needs --progress thread (got --progress " + o.progress + ")");
    info = &cp::find(o.scheme);
  } catch (const std::invalid_argument& e) {
    return fail(e.what());
  }
  if (modes.empty()) return fail("--modes is empty");
  cfg.seq_len = o.seq;
  cfg.heads = o.heads;
  cfg.kv_heads = o.kv_heads;
  cfg.head_dim = o.head_dim;
  cfg.causal = o.causal == 1;
  cfg.window = o.window;
  cfg.doc_len = o.doc_len;
  cfg.ranks = P;
  cfg.problem = info->problems.front();
  cfg.attn.tile_q = cfg.attn.tile_k = o.tile;
  const std::string why = cp::check(*info, cfg);
  if (!why.empty()) return fail(why);  // before any allocation
  if (o.pass != "fwd" && !info->has_backward())
    return fail(o.scheme + " solves only the decode problem, which has no backward pass: use --pass fwd");

  const int64_t q0 = cp::first_q_position(cfg);
  const cp::Shard sh = info->shard(cfg, rank);
  const int H = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  auto q = local_rows(sh.q, q0, H, D, 1), dout = local_rows(sh.q, q0, H, D, 4);
  auto k = local_rows(sh.kv, 0, Hkv, D, 2), v = local_rows(sh.kv, 0, Hkv, D, 3);
  kernels::View3<float> out("o", sh.q.size(), H, D), dq("dq", sh.q.size(), H, D), dk("dk", sh.kv.size(), Hkv, D),
      dv("dv", sh.kv.size(), Hkv, D);
  kernels::View2<float> lse("lse", sh.q.size(), H);
  auto comm = comm::make_mpi_comm(progress, o.poll_us, progress_cpus, staging);
  comm->trace().set_enabled(false);
  auto scheme = info->make_f32();
  const int threads = int(kernels::Exec().concurrency());
  if (rank == 0)
    std::printf("minicp-cp-bench: scheme=%s ranks=%d threads/rank=%d S=%lld H=%d Hkv=%d D=%d %s pass=%s progress=%s%s comm=%s\n",
                o.scheme.c_str(), P, threads, (long long)cfg.seq_len, H, Hkv, D,
                cfg.causal ? "causal" : "full", o.pass.c_str(), o.progress.c_str(),
                o.progress_cpus.empty() ? "" : (" progress-cpus=" + o.progress_cpus).c_str(), comm->backend().c_str());

  // Modes are interleaved rep by rep (full, compute-only, comm-only, full, ...), so slow
  // drifts of a shared machine hit every mode alike; medians over reps are reported.
  struct Samples {
    std::vector<double> tmax, comp, wait, flops, busy;
    int64_t bytes = 0;
  };
  std::map<cp::Mode, Samples> samples;
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    for (cp::Mode mode : modes) {
      cfg.mode = mode;
      cp::Context ctx{*comm, cfg};
      if (o.pass == "bwd") scheme->forward(ctx, q, k, v, out, lse);
      ctx.reset();
      MPI_Barrier(MPI_COMM_WORLD);
      const double busy0 = comm->progress_busy_s();
      const double t0 = MPI_Wtime();
      if (o.pass != "bwd") scheme->forward(ctx, q, k, v, out, lse);
      if (o.pass != "fwd") scheme->backward(ctx, q, k, v, out, lse, dout, dq, dk, dv);
      Kokkos::fence();
      double t = MPI_Wtime() - t0, tm = 0;
      MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep < o.warmup) continue;
      Samples& sm = samples[mode];
      sm.tmax.push_back(tm);
      sm.comp.push_back(ctx.stats.compute_s);
      sm.wait.push_back(ctx.stats.comm_wait_s);
      sm.flops.push_back(ctx.stats.flops);
      sm.busy.push_back(comm->progress_busy_s() - busy0);
      sm.bytes = ctx.bytes_sent();
    }
    if (rank == 0 && o.reps + o.warmup > 3)
      std::fprintf(stderr, "\rminicp-cp-bench: rep %d/%d", rep + 1, o.warmup + o.reps);
  }
  if (rank == 0 && o.reps + o.warmup > 3) std::fprintf(stderr, "\n");
  std::map<cp::Mode, ModeResult> results;
  for (cp::Mode mode : modes) {
    Samples& sm = samples[mode];
    ModeResult r;
    r.t_max = median(sm.tmax);
    r.bytes = sm.bytes;
    double mine[4] = {median(sm.comp), median(sm.wait), median(sm.flops), median(sm.busy)};
    std::vector<double> all(4 * size_t(P));
    MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (int i = 0; i < P; ++i) {
      r.compute.push_back(all[4 * i]);
      r.wait.push_back(all[4 * i + 1]);
      r.flops.push_back(all[4 * i + 2]);
      r.busy.push_back(all[4 * i + 3]);
    }
    results[mode] = r;
  }
  if (rank != 0) return 0;

  auto imbalance = [](const std::vector<double>& x) {
    double mx = 0, sum = 0;
    for (double e : x) mx = std::max(mx, e), sum += e;
    return sum > 0 ? mx / (sum / double(x.size())) : 1.0;
  };
  std::printf("%-13s %10s %14s %14s %12s %12s %16s %16s %12s\n", "mode", "time [s]", "compute max[s]",
              "compute min[s]", "wait max[s]", "progress[s]", "GFLOP max/rank", "GFLOP min/rank", "MiB sent/r0");
  for (const auto& [mode, r] : results)
    std::printf("%-13s %10.4f %14.4f %14.4f %12.4f %12.4f %16.3f %16.3f %12.2f\n", cp::to_string(mode), r.t_max,
                *std::max_element(r.compute.begin(), r.compute.end()),
                *std::min_element(r.compute.begin(), r.compute.end()),
                *std::max_element(r.wait.begin(), r.wait.end()), *std::max_element(r.busy.begin(), r.busy.end()),
                *std::max_element(r.flops.begin(), r.flops.end()) / 1e9,
                *std::min_element(r.flops.begin(), r.flops.end()) / 1e9, double(r.bytes) / 1048576.0);
  const bool has_full = results.count(cp::Mode::Full), has_comp = results.count(cp::Mode::ComputeOnly),
             has_comm = results.count(cp::Mode::CommOnly);
  const ModeResult& basis = has_comp ? results[cp::Mode::ComputeOnly] : results.begin()->second;
  const double imb = imbalance(basis.compute), flop_imb = imbalance(basis.flops);
  double overlap = -1, overlap_q1 = -1, overlap_q3 = -1, exposed_s = -1;
  std::string summary = "MINICP_CP scheme=" + o.scheme + " ranks=" + std::to_string(P) +
                        " threads=" + std::to_string(threads) + " S=" + std::to_string(cfg.seq_len) +
                        " pass=" + o.pass + " progress=" + o.progress;
  char buf[256];
  for (const auto& [mode, r] : results) {
    std::snprintf(buf, sizeof buf, " T_%s_s=%.5f", cp::to_string(mode), r.t_max);
    summary += buf;
  }
  if (has_full && has_comp && has_comm) {
    // Exposed comm from paired differences: rep i's full and compute-only runs are adjacent
    // in time, so the median of T_full_i - T_compute_i cancels the machine's drift; the
    // quartiles of the pairs give the spread.
    const auto& F = samples[cp::Mode::Full].tmax;
    const auto& C = samples[cp::Mode::ComputeOnly].tmax;
    std::vector<double> diff;
    for (size_t i = 0; i < F.size(); ++i) diff.push_back(F[i] - C[i]);
    std::sort(diff.begin(), diff.end());
    const double tm = results[cp::Mode::CommOnly].t_max, tc = results[cp::Mode::ComputeOnly].t_max;
    const double exposed = median(diff), q1 = diff[diff.size() / 4], q3 = diff[(3 * diff.size()) / 4];
    overlap = 1.0 - exposed / tm;
    exposed_s = exposed;
    overlap_q1 = 1.0 - q3 / tm;
    overlap_q3 = 1.0 - q1 / tm;
    std::printf("overlap = 1 - (T_full - T_compute) / T_comm = 1 - %.5f / %.5f = %.3f  (quartiles %.3f .. %.3f; "
                "T_compute/T_comm = %.1f)\n",
                exposed, tm, overlap, 1.0 - q3 / tm, 1.0 - q1 / tm, tc / tm);
    std::snprintf(buf, sizeof buf, " overlap=%.3f overlap_q1=%.3f overlap_q3=%.3f", overlap, 1.0 - q3 / tm,
                  1.0 - q1 / tm);
    summary += buf;
  }
  std::printf("load imbalance (max/mean compute time per rank) = %.3f; executed FLOPs max/mean = %.3f\n", imb,
              flop_imb);
  std::snprintf(buf, sizeof buf, " imbalance=%.3f flop_imbalance=%.3f", imb, flop_imb);
  summary += buf;
  std::printf("%s\n", summary.c_str());
  if (!o.json.empty()) {
    const std::string tmp = o.json + ".tmp";
    std::ofstream f(tmp);
    f << "{\"scheme\": \"" << o.scheme << "\", \"ranks\": " << P << ", \"threads\": " << threads
      << ", \"seq_len\": " << cfg.seq_len << ", \"heads\": " << H << ", \"kv_heads\": " << Hkv
      << ", \"head_dim\": " << D << ", \"causal\": " << (cfg.causal ? "true" : "false") << ", \"pass\": \""
      << o.pass << "\", \"progress\": \"" << o.progress << "\", \"progress_cpus\": \"" << o.progress_cpus << "\", \"comm\": \"" << comm->backend()
      << "\", \"overlap\": " << overlap << ", \"overlap_q1\": " << overlap_q1
      << ", \"overlap_q3\": " << overlap_q3 << ", \"exposed_comm_s\": " << exposed_s
      << ", \"imbalance\": " << imb << ", \"flop_imbalance\": " << flop_imb << ", \"modes\": {";
    bool first = true;
    for (const auto& [mode, r] : results) {
      f << (first ? "" : ", ") << "\"" << cp::to_string(mode) << "\": {\"time_s\": " << r.t_max
        << ", \"bytes_sent_rank0\": " << r.bytes << ", \"compute_s\": [";
      for (int i = 0; i < P; ++i) f << (i ? ", " : "") << r.compute[i];
      f << "], \"wait_s\": [";
      for (int i = 0; i < P; ++i) f << (i ? ", " : "") << r.wait[i];
      f << "], \"progress_s\": [";
      for (int i = 0; i < P; ++i) f << (i ? ", " : "") << r.busy[i];
      f << "], \"flops\": [";
      for (int i = 0; i < P; ++i) f << (i ? ", " : "") << r.flops[i];
      f << "]}";
      first = false;
    }
    f << "}}\n";
    f.close();
    std::rename(tmp.c_str(), o.json.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  int rc = 0;
  bool help = false;  // --help: CLI11's list of options only, without Kokkos' own
  for (int i = 1; i < argc; ++i) help = help || std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
  if (help) {
    rc = run(argc, argv, rank, P);
  } else {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = run(argc, argv, rank, P);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "minicp-cp-bench (rank %d): %s\n", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
}
