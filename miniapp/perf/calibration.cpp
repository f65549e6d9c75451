// The calibration table: its text form, lookups and the measurement (see calibration.hpp).
#include "miniapp/perf/calibration.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "comm/comm.hpp"
#include "harness/input.hpp"
#include "harness/stats.hpp"
#include "harness/watchdog.hpp"
#include "kernels/attention.hpp"
#include "kernels/ceiling.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/perf/predict.hpp"
#include "miniapp/run/dtype.hpp"

namespace minicp::perf {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// The collectives a coll row may name: those a scheme waits for before its compute.
bool coll_op(const std::string& op) {
  for (comm::EventKind k : {comm::EventKind::AllToAll, comm::EventKind::AllGather, comm::EventKind::ReduceScatter,
                            comm::EventKind::AllReduce})
    if (op == comm::to_string(k)) return true;
  return false;
}

double log_distance(int64_t a, int64_t b) {
  return std::abs(std::log(double(std::max<int64_t>(a, 1)) / double(std::max<int64_t>(b, 1))));
}

}  // namespace

std::string Calibration::text() const {
  std::ostringstream o;
  o << "# minicp calibration table (docs/DESIGN.md, \"The performance model\"); rows:\n"
       "#   sgemm THREADS FLOP/S | gemm DTYPE THREADS OPS M N K FLOP/S |\n"
       "#   attn DTYPE THREADS PASS D TQ TK S/FULL-TILE S/PARTIAL-TILE S/CALL S/TILE-TOUCHED (per tile and head) |\n"
       "#   elem DTYPE THREADS OP S/VALUE | link FABRIC SCOPE ALPHA_S BETA_B/S CPU_B/S [ALLREDUCE_B/S] |\n"
       "#   busy FABRIC SCOPE p2p|allreduce WIRE_B/S CPU_B/S | coll FABRIC SCOPE OP GROUP PAYLOAD_B S/CALL |\n"
       "#   posted FABRIC SCOPE allgather|reduce_scatter GROUP PAYLOAD_B S/CALL-NOT-HIDDEN |\n"
       "#   layer DTYPE THREADS C HD KD F N FWD_S BWD_S [GEMM_FWD_S GEMM_BWD_S [RANKS]] | info KEY VALUE\n";
  for (const auto& [k, v] : info) o << "info " << k << " " << v << "\n";
  for (const auto& [t, r] : sgemm) o << "sgemm " << t << " " << num(r) << "\n";
  for (const GemmRate& g : gemm)
    o << "gemm " << g.dtype << " " << g.threads << " " << g.ops << " " << g.m << " " << g.n << " " << g.k << " "
      << num(g.flops_per_s) << "\n";
  for (const AttnRate& a : attn)
    o << "attn " << a.dtype << " " << a.threads << " " << (a.backward ? "bwd" : "fwd") << " " << a.head_dim << " "
      << a.tile_q << " " << a.tile_k << " " << num(a.full_s) << " " << num(a.partial_s) << " " << num(a.call_s) << " "
      << num(a.tile_s) << "\n";
  for (const ElemRate& e : elem)
    o << "elem " << e.dtype << " " << e.threads << " " << e.op << " " << num(e.s_per_value) << "\n";
  for (const LinkRate& l : links)
    o << "link " << l.fabric << " " << l.scope << " " << num(l.alpha_s) << " " << num(l.beta_Bps) << " "
      << num(l.cpu_Bps) << (l.allreduce_Bps > 0 ? " " + num(l.allreduce_Bps) : "") << "\n";
  for (const BusyRate& b : busy)
    o << "busy " << b.fabric << " " << b.scope << " " << b.kind << " " << num(b.wire_Bps) << " " << num(b.cpu_Bps)
      << "\n";
  for (const CollTime& t : colls)
    o << (t.posted ? "posted " : "coll ") << t.fabric << " " << t.scope << " " << t.op << " " << t.group << " "
      << t.payload << " " << num(t.seconds) << "\n";
  for (const LayerTime& l : layers)
    o << "layer " << l.dtype << " " << l.threads << " " << l.hidden << " " << l.q_width << " " << l.kv_width << " "
      << l.ffn << " " << l.rows << " " << num(l.forward_s) << " " << num(l.backward_s)
      << (l.gemm_forward_s > 0 ? " " + num(l.gemm_forward_s) + " " + num(l.gemm_backward_s) : "")
      << (l.gemm_forward_s > 0 && l.ranks > 0 ? " " + std::to_string(l.ranks) : "") << "\n";
  return o.str();
}

void Calibration::merge(const Calibration& o) {
  for (const auto& [t, r] : o.sgemm) sgemm[t] = r;
  gemm.insert(gemm.end(), o.gemm.begin(), o.gemm.end());
  attn.insert(attn.end(), o.attn.begin(), o.attn.end());
  elem.insert(elem.end(), o.elem.begin(), o.elem.end());
  links.insert(links.end(), o.links.begin(), o.links.end());
  busy.insert(busy.end(), o.busy.begin(), o.busy.end());
  colls.insert(colls.end(), o.colls.begin(), o.colls.end());
  layers.insert(layers.end(), o.layers.begin(), o.layers.end());
  info.insert(info.end(), o.info.begin(), o.info.end());
}

const GemmRate* Calibration::find_gemm(const std::string& dtype, int threads, const std::string& ops, int64_t m,
                                       int64_t n, int64_t k) const {
  const GemmRate* best = nullptr;
  double best_d = 1e300;
  for (const GemmRate& g : gemm) {
    if (g.dtype != dtype || g.threads != threads) continue;
    const double d = log_distance(g.m, m) + log_distance(g.n, n) + log_distance(g.k, k) + (g.ops == ops ? 0 : 100);
    if (d < best_d) best_d = d, best = &g;
  }
  return best;
}

const AttnRate* Calibration::find_attn(const std::string& dtype, int threads, bool backward, int head_dim) const {
  const AttnRate* best = nullptr;
  for (const AttnRate& a : attn)
    if (a.dtype == dtype && a.threads == threads && a.backward == backward &&
        (!best || std::abs(a.head_dim - head_dim) < std::abs(best->head_dim - head_dim)))
      best = &a;
  return best;
}

