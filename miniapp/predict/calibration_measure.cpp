// The measurement that fills a calibration table on this job (see calibration_measure.hpp);
// the table's format and look-ups are calibration.cpp.
#include "miniapp/predict/calibration_measure.hpp"

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
#include "comm/mpi_group.hpp"
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
#include "miniapp/predict/predict.hpp"
#include "miniapp/run/dtype.hpp"

namespace minicp::predict {

namespace {

using kernels::Trans;

// The ranks agreeing while they measure: starting together, rank 0's sizes and values for all,
// the slowest rank's time. These are control messages, not the traffic being measured: they go
// over MPI itself, so no communicator counts them in its bytes or its trace, and they take host
// values whatever memory a communicator's calls need (NCCL's: the device's). Every transfer
// whose time goes into the table goes through the comm::Communicator the schemes use.
struct Ranks {
  MPI_Comm world;
  int rank = 0;
  // The ranks of g, over the MPI communicator every backend keeps beside its own (Group::mpi).
  explicit Ranks(const comm::Group& g) : world(comm::mpi_of(g)), rank(g.rank) {}
  void together() const { MPI_Barrier(world); }
  template <class T>
  void from_rank0(T* v, int n = 1) const {
    MPI_Bcast(v, int(sizeof(T)) * n, MPI_BYTE, 0, world);
  }
  std::string from_rank0(const std::string& s) const {
    int n = int(s.size());
    from_rank0(&n);
    std::string all = rank == 0 ? s : std::string(size_t(n), '\0');
    MPI_Bcast(all.data(), n, MPI_CHAR, 0, world);
    return all;
  }
  double slowest(double t) const {
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
    return t;
  }
};

// The median of `reps` timed runs after one untimed one (seconds), all ranks starting
// together: the median, as a run reports the median rep (a best-of would read a few percent
// faster than the steps it predicts).
template <class Fn>
double median_time(const Ranks& ranks, int reps, Fn&& fn) {
  fn();
  Kokkos::fence();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    harness::Watchdog::instance().tick();  // the stall watchdog: each timed call is a step
    ranks.together();
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
double gemm_rate(const Ranks& world, const std::string& ops, int64_t m, int64_t n, int64_t k) {
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
  Ranks world;
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
    std::vector<std::array<double, 6>> rows;  // call, full area, partial area, tiles, work items, seconds
    // One call of queries at qs against keys at ks, timed (median of reps) as a row of the fit;
    // `cold`: its K and V are read from memory, cycling through copies, as a decode call in a
    // layer reads its cache a layer of weights after the last read (timed warm, the same call
    // read 7-16% faster than cold and than the layer's).
    // doc_len > 0: under documents of that many tokens.
    auto time_call = [&](const Spans& qs, const Spans& ks, int reps, bool cold, int64_t doc_len = 0) {
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
      if (doc_len > 0) c.mask = cp::Mask::equal_documents(doc_len);
      const kernels::AttnMask mask = cp::make_mask(c, layout::expand(qs), layout::expand(ks));
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
      rows.push_back({1.0, n.full_area * H, n.partial_area * H, (n.full + n.partial) * H,
                      bwd ? n.k_tiles * Hkv : n.q_tiles * H, t});
    };
    // Decode-sized calls (a few queries against a cache) weigh the per-call cost; decode runs
    // forward only, so only the forward's are read cold.
    for (int64_t m : {1024, 4096}) time_call({{m, 4, 1}}, {{0, m, 1}}, 5, !bwd);
    for (int64_t m : {256, 512, 1024})
      for (bool diag : {false, true}) time_call({{diag ? 0 : m, m, 1}}, {{0, m, 1}}, 3, false);
    // Short documents, their ends inside the tiles: few tiles per work item, which weighs the
    // items' own cost (what a call of packed documents pays beyond its tiles).
    for (int64_t m : {1024, 4096}) time_call({{0, m, 1}}, {{0, m, 1}}, 3, false, 100);
    auto x = fit(rows);
    // On a busy host (ranks sharing cores) the fit can drop the full tiles' term, its
    // coefficient having come out negative; a rate must be positive, so it is then the
    // fastest call's seconds per full tile's area, as if the call were all full tiles.
    if (!(x[1] > 0))
      for (const auto& r : rows)
        if (r[1] > 0 && (!(x[1] > 0) || r[5] / r[1] < x[1])) x[1] = r[5] / r[1];
    AttnRate a{dtype, threads, bwd, D, tiles.q, tiles.k, x[1], x[2], x[0], x[3]};
    a.item_s = x[4];
    return a;
  }

  // Least squares of t ~ a0 + a1 area_full + a2 area_partial + a3 tiles + a4 items (per call,
  // per whole tile's area, per tile touched whatever its area: the K/V loads of a decode call,
  // per work item), each row weighted by 1/t (relative errors); a negative coefficient is
  // dropped and the rest fitted again.
  static std::array<double, 5> fit(const std::vector<std::array<double, 6>>& rows) {
    constexpr int K = 5;
    std::array<bool, K> use{true, true, true, true, true};
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

// Half round trips between rank 0 and peer through the communicator, as a scheme's messages
// go (its backend, its staging): the smallest of 8 bytes (alpha) and the best of 4 MiB (beta
// from the rest). A one-way message is a send-receive whose other direction is empty. Every
// rank calls it; only 0 and peer exchange.
std::pair<double, double> pingpong(comm::Communicator& c, int rank, int peer) {
  const int big = 4 << 20;
  Kokkos::View<char*, kernels::Mem> buf("cal_pingpong", size_t(big));
  Kokkos::deep_copy(buf, char(1));
  auto one_way = [&](int to, int from, size_t bytes) {  // this rank sends `bytes` to `to`, or receives them
    comm::Request r = to >= 0 ? c.isendrecv(buf.data(), bytes, to, buf.data(), 0, to, c.world())
                              : c.isendrecv(buf.data(), 0, from, buf.data(), bytes, from, c.world());
    c.wait(r);
  };
  auto half_rtt = [&](int bytes, int reps) {
    double best = 1e300;
    for (int i = 0; i < reps + 3; ++i) {
      harness::Watchdog::instance().tick();
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        one_way(peer, -1, size_t(bytes));
        one_way(-1, peer, size_t(bytes));
      } else if (rank == peer) {
        one_way(-1, 0, size_t(bytes));
        one_way(0, -1, size_t(bytes));
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
// model's rule, predict::overlap), so the rates are those of the part that moved beside compute.
// Rank 0's figures are returned; every rank calls it.
std::pair<double, double> busy_link(comm::Communicator& c, const Ranks& world, int rank, int peer, int buckets,
                                    double isolated_Bps, GemmLoop& loop) {
  const int P = c.world().size;
  const int64_t bucket = int64_t(model::kGradBucketBytes);
  const bool allreduce = buckets > 0;
  // Rank 0's sizes: each rank timed the link by its own clock, and both sides must agree.
  world.from_rank0(&isolated_Bps);
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
  world.from_rank0(sizes, 2);
  loop.iters = sizes[0];
  const int trials = sizes[1];
  std::vector<char> send(size_t(bytes), 1), recv(size_t(bytes), 0);
  std::vector<double> alone, loaded, xfer;
  for (int trial = 0; trial <= trials; ++trial) {  // the first sets up the connections: not kept
    harness::Watchdog::instance().tick();
    world.together();
    alone.push_back(loop.run());
    world.together();
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
double time_posted(comm::Communicator& c, const Ranks& world, const comm::Group& g, comm::EventKind op, int64_t payload,
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
    world.together();
    const double t0 = MPI_Wtime();
    if (with_calls) post(0);
    for (int k = 0; k < kSteps; ++k) {
      if (with_calls && k + 1 < kSteps) post((k + 1) % 2);
      if (with_calls) wait(k % 2);
      beside.run();
    }
    double t = MPI_Wtime() - t0;
    t = world.slowest(t);
    return t;
  };
  pass(true), pass(false);  // connections set up
  int reps = int(std::clamp(0.3 / std::max(pass(true), 1e-7), 10.0, 50.0));
  world.from_rank0(&reps);
  double with = 0, alone = 0;
  for (int i = 0; i < reps; ++i) with += pass(true), alone += pass(false);
  // Per call posted beside compute (the model's overlapped calls); the first chunk's, which
  // the model charges as blocking calls, are in the sum: under UCX here a pass took 15 ms
  // beyond its compute, its first chunk's 4 calls 0.6 ms when blocking.
  return std::max(0.0, (with - alone) / reps / (kPosted * (kSteps - 1)));
}

// One blocking call of op over g (payload bytes per member), timed as the slowest member's
// mean over about 0.1 s of calls after two untimed ones.
double time_blocking(comm::Communicator& c, const Ranks& world, const comm::Group& g, comm::EventKind op,
                     int64_t payload) {
  const int G = g.size;
  std::vector<char> send, recv;
  const size_t count = size_t(std::max<int64_t>(1, payload / int64_t(sizeof(float))));
  send.assign(size_t(payload) * size_t(G) + sizeof(float), 1);
  recv.assign(size_t(payload) * size_t(G) + sizeof(float), 0);
  auto call = [&] {
    harness::Watchdog::instance().tick();
    world.together();
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
    t = world.slowest(t);
    return t;
  };
  call(), call();
  int reps = int(std::clamp(0.1 / std::max(call(), 1e-7), 20.0, 200.0));
  world.from_rank0(&reps);
  double sum = 0;
  for (int i = 0; i < reps; ++i) sum += call();
  return sum / reps;
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
std::vector<CollTime> time_collectives(comm::Communicator& c, const Ranks& world, const CalibrationPlan& plan,
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
    if (e.group >= 2 && e.group <= P && P % e.group == 0 && e.payload > 0 && is_coll_row_op(comm::to_string(e.op)))
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
      out.push_back({plan.fabric, scope, comm::to_string(op), G, payload, time_blocking(c, world, g, op, payload)});
      c.trace().clear();
    }
  }
  return out;
}

// The weight-gradient all-reduce's own rate (into the links of its scope): a layer's buckets
// of 8 MiB (up to `buckets`) back to back over the whole job, as a layer posts them (its
// algorithm, the link's sustained rate rather than a burst, and on a CPU-copy fabric its
// reductions and copies).
void measure_allreduce(comm::Communicator& comm, const Ranks& world, const comm::Topology& topo, int buckets,
                       Calibration& out) {
  const size_t bucket = model::kGradBucketBytes;
  Kokkos::View<float*, kernels::Mem> buf("cal_grad_bucket", bucket / sizeof(float));
  Kokkos::deep_copy(buf, 1.0f);
  world.together();
  const double t = median_time(world, 3, [&] {
    for (int i = 0; i < buckets; ++i)
      comm.allreduce(buf.data(), buf.size(), comm::DType::F32, comm::ReduceOp::Sum, comm.world());
  });
  const bool inter = std::any_of(topo.node_of_rank.begin(), topo.node_of_rank.end(),
                                 [&](int nd) { return nd != topo.node_of_rank[0]; });
  for (LinkRate& l : out.links)
    if (l.scope == std::string(inter ? "inter" : "intra"))
      l.allreduce_Bps = double(buckets) *
                        double(comm::bytes_leaving(comm::EventKind::AllReduce, int64_t(bucket), comm.world().size)) / t;
}

// The same links beside compute, through a communicator with the run's progress: the busy
// rows, and the collectives timed alone and posted beside ~2 ms of GEMMs.
void measure_beside_compute(const CalibrationPlan& plan, const Ranks& world, int rank, const comm::Topology& topo,
                            std::pair<int, int> peers, int buckets, Calibration& out) {
  const model::Shape& shape = plan.shapes.front();
  const auto [intra_peer, inter_peer] = peers;
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
  world.from_rank0(&iters);
  step.iters = iters;
  for (CollTime& t : time_collectives(*busy_comm, world, plan, topo, plan.posted, &step)) out.colls.push_back(t);
}

}  // namespace

Calibration measure_calibration(const CalibrationPlan& plan, comm::Communicator& comm, bool verbose) {
  const Ranks world(comm.world());
  const int rank = world.rank;
  const int threads = int(Kokkos::DefaultHostExecutionSpace().concurrency());
  Calibration out;
  out.source = "measured";
  const comm::Topology topo = comm.topology();
  out.info.push_back({"host", topo.hosts.empty() ? "" : topo.hosts[0]});
  out.info.push_back({"ranks_measuring", std::to_string(comm.world().size)});
  auto sync = [&] { world.together(); };
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
    world.together();
    const auto [alpha, beta] = pingpong(comm, rank, peer);
    if (std::string(scope) == "intra") intra_beta = beta;
    // A CPU copies what moves within a node; across nodes only on a non-RDMA fabric, at the
    // node's copy rate (the intra-node figure) or, without one, the link's own.
    const double cpu = std::string(scope) == "intra" ? beta
                       : plan.cpu_copy_inter         ? (intra_beta > 0 ? intra_beta : beta)
                                                     : 0;
    out.links.push_back({plan.fabric, scope, alpha, beta, cpu});
  }
  const model::Shape& shape = plan.shapes.front();
  const size_t bucket = model::kGradBucketBytes;
  const int buckets = int(std::clamp<int64_t>(
      (model::layer_param_count(shape) * int64_t(sizeof(float)) + int64_t(bucket) - 1) / int64_t(bucket), 1, 8));
  if (comm.world().size > 1 && !out.links.empty()) {
    measure_allreduce(comm, world, topo, buckets, out);
    measure_beside_compute(plan, world, rank, topo, {intra_peer, inter_peer}, buckets, out);
  }
  if (verbose && rank == 0) std::printf("minicp --calibrate: links measured (%s)\n", plan.fabric.c_str());
  // The drift reference read as a run reads a case's (the larger of a reading before and one
  // after): one reading in a slow spell would scale every prediction of the run down.
  out.sgemm[threads] = std::max(out.sgemm[threads], drift_reference());
  // Rank 0's values stand for all: send them round so every rank predicts the same.
  return parse_calibration(world.from_rank0(out.text()), "measured");
}

std::pair<double, double> layer_gemm_seconds(const model::Shape& s, int64_t N, const std::string& dtype, bool backward,
                                             comm::Communicator& comm) {
  const Ranks world(comm.world());
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
  world.from_rank0(t, 2);  // rank 0's, as the table's gemm rows
  return {t[0], t[1]};
}

}  // namespace minicp::predict
