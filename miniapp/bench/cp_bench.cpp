// minicp-cp-bench: runs one CP scheme on this MPI job's ranks in the modes full,
// compute-only and comm-only and prints per-rank compute, the load imbalance (max/mean of
// per-rank compute time) and overlap = 1 - (T_full - T_compute) / T_comm (the figures are
// defined in harness/stats.hpp).
//
// main is: parse (options -> Plan, every check: ranges, the scheme's constraints, the --json
// path and the predicted memory, before anything is allocated), then build (tensors,
// communicator, scheme), measure (interleaved reps -> samples) and report (table, the
// MINICP_CP line, JSON).
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/main.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"
#include "harness/stats.hpp"
#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/run/dtype.hpp"

namespace {
using namespace minicp;
namespace hn = minicp::harness;
using hn::UsageError;

// The file_kind of the JSON this program writes: an existing --json without it is another
// program's file, replaced only with --overwrite.
const char* const kFileKind = "minicp-cp-bench";

struct Options {
  std::string scheme = "zigzag";
  int64_t seq = 8192;
  int heads = 8, kv_heads = 8, head_dim = 128;
  cp::MaskSpec mask;
  int tile = 0;
  std::string pass = "fwdbwd", modes = "full,compute-only,comm-only", progress = "thread", progress_cpus,
              staging = "auto", json, dtype = "f32";
  bool overwrite = false;  // --overwrite: an existing --json of another kind may be replaced
  int reps = 3, warmup = 1, poll_us = 50;
};

// Everything the parse step decided, checked.
struct Plan {
  Options o;
  cp::Config cfg;
  const cp::SchemeInfo* info = nullptr;
  std::vector<cp::Mode> modes;
  comm::Progress progress = comm::Progress::Thread;
  std::vector<int> progress_cpus;
  comm::Staging staging = comm::Staging::Direct;
};

std::string kebab(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// cp::check's sentences name Config keys with their values ("zigzag needs seq_len (100)
// divisible by 2*ranks (8)"); this prefixes the flags that set those keys:
// "--seq 100: zigzag needs seq_len (100) divisible by 2*ranks (8)".
std::string with_flags(const std::string& why) {
  std::map<std::string, std::string> flag = {
      {"seq_len", "--seq"},   {"heads", "--heads"},     {"kv_heads", "--kv-heads"},          {"head_dim", "--head-dim"},
      {"window", "--window"}, {"doc_len", "--doc-len"}, {"decode_tokens", "--decode-tokens"}};
  for (const cp::Setting& st : cp::all_settings()) flag[st.name] = "--" + kebab(st.name);
  std::string prefix;
  const std::regex key_value("([a-z_]+) \\(([^)]*)\\)");
  for (auto it = std::sregex_iterator(why.begin(), why.end(), key_value); it != std::sregex_iterator(); ++it) {
    const auto f = flag.find((*it)[1].str());
    if (f == flag.end()) continue;
    const std::string named = f->second + " " + (*it)[2].str();
    if (prefix.find(named) == std::string::npos) prefix += (prefix.empty() ? "" : ", ") + named;
  }
  return prefix.empty() ? why : prefix + ": " + why;
}

// --modes: a comma list, each mode once.
std::vector<cp::Mode> parse_modes(const std::string& list) {
  std::vector<cp::Mode> modes;
  for (const auto& m : hn::split_list(list)) {
    try {
      modes.push_back(cp::parse_mode(m));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--modes '" + list + "': " + e.what());
    }
    if (std::count(modes.begin(), modes.end(), modes.back()) > 1)
      throw UsageError("--modes '" + list + "': " + m + " is named twice; name each mode once");
  }
  if (modes.empty())
    throw UsageError("--modes '" + list + "': must name at least one of full, compute-only, comm-only");
  return modes;
}

// Every flag of the program, into o and cfg (a scheme's settings go to cfg.settings).
void declare_flags(CLI::App& app, Options& o, cp::Config& cfg) {
  std::string names;
  for (const auto& sc : cp::registry()) names += (names.empty() ? "" : ", ") + sc.name;
  app.add_option("--scheme", o.scheme, "CP scheme: " + names)->capture_default_str();
  hn::add_int(app, "--seq", o.seq, 1, hn::kNoMax, "global sequence length S, tokens");
  hn::add_int(app, "--heads", o.heads, 1, hn::kNoMax, "query heads");
  hn::add_int(app, "--kv-heads", o.kv_heads, 1, hn::kNoMax, "key/value heads");
  hn::add_int(app, "--head-dim", o.head_dim, 2, hn::kNoMax, "head dimension D (even)");
  app.add_option("--mask", o.mask.kind, "attention mask: " + hn::join_list(cp::Mask::kind_names()))
      ->capture_default_str();
  hn::add_int(app, "--window", o.mask.window, 0, hn::kNoMax, "sliding window, tokens (with --mask window)");
  hn::add_int(app, "--doc-len", o.mask.doc_len, 0, hn::kNoMax,
              "packed documents of this many tokens (with --mask documents)");
  hn::add_int(app, "--decode-tokens", cfg.decode_tokens, 1, hn::kNoMax,
              "decode: query tokens decoded against the KV cache (tokens)");
  for (const cp::Setting& st : cp::all_settings())  // the schemes' own settings, from the registry
    hn::add_int(app, "--" + kebab(st.name), cfg.settings[st.name], st.min_value, hn::kNoMax, st.help);
  hn::add_int(app, "--tile", o.tile, 0, hn::kNoMax, "attention tile size, tokens (0 kernel default)");
  app.add_option("--dtype", o.dtype,
                 "stored values: f32, f64, or bf16 (bf16 tensors and K/V messages; merges, LSE and dK/dV "
                 "accumulators fp32)")
      ->capture_default_str();
  app.add_option("--pass", o.pass, "fwd, bwd (timed alone, after an untimed fwd) or fwdbwd")->capture_default_str();
  app.add_option("--modes", o.modes, "comma list of full, compute-only, comm-only")->capture_default_str();
  hn::add_int(app, "--reps", o.reps, 1, hn::kNoMax, "timed repetitions per mode (median reported)");
  hn::add_int(app, "--warmup", o.warmup, 0, hn::kNoMax, "untimed repetitions per mode");
  app.add_option("--progress", o.progress, "communication progress: none or thread")->capture_default_str();
  hn::add_int(app, "--poll-us", o.poll_us, 1, hn::kNoMax, "progress thread polling interval, microseconds");
  app.add_option("--progress-cpus", o.progress_cpus,
                 "pin each node-local rank's progress thread to a CPU of this comma list (local rank i: entry i "
                 "mod length); default: not pinned")
      ->capture_default_str();
  app.add_option("--staging", o.staging,
                 "MPI buffers: direct (MPI reads the tensors), host (copied through host staging buffers, "
                 "for device memory and an MPI that is not GPU-aware) or auto (host exactly then)")
      ->capture_default_str();
  app.add_option("--json", o.json,
                 "write the results to this JSON file (rank 0; checked before the run, an old file is removed when "
                 "the run starts, the new one renamed into place at the end)");
  app.add_flag("--overwrite", o.overwrite,
               "replace an existing --json that is not a minicp-cp-bench result (default: off)");
  app.footer(
      "Kokkos flags (--kokkos-threads=N or --kokkos-num-threads=N, 1 to 512) go to Kokkos. Exit status: 0 ok, 2 bad "
      "command line.");
}

// The flags that name a choice (dtype, pass, scheme, modes, progress, staging, CPUs), into p.
void check_choices(Plan& p) {
  const Options& o = p.o;
  if (o.dtype != "f32" && o.dtype != "f64" && o.dtype != "bf16")
    throw UsageError("--dtype '" + o.dtype + "': must be one of f32, f64, bf16");
  if (o.head_dim % 2) throw UsageError("--head-dim " + std::to_string(o.head_dim) + ": must be even and >= 2");
  if (o.pass != "fwd" && o.pass != "bwd" && o.pass != "fwdbwd")
    throw UsageError("--pass '" + o.pass + "': must be one of fwd, bwd, fwdbwd");
  try {
    p.info = &cp::find(o.scheme);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--scheme: " + std::string(e.what()));
  }
  p.modes = parse_modes(o.modes);
  try {
    p.progress = comm::parse_progress(o.progress);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--progress: " + std::string(e.what()));
  }
  try {
    p.staging = o.staging == "auto" ? comm::staging_for(kernels::kHostMemory) : comm::parse_staging(o.staging);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--staging " + o.staging + ": not one of direct, host, auto");
  }
  try {
    p.progress_cpus = comm::parse_cpu_list(o.progress_cpus, "--progress-cpus");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!p.progress_cpus.empty() && p.progress != comm::Progress::Thread)
    throw UsageError("--progress-cpus '" + o.progress_cpus + "' needs --progress thread (got --progress " + o.progress +
                     ")");
}

// Options -> Plan with every check, on every rank alike; throws UsageError.
Plan parse(const hn::Args& a) {
  Plan p;
  Options& o = p.o;
  cp::Config& cfg = p.cfg;
  CLI::App app{"minicp-cp-bench: one CP scheme in modes full / compute-only / comm-only", a.prog()};
  declare_flags(app, o, cfg);
  hn::parse(app, a);
  if (const std::string e = kernels::attention_isa_error(); !e.empty()) throw UsageError(e);
  check_choices(p);
  cfg.seq_len = o.seq;
  cfg.heads = o.heads;
  cfg.kv_heads = o.kv_heads;
  cfg.head_dim = o.head_dim;
  if (const std::string why = cp::Mask::problem(o.mask, {"--mask", "--window", "--doc-len", ""}); !why.empty())
    throw UsageError(why);
  cfg.mask = cp::Mask::from(o.mask);
  cfg.ranks = a.size();
  cfg.problem = p.info->problems.front();
  cfg.attn.tile_q = cfg.attn.tile_k = o.tile;
  const std::string why = cp::check(*p.info, cfg);
  if (!why.empty()) throw UsageError(with_flags(why));
  if (o.pass != "fwd" && !p.info->has_backward())
    throw UsageError("--scheme " + o.scheme +
                     " solves only the decode problem, which has no backward pass: "
                     "use --pass fwd");

  // Memory, named by --seq and the other size flags given.
  std::string what = "--seq " + std::to_string(o.seq);
  for (const char* f : {"--heads", "--kv-heads", "--head-dim"})
    if (app.count(f)) what += std::string(" ") + f + " " + app.get_option(f)->as<std::string>();
  hn::check_memory(a, what, double(cp::predicted_bytes(*p.info, cfg, run::elem_size(o.dtype))),
                   comm::Communicator::node_topology().local_size);
  if (app.count("--json"))
    hn::check_outputs(a, {{"--json", o.json, "a minicp-cp-bench result", hn::json_file_kind(kFileKind)}}, o.overwrite);
  return p;
}

// Deterministic value in [-1, 1) from (seed, global index).
double hash_unit(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Local rows of a global [tokens, heads, D] tensor seeded by the global token index.
template <class T>
kernels::View3<T> local_rows(const std::vector<int64_t>& idx, int64_t offset, int heads, int D, uint64_t seed) {
  kernels::View3<T> v("x", idx.size(), heads, D);
  auto h = Kokkos::create_mirror_view(v);
  for (size_t i = 0; i < idx.size(); ++i)
    for (int a = 0; a < heads; ++a)
      for (int d = 0; d < D; ++d)
        h(i, a, d) = T(float(hash_unit(seed, (uint64_t(idx[i] - offset) * heads + a) * D + d)));
  Kokkos::deep_copy(v, h);
  return v;
}

// One rank's tensors (T stored, the LSE in acc_t<T>), communicator and scheme object.
template <class T>
struct Setup {
  kernels::View3<T> q, k, v, dout, out, dq, dk, dv;
  kernels::View2<kernels::acc_t<T>> lse;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<cp::Scheme<T>> scheme;
  int threads = 1;
};

template <class T>
Setup<T> build(const Plan& p, int rank) {
  const cp::Config& cfg = p.cfg;
  const int64_t q0 = cp::first_q_position(cfg);
  const cp::Shard sh = p.info->shard(cfg, rank);
  const int H = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  Setup<T> s;
  s.q = local_rows<T>(sh.q, q0, H, D, 1);
  s.dout = local_rows<T>(sh.q, q0, H, D, 4);
  s.k = local_rows<T>(sh.kv, 0, Hkv, D, 2);
  s.v = local_rows<T>(sh.kv, 0, Hkv, D, 3);
  s.out = kernels::View3<T>("o", sh.q.size(), H, D);
  s.dq = kernels::View3<T>("dq", sh.q.size(), H, D);
  s.dk = kernels::View3<T>("dk", sh.kv.size(), Hkv, D);
  s.dv = kernels::View3<T>("dv", sh.kv.size(), Hkv, D);
  s.lse = kernels::View2<kernels::acc_t<T>>("lse", sh.q.size(), H);
  s.comm = comm::make_mpi_comm(p.progress, p.o.poll_us, p.progress_cpus, p.staging);
  s.comm->trace().set_enabled(false);
  s.scheme = cp::make_scheme<T>(*p.info);
  s.threads = int(kernels::Exec().concurrency());
  if (rank == 0)
    std::printf(
        "minicp-cp-bench: scheme=%s ranks=%d threads/rank=%d S=%lld H=%d Hkv=%d D=%d dtype=%s mask=\"%s\" "
        "pass=%s progress=%s%s comm=%s\n",
        p.o.scheme.c_str(), cfg.ranks, s.threads, (long long)cfg.seq_len, H, Hkv, D, p.o.dtype.c_str(),
        cfg.mask.describe().c_str(), p.o.pass.c_str(), p.o.progress.c_str(),
        p.o.progress_cpus.empty() ? "" : (" progress-cpus=" + p.o.progress_cpus).c_str(), s.comm->backend().c_str());
  return s;
}

// Per-rep samples of one mode on this rank.
struct Samples {
  std::vector<double> tmax, comp, wait, flops, busy;  // tmax: slowest rank's time
  int64_t bytes = 0;                                  // this rank's bytes per rep
};

// Modes are interleaved rep by rep (full, compute-only, comm-only, full, ...), so slow
// drifts of a shared machine hit every mode alike.
template <class T>
std::map<cp::Mode, Samples> measure(const Plan& p, Setup<T>& s, int rank) {
  const Options& o = p.o;
  cp::Config cfg = p.cfg;
  std::map<cp::Mode, Samples> samples;
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    for (cp::Mode mode : p.modes) {
      cfg.mode = mode;
      cp::Context ctx{*s.comm, cfg};
      if (o.pass == "bwd") s.scheme->forward(ctx, s.q, s.k, s.v, s.out, s.lse);
      ctx.reset();
      MPI_Barrier(MPI_COMM_WORLD);
      const double busy0 = s.comm->progress_busy_s();
      const double t0 = MPI_Wtime();
      if (o.pass != "bwd") s.scheme->forward(ctx, s.q, s.k, s.v, s.out, s.lse);
      if (o.pass != "fwd") s.scheme->backward(ctx, s.q, s.k, s.v, s.out, s.lse, s.dout, s.dq, s.dk, s.dv);
      Kokkos::fence();
      double t = MPI_Wtime() - t0, tm = 0;
      MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep < o.warmup) continue;
      Samples& sm = samples[mode];
      sm.tmax.push_back(tm);
      sm.comp.push_back(ctx.stats.compute_s);
      sm.wait.push_back(ctx.stats.comm_wait_s);
      sm.flops.push_back(ctx.stats.flops);
      sm.busy.push_back(s.comm->progress_busy_s() - busy0);
      sm.bytes = ctx.bytes_sent();
    }
    // On a terminal one line rewritten; in a log (a batch job's) one line per rep.
    if (rank == 0 && o.reps + o.warmup > 3)
      std::fprintf(stderr, tty ? "\rminicp-cp-bench: rep %d/%d" : "minicp-cp-bench: rep %d/%d\n", rep + 1,
                   o.warmup + o.reps);
  }
  if (rank == 0 && tty && o.reps + o.warmup > 3) std::fprintf(stderr, "\n");
  return samples;
}

// One mode's medians over reps: the slowest rank's time, and per rank (gathered on rank 0).
struct ModeResult {
  double t_max = 0;
  std::vector<double> compute, wait, flops, busy;  // busy: progress thread inside MPI
  int64_t bytes = 0;                               // rank 0's bytes per rep
};

std::map<cp::Mode, ModeResult> gather(const Plan& p, std::map<cp::Mode, Samples>& samples) {
  const int P = p.cfg.ranks;
  std::map<cp::Mode, ModeResult> results;
  for (cp::Mode mode : p.modes) {
    const Samples& sm = samples[mode];
    ModeResult r;
    r.t_max = hn::median(sm.tmax);
    r.bytes = sm.bytes;
    double mine[4] = {hn::median(sm.comp), hn::median(sm.wait), hn::median(sm.flops), hn::median(sm.busy)};
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
  return results;
}

double max_of(const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()); }
double min_of(const std::vector<double>& x) { return *std::min_element(x.begin(), x.end()); }

// Rank 0: the table, the figures of merit, the MINICP_CP line and the JSON file.
void report(const Plan& p, int threads, const std::string& backend, std::map<cp::Mode, Samples>& samples,
            std::map<cp::Mode, ModeResult>& results) {
  const Options& o = p.o;
  const cp::Config& cfg = p.cfg;
  const int P = cfg.ranks;
  std::printf("%-13s %10s %14s %14s %12s %12s %16s %16s %12s\n", "mode", "time [s]", "compute max[s]", "compute min[s]",
              "wait max[s]", "progress[s]", "GFLOP max/rank", "GFLOP min/rank", "MiB sent/r0");
  for (const auto& [mode, r] : results)
    std::printf("%-13s %10.4f %14.4f %14.4f %12.4f %12.4f %16.3f %16.3f %12.2f\n", cp::to_string(mode), r.t_max,
                max_of(r.compute), min_of(r.compute), max_of(r.wait), max_of(r.busy), max_of(r.flops) / 1e9,
                min_of(r.flops) / 1e9, double(r.bytes) / 1048576.0);
  const bool has_full = results.count(cp::Mode::Full), has_comp = results.count(cp::Mode::ComputeOnly),
             has_comm = results.count(cp::Mode::CommOnly);
  const ModeResult& basis = has_comp ? results[cp::Mode::ComputeOnly] : results.begin()->second;
  const double imb = hn::imbalance(basis.compute), flop_imb = hn::imbalance(basis.flops);
  std::string summary = "MINICP_CP scheme=" + o.scheme + " ranks=" + std::to_string(P) +
                        " threads=" + std::to_string(threads) + " dtype=" + o.dtype +
                        " S=" + std::to_string(cfg.seq_len) + " pass=" + o.pass + " progress=" + o.progress;
  char buf[256];
  for (const auto& [mode, r] : results) {
    std::snprintf(buf, sizeof buf, " T_%s_s=%.5f", cp::to_string(mode), r.t_max);
    summary += buf;
  }
  hn::Overlap ov = hn::not_measured();
  if (has_full && has_comp && has_comm) {
    const double tm = results[cp::Mode::CommOnly].t_max, tc = results[cp::Mode::ComputeOnly].t_max;
    ov = hn::paired_overlap(samples[cp::Mode::Full].tmax, samples[cp::Mode::ComputeOnly].tmax, tm);
    if (ov.measured()) {
      std::printf(
          "overlap = 1 - (T_full - T_compute) / T_comm = 1 - %.5f / %.5f = %.3f  (quartiles %.3f .. %.3f; "
          "T_compute/T_comm = %.1f)\n",
          ov.exposed_s, tm, ov.overlap, ov.overlap_q1, ov.overlap_q3, tc / tm);
      std::snprintf(buf, sizeof buf, " overlap=%.3f overlap_q1=%.3f overlap_q3=%.3f", ov.overlap, ov.overlap_q1,
                    ov.overlap_q3);
      summary += buf;
    } else {
      std::printf("overlap: not measured (T_comm = %.5f s): %s\n", tm, ov.unresolved.c_str());
    }
  }
  std::printf("load imbalance (max/mean compute time per rank) = %.3f; executed FLOPs max/mean = %.3f\n", imb,
              flop_imb);
  std::snprintf(buf, sizeof buf, " imbalance=%.3f flop_imbalance=%.3f", imb, flop_imb);
  summary += buf;
  std::printf("%s\n", summary.c_str());
  std::fflush(stdout);
  if (o.json.empty()) return;

  hn::Json js;
  js["file_kind"] = kFileKind;
  js["scheme"] = o.scheme;
  js["ranks"] = P;
  js["threads"] = threads;
  js["dtype"] = o.dtype;
  js["gemm_bf16_engine"] = kernels::gemm_bf16_engine();
  js["attention_isa"] = kernels::attention_isa();
  js["seq_len"] = cfg.seq_len;
  js["heads"] = cfg.heads;
  js["kv_heads"] = cfg.kv_heads;
  js["head_dim"] = cfg.head_dim;
  js["mask"] = cfg.mask.name();
  js["mask_description"] = cfg.mask.describe();
  js["pass"] = o.pass;
  js["progress"] = o.progress;
  js["progress_cpus"] = o.progress_cpus;
  js["comm"] = backend;
  js["overlap"] = ov.overlap;  // null when not measured
  js["overlap_q1"] = ov.overlap_q1;
  js["overlap_q3"] = ov.overlap_q3;
  js["exposed_comm_s"] = ov.exposed_s;
  js["imbalance"] = imb;
  js["flop_imbalance"] = flop_imb;
  js["modes"] = hn::Json::object();
  for (const auto& [mode, r] : results)
    js["modes"][cp::to_string(mode)] = {{"time_s", r.t_max}, {"bytes_sent_rank0", r.bytes}, {"compute_s", r.compute},
                                        {"wait_s", r.wait},  {"progress_s", r.busy},        {"flops", r.flops}};
  hn::write_json("--json", o.json, js);
}

int run_bench(const hn::Args& a, const Plan& p) {
  hn::remove_old_outputs(a, {{"--json", p.o.json}});  // a failed run leaves no old result behind
  return run::with_dtype(p.o.dtype, [&](auto tag) {
    Setup<decltype(tag)> s = build<decltype(tag)>(p, a.rank());
    auto samples = measure(p, s, a.rank());
    auto results = gather(p, samples);
    if (a.rank() == 0) report(p, s.threads, s.comm->backend(), samples, results);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  Plan plan;
  return hn::main(
      argc, argv, "minicp-cp-bench", [&](const hn::Args& a) { plan = parse(a); },
      [&](const hn::Args& a) { return run_bench(a, plan); });
}