const ElemRate* Calibration::find_elem(const std::string& dtype, int threads, const std::string& op) const {
  for (const ElemRate& e : elem)
    if (e.dtype == dtype && e.threads == threads && e.op == op) return &e;
  return nullptr;
}

const LinkRate* Calibration::find_link(const std::string& fabric, const std::string& scope) const {
  const LinkRate* found = nullptr;
  for (const LinkRate& l : links)
    if (l.fabric == fabric && l.scope == scope) found = &l;  // the last row wins (a later measurement)
  return found;
}

const BusyRate* Calibration::find_busy(const std::string& fabric, const std::string& scope,
                                       const std::string& kind) const {
  const BusyRate* found = nullptr;
  for (const BusyRate& b : busy)
    if (b.fabric == fabric && b.scope == scope && b.kind == kind) found = &b;  // the last row wins
  return found;
}

const LayerTime* Calibration::find_layer(const std::string& dtype, int threads, const model::Shape& s, int64_t rows,
                                         int ranks) const {
  // Ranks first: a layer with every core of the host busy runs slower than alone on it.
  auto key = [&](const LayerTime& l) {
    return std::pair{l.ranks > 0 && ranks > 0 ? log_distance(l.ranks, ranks) : 0.0, log_distance(l.rows, rows)};
  };
  const LayerTime* best = nullptr;
  for (const LayerTime& l : layers)
    if (l.dtype == dtype && l.threads == threads && l.hidden == s.hidden &&
        l.q_width == int64_t(s.heads) * s.head_dim && l.kv_width == int64_t(s.kv_heads) * s.head_dim &&
        l.ffn == s.ffn && log_distance(l.rows, rows) <= std::log(2.0) + 1e-9 &&
        (!best || key(l) <= key(*best)))  // the last row wins a tie
      best = &l;
  return best;
}

std::vector<int> Calibration::threads() const {
  std::set<int> t;
  for (const GemmRate& g : gemm) t.insert(g.threads);
  return {t.begin(), t.end()};
}

Calibration parse_calibration(const std::string& text, const std::string& source) {
  Calibration c;
  c.source = source;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (const size_t h = line.find('#'); h != std::string::npos) line.erase(h);
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind)) continue;
    auto bad = [&](const std::string& why) {
      return std::runtime_error(source + ":" + std::to_string(no) + ": " + why + " (row '" + kind +
                                "'; see the header of miniapp/perf/calibration.hpp)");
    };
    bool ok = true;
    if (kind == "info") {
      std::string k, v;
      ls >> k;
      std::getline(ls, v);
      c.info.emplace_back(k, v.empty() ? v : v.substr(1));
      continue;
    } else if (kind == "sgemm") {
      int t = 0;
      double r = 0;
      ok = bool(ls >> t >> r) && t > 0 && r > 0;
      if (ok) c.sgemm[t] = r;
    } else if (kind == "gemm") {
      GemmRate g;
      ok = bool(ls >> g.dtype >> g.threads >> g.ops >> g.m >> g.n >> g.k >> g.flops_per_s) && g.flops_per_s > 0 &&
           g.m > 0 && g.n > 0 && g.k > 0;
      if (ok) c.gemm.push_back(g);
    } else if (kind == "attn") {
      AttnRate a;
      std::string pass;
      ok = bool(ls >> a.dtype >> a.threads >> pass >> a.head_dim >> a.tile_q >> a.tile_k >> a.full_s >> a.partial_s >>
                a.call_s) &&
           (pass == "fwd" || pass == "bwd") && a.head_dim > 0 && a.tile_q > 0 && a.tile_k > 0 && a.full_s > 0 &&
           a.partial_s >= 0 && a.call_s >= 0;
      if (ok && !(ls >> a.tile_s)) a.tile_s = 0;  // optional column
      ok = ok && a.tile_s >= 0;
      a.backward = pass == "bwd";
      if (ok) c.attn.push_back(a);
    } else if (kind == "elem") {
      ElemRate e;
      ok = bool(ls >> e.dtype >> e.threads >> e.op >> e.s_per_value) && e.s_per_value >= 0;
      if (ok) c.elem.push_back(e);
    } else if (kind == "link") {
      LinkRate l;
      ok = bool(ls >> l.fabric >> l.scope >> l.alpha_s >> l.beta_Bps >> l.cpu_Bps) &&
           (l.scope == "intra" || l.scope == "inter") && l.alpha_s >= 0 && l.beta_Bps > 0 && l.cpu_Bps >= 0;
      if (ok && !(ls >> l.allreduce_Bps)) l.allreduce_Bps = 0;  // optional column
      ok = ok && l.allreduce_Bps >= 0;
      if (ok) c.links.push_back(l);
    } else if (kind == "busy") {
      BusyRate b;
      ok = bool(ls >> b.fabric >> b.scope >> b.kind >> b.wire_Bps >> b.cpu_Bps) &&
           (b.scope == "intra" || b.scope == "inter") && (b.kind == "p2p" || b.kind == "allreduce") && b.wire_Bps > 0 &&
           b.cpu_Bps >= 0;
      if (ok) c.busy.push_back(b);
    } else if (kind == "coll" || kind == "posted") {
      CollTime t;
      t.posted = kind == "posted";
      ok = bool(ls >> t.fabric >> t.scope >> t.op >> t.group >> t.payload >> t.seconds) &&
           (t.scope == "intra" || t.scope == "inter") && coll_op(t.op) && t.group >= 2 && t.payload > 0 &&
           (t.posted ? t.seconds >= 0 && (t.op == "allgather" || t.op == "reduce_scatter") : t.seconds > 0) &&
           t.seconds < 3600;
      if (ok) c.colls.push_back(t);
    } else if (kind == "layer") {
      LayerTime l;
      ok = bool(ls >> l.dtype >> l.threads >> l.hidden >> l.q_width >> l.kv_width >> l.ffn >> l.rows >> l.forward_s >>
                l.backward_s) &&
           l.threads > 0 && l.hidden > 0 && l.q_width > 0 && l.kv_width > 0 && l.ffn > 0 && l.rows > 0 &&
           l.forward_s > 0 && l.backward_s >= 0 && l.forward_s < 3600 && l.backward_s < 3600;
      std::string more;
      if (ok && ls >> more) {  // the GEMMs timed beside it (optional: tables written before had none)
        std::istringstream g(more);
        ok = bool(g >> l.gemm_forward_s) && bool(ls >> l.gemm_backward_s) && l.gemm_forward_s > 0 &&
             l.gemm_backward_s >= 0 && l.gemm_forward_s < 3600 && l.gemm_backward_s < 3600;
        if (ok && ls >> more) {  // the ranks computing at once (optional: tables written before had none)
          std::istringstream r(more);
          ok = bool(r >> l.ranks) && r.eof() && l.ranks > 0 && !(ls >> more);
        }
      }
      if (ok) c.layers.push_back(l);
    } else {
      throw bad("unknown row kind");
    }
    if (!ok) throw bad("malformed or out-of-range values");
  }
  return c;
}

Calibration read_calibration(const std::string& path) {
  return parse_calibration(harness::read_input_file(path, harness::kCalibrationFile), path);
}

namespace {

using kernels::Trans;

// The median of `reps` timed runs after one untimed one (seconds), all ranks starting
// together: the median, as a run reports the median rep (a best-of would read a few percent
// faster than the steps it predicts).
template <class Fn>
double median_time(MPI_Comm comm, int reps, Fn&& fn) {
  fn();
  Kokkos::fence();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    harness::Watchdog::instance().tick();  // the stall watchdog: each timed call is a step
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    fn();
    Kokkos::fence();
    t.push_back(MPI_Wtime() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// How many copies of `bytes` of operands fill 256 MiB, from 1 to `cap`: calls cycled through
// them read from memory, not from a cache the previous call warmed.
int copies_filling_memory(double bytes, double cap) {
  return int(std::max(1.0, std::min(cap, double(256 << 20) / bytes)));
}

// FLOP/s of one GEMM shape on this rank (OPS: "NN", "NT", "TN"), the median of 3 timed loops
// after one untimed. Short calls are repeated, cycling through operands and outputs that fill
// 256 MiB: a layer's calls read their weights from memory, not from a cache the previous call
// warmed (decode's GEMMs are bound by that read), and write their outputs (a weight gradient:
// C x F values from N rows) to memory no call touched lately. T is the stored type (bf16: the
// GEMM the layer runs, oneDNN's where built, summing in fp32).
template <class T>
double gemm_rate(MPI_Comm world, const std::string& ops, int64_t m, int64_t n, int64_t k) {
  const Trans ta = ops[0] == 'T' ? Trans::T : Trans::N, tb = ops[1] == 'T' ? Trans::T : Trans::N;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double bytes = double(m * k + k * n + m * n) * sizeof(T);
  const int copies = copies_filling_memory(bytes, std::min(32.0, 2e9 / flops));
  const int inner = std::max(copies, int(std::clamp(2e8 / flops, 1.0, 200.0)));
  std::vector<kernels::View2<T>> A, B, C;
  for (int i = 0; i < copies; ++i) {
    A.emplace_back("cal_a", ta == Trans::N ? m : k, ta == Trans::N ? k : m);
    B.emplace_back("cal_b", tb == Trans::N ? k : n, tb == Trans::N ? n : k);
    C.emplace_back("cal_c", m, n);
    Kokkos::deep_copy(A.back(), T(0.5));
    Kokkos::deep_copy(B.back(), T(0.25));
  }
  const double t = median_time(world, 3, [&] {
    for (int i = 0; i < inner; ++i) {
      const size_t j = size_t(i % copies);
      kernels::gemm<T>(ta, tb, 1, A[j], B[j], 0, C[j]);
    }
  });
  return flops * inner / t;
}

template <class T>
struct Measure {
  const CalibrationPlan& plan;
  MPI_Comm world;
  int threads;
  std::string dtype;
  bool verbose;
  int rank;

  void gemms(Calibration& out) {
    std::set<std::tuple<std::string, int64_t, int64_t, int64_t>> seen;
    for (const model::Shape& s : plan.shapes)
      for (int64_t N : plan.rows)
        for (bool bwd : {false, true})
          for (const LayerOp& op : layer_ops(s, N, bwd))
            if (!op.ops.empty()) seen.insert({op.ops, op.m, op.n, op.k});
    for (const auto& [ops, m, n, k] : seen)
      out.gemm.push_back({dtype, ops, threads, m, n, k, gemm_rate<T>(world, ops, m, n, k)});
    if (verbose && rank == 0) std::printf("minicp --calibrate: %zu GEMM shapes (%s)\n", seen.size(), dtype.c_str());
  }

  void elementwise(Calibration& out) {
    const model::Shape& s = plan.shapes.front();
    const int64_t N =
        std::max<int64_t>(256, std::min<int64_t>(4096, *std::max_element(plan.rows.begin(), plan.rows.end())));
    const int64_t C = s.hidden, F = s.ffn, H = s.heads, D = s.head_dim;
    kernels::View2<T> x("cal_x", N, C), y("cal_y", N, C), dy("cal_dy", N, C), a("cal_a", N, F), b("cal_b", N, F),
        g("cal_g", N, F), da("cal_da", N, F), db("cal_db", N, F);
    kernels::View1<T> w("cal_w", C);
    kernels::View1<kernels::acc_t<T>> dw("cal_dw", C), rstd("cal_rstd", N);  // fp32 for bf16, as the layer has them
    kernels::View3<T> q("cal_q", N, H, D);
    Kokkos::View<int64_t*, kernels::Mem> pos("cal_pos", N);
    Kokkos::deep_copy(x, T(0.5));
    Kokkos::deep_copy(w, T(1));
    Kokkos::deep_copy(a, T(0.1));
    Kokkos::deep_copy(b, T(0.2));
    Kokkos::deep_copy(dy, T(0.3));
    auto put = [&](const char* op, double values, double t) { out.elem.push_back({dtype, op, threads, t / values}); };
    const double nc = double(N) * C, nf = double(N) * F;
    put("rmsnorm_fwd", nc,
        median_time(world, 3, [&] { kernels::rmsnorm_fwd<T>(x, w, kernels::acc_t<T>(1e-5), y, rstd); }));
    put("rmsnorm_bwd", nc, median_time(world, 3, [&] { kernels::rmsnorm_bwd<T>(x, w, rstd, dy, y, dw); }));
    put("rope", double(N) * H * D, median_time(world, 3, [&] { kernels::rope_apply<T>(q, pos, 10000.0); }));
    put("swiglu_fwd", nf, median_time(world, 3, [&] { kernels::swiglu_fwd<T>(a, b, g); }));
    put("swiglu_bwd", nf, median_time(world, 3, [&] { kernels::swiglu_bwd<T>(a, b, g, da, db); }));
    put("copy", nc, median_time(world, 3, [&] { Kokkos::deep_copy(y, x); }));
  }

  // Whole calls at a few sizes, fully visible and causal-diagonal, fitted to
  // call + tiles_full x full + tiles_partial x partial (per head), relative least squares.
  void attention(Calibration& out) {
    std::set<int> dims;
    for (const model::Shape& s : plan.shapes) {
      if (!dims.insert(s.head_dim).second) continue;
      for (bool bwd : {false, true}) out.attn.push_back(attention_rate(s, bwd));
    }
    if (verbose && rank == 0) std::printf("minicp --calibrate: attention tiles (%s)\n", dtype.c_str());
  }

  AttnRate attention_rate(const model::Shape& s, bool bwd) {
    const int H = s.heads, Hkv = s.kv_heads, D = s.head_dim;
    const kernels::AttnTiles tiles = kernels::attention_default_tiles(bwd);
    std::vector<std::array<double, 5>> rows;  // call, full area, partial area, tiles, seconds
    // One call of queries at qs against keys at ks, timed (median of reps) as a row of the fit;
    // `cold`: its K and V are read from memory, cycling through copies, as a decode call in a
    // layer reads its cache a layer of weights after the last read (timed warm, the same call
    // read 7-16% faster than cold and than the layer's).
    auto time_call = [&](const Spans& qs, const Spans& ks, int reps, bool cold) {
      const int64_t nq = layout::count(qs), nk = layout::count(ks);
      // The kernel's output, LSE and gradients in the accumulator type (fp32 for bf16); the
      // backward reads the stored (rounded) output and its gradient, as a training step has them.
      using A = kernels::acc_t<T>;
      kernels::View3<T> q("cal_q", nq, H, D), k("cal_k", nk, Hkv, D), v("cal_v", nk, Hkv, D),
          o_stored("cal_os", nq, H, D);
      kernels::View3<A> o("cal_o", nq, H, D), dq("cal_dq", nq, H, D), dk("cal_dk", nk, Hkv, D),
          dv("cal_dv", nk, Hkv, D);
      kernels::View2<A> lse("cal_lse", nq, H);
      Kokkos::deep_copy(q, T(0.1));
      Kokkos::deep_copy(k, T(0.2));
      Kokkos::deep_copy(v, T(0.3));
      cp::Config c;
      c.seq_len = std::max(qs.front().start + nq, nk), c.heads = H, c.kv_heads = Hkv, c.head_dim = D, c.ranks = 1;
      const auto qp = cp::to_device(layout::expand(qs), "cal_qpos"), kp = cp::to_device(layout::expand(ks), "cal_kpos");
      kernels::AttnMask mask;
      mask.q_pos = qp, mask.k_pos = kp, mask.causal = true;
      kernels::attention_fwd<T>(q, k, v, mask, o, lse);
      if (bwd) Kokkos::deep_copy(o_stored, T(0.3));
      const int copies = cold ? copies_filling_memory(2.0 * double(nk * Hkv * D) * sizeof(T), 64) : 1;
      std::vector<kernels::View3<T>> kc{k}, vc{v};  // (copies) x (nk, Hkv, D)
      for (int i = 1; i < copies; ++i) {
        kc.emplace_back("cal_k", nk, Hkv, D), vc.emplace_back("cal_v", nk, Hkv, D);
        Kokkos::deep_copy(kc.back(), T(0.2)), Kokkos::deep_copy(vc.back(), T(0.3));
      }
      const double t =
          median_time(world, reps,
                      [&] {
                        for (size_t i = 0; i < size_t(copies); ++i)
                          if (bwd)
                            kernels::attention_bwd<T>(q, kc[i], vc[i], o_stored, lse, o_stored, mask, dq, dk, dv);
                          else
                            kernels::attention_fwd<T>(q, kc[i], vc[i], mask, o, lse);
                      }) /
          copies;
      const TileCount n = count_tiles(c, qs, ks, tiles);
      rows.push_back({1.0, n.full_area * H, n.partial_area * H, (n.full + n.partial) * H, t});
    };
    // Decode-sized calls (a few queries against a cache) weigh the per-call cost; decode runs
    // forward only, so only the forward's are read cold.
    for (int64_t m : {1024, 4096}) time_call({{m, 4, 1}}, {{0, m, 1}}, 5, !bwd);
    for (int64_t m : {256, 512, 1024})
      for (bool diag : {false, true}) time_call({{diag ? 0 : m, m, 1}}, {{0, m, 1}}, 3, false);
    const auto x = fit(rows);
    return AttnRate{dtype, threads, bwd, D, tiles.q, tiles.k, x[1], x[2], x[0], x[3]};
  }

  // Least squares of t ~ a0 + a1 area_full + a2 area_partial + a3 tiles (per call, per whole
  // tile's area, per tile touched whatever its area: the K/V loads of a decode call), each row
  // weighted by 1/t (relative errors); a negative coefficient is dropped and the rest fitted again.
  static std::array<double, 4> fit(const std::vector<std::array<double, 5>>& rows) {
    constexpr int K = 4;
    std::array<bool, K> use{true, true, true, true};
    for (int pass = 0; pass < K; ++pass) {
      double A[K][K] = {}, b[K] = {};
      for (const auto& r : rows) {
        const double w = 1.0 / (r[K] * r[K]);
        for (int i = 0; i < K; ++i) {
          if (!use[size_t(i)]) continue;
          b[i] += w * r[size_t(i)] * r[K];
          for (int j = 0; j < K; ++j)
            if (use[size_t(j)]) A[i][j] += w * r[size_t(i)] * r[size_t(j)];
        }
      }
      for (int i = 0; i < K; ++i)
        if (!use[size_t(i)]) A[i][i] = 1, b[i] = 0;
      for (int i = 0; i < K; ++i)  // Gaussian elimination (the system is small and positive definite)
        for (int j = i + 1; j < K; ++j) {
          const double f = A[j][i] / A[i][i];
          for (int k = i; k < K; ++k) A[j][k] -= f * A[i][k];
          b[j] -= f * b[i];
        }
      std::array<double, K> x{};
      for (int i = K - 1; i >= 0; --i) {
        double sum = b[i];
        for (int k = i + 1; k < K; ++k) sum -= A[i][k] * x[size_t(k)];
        x[size_t(i)] = sum / A[i][i];
      }
      bool negative = false;
      for (int i = 0; i < K; ++i)
        if (use[size_t(i)] && x[size_t(i)] < 0) use[size_t(i)] = false, negative = true;
      if (!negative) return x;
    }
    return {};
  }
};

// Half round trips between rank 0 and peer: the smallest of 8 bytes (alpha) and the best of
// 4 MiB (beta from the rest). Every rank calls it; only 0 and peer exchange.
std::pair<double, double> pingpong(MPI_Comm world, int rank, int peer) {
  const int big = 4 << 20;
  std::vector<char> buf(size_t(big), 1);
  auto half_rtt = [&](int bytes, int reps) {
    double best = 1e300;
    for (int i = 0; i < reps + 3; ++i) {
      harness::Watchdog::instance().tick();
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), bytes, MPI_CHAR, peer, 7, world);
        MPI_Recv(buf.data(), bytes, MPI_CHAR, peer, 7, world, MPI_STATUS_IGNORE);
      } else if (rank == peer) {
        MPI_Recv(buf.data(), bytes, MPI_CHAR, 0, 7, world, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), bytes, MPI_CHAR, 0, 7, world);
      }
      if (i >= 3) best = std::min(best, (MPI_Wtime() - t0) / 2);
    }
    return best;
  };
  const double alpha = half_rtt(8, 50), t = half_rtt(big, 8);
  // Alpha a sizable part of 4 MiB's time means the readings were disturbed (a rank descheduled
  // throughout): the bandwidth is then the whole time's, not a difference of two noisy ones.
  return {alpha, double(big) / std::max(1e-9, t > 10 * alpha ? t - alpha : t)};
}

// GEMMs in a loop as the compute a transfer runs beside: the deck's MLP up-projection.
struct GemmLoop {
  kernels::View2<float> a, b, c;  // (N, C), (C, F), (N, F)
  int iters = 1;
  GemmLoop(int64_t N, int64_t C, int64_t F) : a("busy_a", N, C), b("busy_b", C, F), c("busy_c", N, F) {
    Kokkos::deep_copy(a, 0.5f);
    Kokkos::deep_copy(b, 0.25f);
  }
  double run() {
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) kernels::gemm<float>(Trans::N, Trans::N, 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    return MPI_Wtime() - t0;
  }
};

// A link beside compute. Every rank runs the GEMM loop while traffic of one kind goes through
// a communicator with the run's progress: rank 0 and peer exchanging one message each way (p2p,
// a ring step: about 0.1 s of the link's traffic alone), or, with buckets > 0, every rank
// all-reducing that many 8 MiB buckets back to back (a layer's weight gradients during the
// backward of the layer below). Compute lost = the loop's time beside the traffic minus alone
// (medians of 3-7 interleaved pairs, after one that sets up the connections); the transfer ends when
// the trace says it completed (the progress thread finds it done while the loop runs). When it
// outlasts the loop, the rest is taken to have moved at the link's own rate after it (the
// model's rule, perf::overlap), so the rates are those of the part that moved beside compute.
// Rank 0's figures are returned; every rank calls it.
std::pair<double, double> busy_link(comm::Communicator& c, MPI_Comm world, int rank, int peer, int buckets,
                                    double isolated_Bps, GemmLoop& loop) {
  const int P = c.world().size;
  const int64_t bucket = int64_t(model::kGradBucketBytes);
  const bool allreduce = buckets > 0;
  // Rank 0's sizes: each rank timed the link by its own clock, and both sides must agree.
  MPI_Bcast(&isolated_Bps, 1, MPI_DOUBLE, 0, world);
  const int64_t bytes =
      allreduce ? bucket * buckets : std::clamp<int64_t>(int64_t(isolated_Bps * 0.1) >> 20, 1, 64) << 20;
  const int64_t leaving = allreduce ? comm::bytes_leaving(comm::EventKind::AllReduce, bucket, P) * buckets
                                    : (rank == 0 || rank == peer ? bytes : 0);
  const double transfer_s = double(leaving > 0 ? leaving : bytes) / isolated_Bps;  // alone
  loop.iters = 1;
  double one = loop.run();
  one = loop.run();
  // As many pairs as fit in about 4 s (3 to 7): the loss varies from pair to pair with how the
  // threads that move the data are scheduled beside the compute.
  int sizes[2] = {int(std::ceil(std::max(0.25, 1.5 * transfer_s) / std::max(one, 1e-6))), 0};
  sizes[1] = int(std::clamp(4.0 / (2 * sizes[0] * std::max(one, 1e-6)), 3.0, 7.0));
  MPI_Bcast(sizes, 2, MPI_INT, 0, world);
  loop.iters = sizes[0];
  const int trials = sizes[1];
  std::vector<char> send(size_t(bytes), 1), recv(size_t(bytes), 0);
  std::vector<double> alone, loaded, xfer;
  for (int trial = 0; trial <= trials; ++trial) {  // the first sets up the connections: not kept
    harness::Watchdog::instance().tick();
    MPI_Barrier(world);
    alone.push_back(loop.run());
    MPI_Barrier(world);
    c.trace().clear();
    const double t0 = MPI_Wtime();
    std::vector<comm::Request> reqs;
    if (allreduce) {
      for (int i = 0; i < buckets; ++i)
        reqs.push_back(c.iallreduce(send.data() + i * bucket, size_t(bucket / sizeof(float)), comm::DType::F32,
                                    comm::ReduceOp::Sum, c.world()));
    } else if (rank == 0 || rank == peer) {
      const int other = rank == 0 ? peer : 0;
      reqs.push_back(c.isendrecv(send.data(), size_t(bytes), other, recv.data(), size_t(bytes), other, c.world()));
    }
    loaded.push_back(loop.run());
    for (comm::Request& r : reqs) c.wait(r);
    double done = t0;
    for (const comm::Event& e : c.trace().events())
      if (e.kind == comm::EventKind::AllReduce || e.kind == comm::EventKind::SendRecv) done = std::max(done, e.t_end);
    xfer.push_back(done - t0);
    if (trial == 0) alone.clear(), loaded.clear(), xfer.clear();
  }
  using harness::median;
  const double t_alone = median(alone), t_loaded = median(loaded), t_xfer = median(xfer);
  if (leaving <= 0 || t_xfer <= 0) return {0.0, 0.0};
  const double beside = t_xfer <= t_loaded ? 1.0 : std::clamp(1 - (t_xfer - t_loaded) / transfer_s, 0.0, 1.0);
  const double moved = beside * double(leaving);  // bytes that moved while the loop ran
  // Nothing moved beside compute (no progress while it runs): 1 B/s, so the model moves it all after.
  const double wire = beside >= 1 ? double(leaving) / t_xfer : std::max(1.0, moved / t_loaded);
  const double lost = t_loaded - t_alone;
  // A loss within the loop's own noise (2%) is no loss.
  const double cpu = lost > 0.02 * t_alone && moved > 0 ? moved / lost : 0;
  return {wire, cpu};
}

// Seconds per call of op at payload on group g, posted beside compute as the allgather
// scheme's pass posts it (time_collectives, below), the slowest member's mean.
double time_posted(comm::Communicator& c, MPI_Comm world, const comm::Group& g, comm::EventKind op, int64_t payload,
                   GemmLoop& beside) {
  constexpr int kPosted = 4, kSteps = 4;  // a chunk's calls (K and V, two halves); a pass's chunks
  const size_t count = size_t(std::max<int64_t>(1, payload / int64_t(sizeof(float))));
  const size_t each = size_t(payload) * size_t(g.size) + sizeof(float);  // one call's buffers
  std::vector<char> send(each * 2 * kPosted, 1), recv(each * 2 * kPosted, 0);
  std::vector<comm::Request> slot[2];
  auto post = [&](int s) {
    for (int j = 0; j < kPosted; ++j) {
      char* sb = send.data() + size_t(s * kPosted + j) * each;
      char* rb = recv.data() + size_t(s * kPosted + j) * each;
      slot[s].push_back(op == comm::EventKind::AllGather ? c.iallgather(sb, rb, size_t(payload), g)
                                                         : c.ireduce_scatter(sb, rb, count, comm::DType::F32, g));
    }
  };
  auto wait = [&](int s) {
    for (comm::Request& r : slot[s]) c.wait(r);
    slot[s].clear();
  };
  auto pass = [&](bool with_calls) {
    harness::Watchdog::instance().tick();
    MPI_Barrier(world);
    const double t0 = MPI_Wtime();
    if (with_calls) post(0);
    for (int k = 0; k < kSteps; ++k) {
      if (with_calls && k + 1 < kSteps) post((k + 1) % 2);
      if (with_calls) wait(k % 2);
      beside.run();
    }
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
    return t;
  };
  pass(true), pass(false);  // connections set up
  int reps = int(std::clamp(0.3 / std::max(pass(true), 1e-7), 10.0, 50.0));
  MPI_Bcast(&reps, 1, MPI_INT, 0, world);
  double with = 0, alone = 0;
  for (int i = 0; i < reps; ++i) with += pass(true), alone += pass(false);
  // Per call posted beside compute (the model's overlapped calls); the first chunk's, which
  // the model charges as blocking calls, are in the sum: under UCX here a pass took 15 ms
  // beyond its compute, its first chunk's 4 calls 0.6 ms when blocking.
  return std::max(0.0, (with - alone) / reps / (kPosted * (kSteps - 1)));
}

// The collectives of `calls`, each at once on every group of its size (split as the schemes
// split: consecutive ranks, else strided when only those span nodes as the call does).
// Without `beside` (plan.exposed), blocking: a barrier before each call, the slowest
// member's time, averaged over 20-200 calls (about 0.1 s) after 2 that set up the
// connections: a step pays each call's mean, the rare call that waits milliseconds for a
// descheduled rank included.
// Per op, group and scope at most 6 sizes, spread over the range (the model interpolates).
// With `beside` (the posted calls): each size as the allgather scheme's pass posts it: the
// first chunk's 4 calls (K and V, two halves) posted, then per step the next chunk's 4 posted,
// the current chunk's 4 waited for and the GEMM loop (the chunk's compute); 4 steps,
// interleaved with 4 loops alone; the slowest member's mean time beyond the loops', per call
// posted beside compute (`posted` rows). Up to 8 calls are in flight, as in the scheme. Timed
// with one chunk waited for before the next is posted, the same calls read 4x less under UCX
// here: the cost is that of calls in flight together.
std::vector<CollTime> time_collectives(comm::Communicator& c, MPI_Comm world, const CalibrationPlan& plan,
                                       const comm::Topology& topo, const std::vector<CommCall>& calls,
                                       GemmLoop* beside) {
  const int P = c.world().size;
  auto spans = [&](int base, int size, int stride) {
    for (int i = 1; i < size; ++i)
      if (topo.node_of_rank[size_t(base + i * stride)] != topo.node_of_rank[size_t(base)]) return true;
    return false;
  };
  std::map<std::tuple<comm::EventKind, int, bool>, std::set<int64_t>> sizes;
  for (const CommCall& e : calls)
    if (e.group >= 2 && e.group <= P && P % e.group == 0 && e.payload > 0 && coll_op(comm::to_string(e.op)))
      sizes[{e.op, e.group, e.inter}].insert(e.payload);
  std::map<std::pair<int, bool>, comm::Group> groups;  // (size, strided): split once
  auto group_of = [&](int size, bool strided) -> const comm::Group& {
    auto it = groups.find({size, strided});
    if (it == groups.end()) {
      const std::string name = "calibrate_" + std::to_string(size) + (strided ? "s" : "c");
      it = groups
               .emplace(std::pair{size, strided}, size == P ? c.world()
                                                  : strided ? c.split_strided(size, name)
                                                            : c.split_contiguous(size, name))
               .first;
    }
    return it->second;
  };
  std::vector<CollTime> out;
  std::vector<char> send, recv;
  for (const auto& [key, all] : sizes) {
    const auto [op, G, inter] = key;
    // Consecutive members, else strided ones (rank 0's group decides whether it spans nodes).
    bool strided = false;
    if (spans(0, G, 1) != inter) {
      if (G == P || spans(0, G, P / G) != inter) continue;
      strided = true;
    }
    const comm::Group& g = group_of(G, strided);
    std::vector<int64_t> list(all.begin(), all.end()), pick;
    for (int i = 0; i < 6 && !list.empty(); ++i) {
      const int64_t v = list[size_t(std::lround(double(i) * double(list.size() - 1) / 5.0))];
      if (pick.empty() || pick.back() != v) pick.push_back(v);
    }
    for (const int64_t payload : pick) {
      const std::string scope = inter ? "inter" : "intra";
      if (beside) {  // time_posted holds its own buffers (two chunks of calls)
        CollTime t{plan.fabric, scope, comm::to_string(op), G, payload, time_posted(c, world, g, op, payload, *beside)};
        t.posted = true;
        out.push_back(t);
        c.trace().clear();
        continue;
      }
      const size_t count = size_t(std::max<int64_t>(1, payload / int64_t(sizeof(float))));
      send.assign(size_t(payload) * size_t(G) + sizeof(float), 1);
      recv.assign(size_t(payload) * size_t(G) + sizeof(float), 0);
      auto call = [&] {
        harness::Watchdog::instance().tick();
        MPI_Barrier(world);
        const double t0 = MPI_Wtime();
        if (op == comm::EventKind::AllToAll) {
          c.alltoall(send.data(), recv.data(), size_t(payload), g);
        } else if (op == comm::EventKind::AllGather) {
          comm::Request r = c.iallgather(send.data(), recv.data(), size_t(payload), g);
          c.wait(r);
        } else if (op == comm::EventKind::ReduceScatter) {
          comm::Request r = c.ireduce_scatter(send.data(), recv.data(), count, comm::DType::F32, g);
          c.wait(r);
        } else {
          c.allreduce(send.data(), count, comm::DType::F32, comm::ReduceOp::Sum, g);
        }
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
        return t;
      };
      call(), call();
      int reps = int(std::clamp(0.1 / std::max(call(), 1e-7), 20.0, 200.0));
      MPI_Bcast(&reps, 1, MPI_INT, 0, world);
      double sum = 0;
      for (int i = 0; i < reps; ++i) sum += call();
      out.push_back({plan.fabric, scope, comm::to_string(op), G, payload, sum / reps});
      c.trace().clear();
    }
  }
  return out;
}

}  // namespace

Calibration measure_calibration(const CalibrationPlan& plan, comm::Communicator& comm, bool verbose) {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const int threads = int(Kokkos::DefaultHostExecutionSpace().concurrency());
  Calibration out;
  out.source = "measured";
  const comm::Topology topo = comm.topology();
  out.info.push_back({"host", topo.hosts.empty() ? "" : topo.hosts[0]});
  out.info.push_back({"ranks_measuring", std::to_string(comm.world().size)});
  auto sync = [&] { MPI_Barrier(world); };
  auto drift_reference = [&] { return kernels::blas_gemm_rate({2048, 2048, 2048}, sync); };
  out.sgemm[threads] = drift_reference();
  for (const std::string& dt : plan.dtypes)
    run::with_dtype(dt, [&](auto t) {
      Measure<decltype(t)> m{plan, world, threads, dt, verbose, rank};
      m.gemms(out), m.elementwise(out), m.attention(out);
    });
  // Links: rank 0 to the next rank on its node, and to the first rank on another node.
  int intra_peer = -1, inter_peer = -1;
  for (int r = 1; r < int(topo.node_of_rank.size()); ++r) {
    if (topo.node_of_rank[size_t(r)] == topo.node_of_rank[0] && intra_peer < 0) intra_peer = r;
    if (topo.node_of_rank[size_t(r)] != topo.node_of_rank[0] && inter_peer < 0) inter_peer = r;
  }
  double intra_beta = 0;
  for (auto [peer, scope] : {std::pair{intra_peer, "intra"}, std::pair{inter_peer, "inter"}}) {
    if (peer < 0) continue;
    MPI_Barrier(world);
    const auto [alpha, beta] = pingpong(world, rank, peer);
    if (std::string(scope) == "intra") intra_beta = beta;
    // A CPU copies what moves within a node; across nodes only on a non-RDMA fabric, at the
    // node's copy rate (the intra-node figure) or, without one, the link's own.
    const double cpu = std::string(scope) == "intra" ? beta
                       : plan.cpu_copy_inter         ? (intra_beta > 0 ? intra_beta : beta)
                                                     : 0;
    out.links.push_back({plan.fabric, scope, alpha, beta, cpu});
  }
  // The weight-gradient all-reduce's own rate: a layer's buckets of 8 MiB (up to 8) back to
  // back over the whole job, as a layer posts them (its algorithm, the link's sustained rate
  // rather than a burst, and on a CPU-copy fabric its reductions and copies).
  const model::Shape& shape = plan.shapes.front();
  const size_t bucket = model::kGradBucketBytes;
  const int buckets = int(std::clamp<int64_t>(
      (model::layer_param_count(shape) * int64_t(sizeof(float)) + int64_t(bucket) - 1) / int64_t(bucket), 1, 8));
  if (comm.world().size > 1 && !out.links.empty()) {
    std::vector<float> buf(bucket / sizeof(float), 1.0f);
    MPI_Barrier(world);
    const double t = median_time(world, 3, [&] {
      for (int i = 0; i < buckets; ++i)
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(buf.size()), MPI_FLOAT, MPI_SUM, world);
    });
    const bool inter = std::any_of(topo.node_of_rank.begin(), topo.node_of_rank.end(),
                                   [&](int nd) { return nd != topo.node_of_rank[0]; });
    for (LinkRate& l : out.links)
      if (l.scope == std::string(inter ? "inter" : "intra"))
        l.allreduce_Bps = double(buckets) *
                          double(comm::bytes_leaving(comm::EventKind::AllReduce, int64_t(bucket), comm.world().size)) /
                          t;
  }
  // The same links beside compute, through a communicator with the run's progress.
  if (comm.world().size > 1 && !out.links.empty()) {
    auto busy_comm = comm::make_mpi_comm(plan.progress_thread ? comm::Progress::Thread : comm::Progress::None);
    const int64_t N = plan.rows.empty() ? 1024 : *std::max_element(plan.rows.begin(), plan.rows.end());
    GemmLoop loop(std::clamp<int64_t>(N, 256, 4096), shape.hidden, shape.ffn);
    for (const LinkRate& l : out.links) {
      const int peer = l.scope == "intra" ? intra_peer : inter_peer;
      const auto [wire, cpu] = busy_link(*busy_comm, world, rank, peer, 0, l.beta_Bps, loop);
      out.busy.push_back({plan.fabric, l.scope, "p2p", wire, cpu});
      if (l.allreduce_Bps > 0) {
        const auto [ar_wire, ar_cpu] = busy_link(*busy_comm, world, rank, peer, buckets, l.allreduce_Bps, loop);
        out.busy.push_back({plan.fabric, l.scope, "allreduce", ar_wire, ar_cpu});
      }
    }
    out.colls = time_collectives(*busy_comm, world, plan, topo, plan.exposed, nullptr);
    // About 2 ms of GEMMs beside the posted calls: a chunk's compute in the small decks here.
    GemmLoop step(64, shape.hidden, shape.ffn);
    step.iters = 1;
    step.run();
    int iters = int(std::clamp(std::round(2e-3 / std::max(step.run(), 1e-7)), 1.0, 1000.0));
    MPI_Bcast(&iters, 1, MPI_INT, 0, world);
    step.iters = iters;
    for (CollTime& t : time_collectives(*busy_comm, world, plan, topo, plan.posted, &step)) out.colls.push_back(t);
  }
  if (verbose && rank == 0) std::printf("minicp --calibrate: links measured (%s)\n", plan.fabric.c_str());
  // The drift reference read as a run reads a case's (the larger of a reading before and one
  // after): one reading in a slow spell would scale every prediction of the run down.
  out.sgemm[threads] = std::max(out.sgemm[threads], drift_reference());
  // Rank 0's values stand for all: send them round so every rank predicts the same.
  const std::string text = out.text();
  int n = int(text.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, world);
  std::string all(size_t(n), '\0');
  if (rank == 0) all = text;
  MPI_Bcast(all.data(), n, MPI_CHAR, 0, world);
  Calibration c = parse_calibration(all, "measured");
  return c;
}

std::vector<LayerTime> median_layer_rows(const std::vector<LayerTime>& samples) {
  std::vector<LayerTime> out;
  std::set<decltype(LayerTime{}.key())> done;
  for (const LayerTime& first : samples) {
    if (!done.insert(first.key()).second) continue;
    std::vector<LayerTime> same;
    for (const LayerTime& l : samples)
      if (l.key() == first.key()) same.push_back(l);
    // Per pass, by layer / GEMMs without dividing by a 0 (a decode row's backward).
    auto median = [&](double LayerTime::*layer, double LayerTime::*gemm) {
      std::vector<LayerTime> v = same;
      std::sort(v.begin(), v.end(),
                [&](const LayerTime& x, const LayerTime& y) { return x.*layer * y.*gemm < y.*layer * x.*gemm; });
      return v[v.size() / 2];
    };
    const LayerTime f = median(&LayerTime::forward_s, &LayerTime::gemm_forward_s);
    const LayerTime b = median(&LayerTime::backward_s, &LayerTime::gemm_backward_s);
    LayerTime row = first;
    row.forward_s = f.forward_s, row.gemm_forward_s = f.gemm_forward_s;
    row.backward_s = b.backward_s, row.gemm_backward_s = b.gemm_backward_s;
    out.push_back(row);
  }
  return out;
}

std::pair<double, double> layer_gemm_seconds(const model::Shape& s, int64_t N, const std::string& dtype, bool backward,
                                             comm::Communicator& comm) {
  MPI_Comm world = *static_cast<MPI_Comm*>(comm.world().native);
  double t[2] = {0, 0};
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, double> rates;  // a shape timed once
  for (int b = 0; b < (backward ? 2 : 1); ++b)
    for (const LayerOp& op : layer_ops(s, N, b == 1)) {
      if (op.ops.empty()) continue;
      double& rate = rates[{op.ops, op.m, op.n, op.k}];
      if (rate == 0)
        rate = run::with_dtype(dtype, [&](auto t) { return gemm_rate<decltype(t)>(world, op.ops, op.m, op.n, op.k); });
      t[b] += op.flops() / rate;
    }
  MPI_Bcast(t, 2, MPI_DOUBLE, 0, world);  // rank 0's, as the table's gemm rows
  return {t[0], t[1]};
}

}  // namespace minicp::perf
