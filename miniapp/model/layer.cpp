// The decoder-layer stack (see layer.hpp). Tensor shapes use the letters of model.hpp.
#include "miniapp/model/layer.hpp"

#include <mpi.h>

#include <algorithm>
#include <stdexcept>

#include "comm/mpi_group.hpp"
#include "harness/watchdog.hpp"
#include "kernels/attention.hpp"
#include "kernels/convert.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "miniapp/cp/common.hpp"

namespace minicp::model {

const char* to_string(Pass p) {
  switch (p) {
    case Pass::Train: return "train";
    case Pass::Prefill: return "prefill";
    case Pass::Decode: return "decode";
  }
  return "?";
}

const char* to_string(Phase p) {
  static const char* names[kPhases] = {"norm",     "qkv", "rope",    "attn_compute",   "attn_comm",
                                       "out_proj", "mlp", "tp_comm", "grad_allreduce", "other"};
  return names[int(p)];
}

double PhaseTimes::total() const {
  double t = 0;
  for (double x : s) t += x;
  return t;
}

PhaseTimes& PhaseTimes::operator+=(const PhaseTimes& o) {
  for (int i = 0; i < kPhases; ++i) s[i] += o.s[i];
  return *this;
}

Shape rank_shape(const StackConfig& cfg) {
  const int tp = cfg.mesh.tp();
  return tp > 1 && check_tp(cfg.shape, tp).empty() ? tp_slice(cfg.shape, tp, 0).shape : cfg.shape;
}

bool sequence_parallel(const StackConfig& cfg) {
  return cfg.mesh.tp() > 1 && cfg.sequence_parallel && cfg.pass != Pass::Decode;
}

cp::Config attention_config(const StackConfig& cfg) {
  cp::Config a = cfg.attn;
  const Shape m = rank_shape(cfg);
  a.heads = m.heads;
  a.kv_heads = m.kv_heads;
  a.head_dim = cfg.shape.head_dim;
  a.problem = cfg.pass == Pass::Decode ? cp::Problem::Decode : cp::Problem::Train;
  return a;
}

namespace {

// Rows on the rank that holds most (every layout: ceil(S/P); decode: T new tokens, and the
// cache shard).
struct Rows {
  double n = 0, cache = 0;
};
Rows rows_of(const StackConfig& cfg) {
  const cp::Config a = attention_config(cfg);
  const double shard = std::ceil(double(a.seq_len) / a.ranks);
  if (cfg.pass == Pass::Decode) return {double(a.decode_tokens), shard};
  return {shard, 0};
}

// out = a + b, all whole [N, C] allocations. Outside Stack<T>::Impl: nvcc refuses an extended
// lambda defined inside a private nested class.
template <class T>
void residual_add(kernels::View2<T> out, kernels::CView2<T> a, kernels::CView2<T> b) {
  using A = kernels::acc_t<T>;
  T* o = out.data();
  const T *pa = a.data(), *pb = b.data();
  kernels::for_each_index(
      "model::residual", int64_t(out.span()), KOKKOS_LAMBDA(const int64_t i) { o[i] = T(A(pa[i]) + A(pb[i])); });
}

}  // namespace

std::string check_mesh(const StackConfig& cfg, const cp::SchemeInfo& scheme) {
  const int tp = cfg.mesh.tp();
  if (tp == 1) return "";
  const std::string mesh = "mesh " + job_mesh(cfg).id() + ": ";
  if (const std::string why = check_tp(cfg.shape, tp); !why.empty()) return mesh + why;
  if (!sequence_parallel(cfg)) return "";
  const cp::Config a = attention_config(cfg);
  for (int r = 0; r < a.ranks; ++r)
    if (const size_t n = scheme.shard(a, r).q.size(); n % size_t(tp) != 0)
      return mesh + "sequence parallelism needs every CP rank's tokens divisible by tp = " + std::to_string(tp) +
             "; CP rank " + std::to_string(r) + " holds " + std::to_string(n) +
             " (run.sequence_parallel = \"off\" all-reduces instead)";
  return "";
}

std::vector<TpCall> tp_calls(const StackConfig& cfg, int64_t N, bool backward, size_t elem) {
  const int tp = cfg.mesh.tp();
  if (tp == 1 || !check_tp(cfg.shape, tp).empty()) return {};
  const TpSlice s = tp_slice(cfg.shape, tp, 0);
  const bool sp = sequence_parallel(cfg);
  const int64_t C = cfg.shape.hidden, rows = int64_t(C) * (sp ? N / tp : N) * int64_t(elem);
  const int64_t acc = int64_t(kernels::acc_size(elem));
  using comm::EventKind;
  // With tp_overlap, the GEMM FLOPs beside each: an all-gather's GEMMs on the rank's own rows
  // (1/tp of them), a backward reduce's weight-gradient GEMMs.
  const double nc = double(N) * double(C), ov = cfg.tp_overlap ? 1 : 0;
  const double qkv = 2 * nc * double(s.shape.heads + 2 * s.shape.kv_heads) * cfg.shape.head_dim,
               mlp = 4 * nc * double(s.shape.ffn), o = 4 * nc * double(s.shape.heads) * cfg.shape.head_dim;
  auto call = [&](EventKind k, double beside) { return TpCall{k, rows, tp, ov * beside}; };
  std::vector<TpCall> out;
  if (sp && !backward)  // h1, o Wo, h2, g W2
    out = {call(EventKind::AllGather, qkv / tp), call(EventKind::ReduceScatter, 0),
           call(EventKind::AllGather, mlp / tp), call(EventKind::ReduceScatter, 0)};
  else if (sp)  // dy, dh, dx2, dh
    out = {call(EventKind::AllGather, mlp / tp), call(EventKind::ReduceScatter, mlp),
           call(EventKind::AllGather, o / tp), call(EventKind::ReduceScatter, qkv)};
  else if (!backward)  // o Wo, g W2
    out = {call(EventKind::AllReduce, 0), call(EventKind::AllReduce, 0)};
  else  // dh twice
    out = {call(EventKind::AllReduce, mlp), call(EventKind::AllReduce, qkv)};
  if (!backward) return out;
  if (sp) out.push_back({EventKind::AllReduce, C * acc, tp}), out.push_back({EventKind::AllReduce, C * acc, tp});
  if (s.kv_copies > 1)
    out.push_back({EventKind::AllReduce, 2 * C * s.shape.kv_heads * cfg.shape.head_dim * acc, s.kv_copies});
  return out;
}

int64_t predicted_stack_bytes(const StackConfig& cfg, const cp::SchemeInfo& scheme, size_t elem) {
  // With TP: the slice's heads and FFN; the norms' and residuals' rows n are 1/tp of the
  // shard's N with sequence parallelism.
  const int tp = cfg.mesh.tp();
  const bool split = tp > 1 && check_tp(cfg.shape, tp).empty();
  const Shape m = rank_shape(cfg);
  const bool sp = split && sequence_parallel(cfg);
  const Rows r = rows_of(cfg);
  const double N = r.n, n = sp ? std::ceil(N / tp) : N, C = m.hidden, HD = double(m.heads) * m.head_dim,
               KD = double(m.kv_heads) * m.head_dim, F = m.ffn, H = m.heads, L = m.layers;
  const bool train = cfg.pass == Pass::Train, mixed = kernels::acc_size(elem) != elem;
  const double params = double(layer_param_count(m));  // the slice's
  // v: values stored in T (elem bytes each); a: values in the accumulator type (acc_size).
  double v = L * params, a = train ? L * params : 0;               // weights; gradients
  if (train && mixed && cfg.bf16_grad_allreduce) v += L * params;  // the gradients rounded for the all-reduce
  v += (L + 1) * n * C + (train ? 3 : 0) * n * C;                  // layer inputs/outputs; dy and two dx buffers
  const double layers_saved = train ? L : 1;
  v += layers_saved * (2 * N * C + n * C + 2 * N * HD + 2 * N * KD + 2 * N * F);  // h1, h2, x2; q, o; k, v; a, b
  a += layers_saved * (2 * n + N * H);                                            // rstd1, rstd2; lse
  v += N * F;                                                                     // the gate g
  if (train) v += 3 * N * F + N * C + 2 * n * C + 2 * N * HD + 2 * N * KD;        // backward workspace (dh; dxn, dx2)
  if (sp) v += n * C;                                                             // a norm's own rows
  if (split) v += N * C + n * C;  // TP: gathered or partial rows; reduced
  if (train) a += N * H;          // the attention backward's row term (dout . o) [N, H], during the call
  // The kernel's own buffers during a call, as if on this rank's rows (a scheme that calls it
  // on more rows at once, as allgather's gathered chunks, holds more).
  a += kernels::attention_scratch_values(elem, N, cfg.pass == Pass::Decode ? r.cache : N, m.heads, m.kv_heads,
                                         m.head_dim, train);
  if (cfg.pass == Pass::Decode) {
    v += 2 * L * r.cache * KD;                   // the cache
    a += N * HD + N * H + (mixed ? N * HD : 0);  // the self block (o, lse); o widened for its merge
  }
  const double pos = N * 8.0;  // RoPE positions [N] (int64), in bytes
  const cp::Workspace w = scheme.workspace ? scheme.workspace(attention_config(cfg)) : cp::Workspace{};
  v += w.values(elem, L);
  // Not counted: the masks' positions (int64, one per query and key row of a block, during a
  // call) and RoPE's D/2 angles; host-side std::vector temporaries of the kernels (the tiled
  // attention's per-item tiles and dQ splits) are not Kokkos allocations.
  const int64_t bytes = cp::bytes_of(v, elem), acc = cp::bytes_of(a, kernels::acc_size(elem));
  return bytes > INT64_MAX - acc - int64_t(pos) ? INT64_MAX : bytes + acc + int64_t(pos);
}

template <class T>
struct Stack<T>::Impl {
  using CV2 = kernels::CView2<T>;
  using Trans = kernels::Trans;
  static constexpr bool kMixed = !std::is_same<T, A>::value;  // bf16: accumulators wider than T

  // One layer's weights, gradients, attention scheme and saved activations.
  struct Layer {
    View1<T> w;        // [layer_param_count]: attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2
    View1<A> dw;       // [layer_param_count], the same order
    View1<T> dw_wire;  // bf16 all-reduce: dw rounded, summed over the group, widened back
    std::unique_ptr<cp::Scheme<T>> scheme;
    View2<T> h1, q, k, v, o, x2, h2, a, b;  // [N,C] [N,H*D] [N,Hkv*D] x2 [N,H*D] [N,C] x2 [N,F] x2
    View1<A> rstd1, rstd2;                  // [N]
    View2<A> lse;                           // [N,H]
    View3<T> kc, vc;                        // decode: this rank's cache shard [Nc,Hkv,D]
    PhaseTimes fwd, bwd;
    std::vector<comm::Request> grad_reqs;  // the dW all-reduce, one per bucket
  };

  StackConfig cfg;
  cp::Config acfg;
  const cp::SchemeInfo& info;
  comm::Communicator& comm;
  Shape m;
  int64_t N = 0, C = 0, H = 0, Hkv = 0, D = 0, F = 0;
  std::vector<Param> params;
  // TP: this rank's slice (tp 1: the whole layer), sequence parallelism, the TP group and the
  // group of the TP ranks that hold the same replicated K/V heads. H, Hkv and F are the slice's.
  TpSlice tps;
  bool sp = false;
  comm::Group tp_group, kv_group;
  int64_t tp_bytes = 0;  // bytes the TP collectives sent since the last forward began
  // N: the CP shard's rows, which the attention and the column-parallel GEMMs run on; n: the
  // rows the norms and residuals run on (sequence parallelism: this TP rank's N/tp; else N).
  int64_t n = 0;
  std::vector<int64_t> shard;                            // global index of each of the CP shard's N rows
  std::vector<int64_t> rows;                             // global index of each of this rank's n rows
  std::vector<int64_t> cache_rows;                       // decode: global token of each cache row
  Kokkos::View<int64_t*, kernels::Mem> pos;              // [N] positions for RoPE
  std::vector<View2<T>> xs;                              // L+1 of [n,C]: input of layer l, output of the last
  View2<T> dy, gbuf[2], dx;                              // [n,C]
  View2<T> g, dg, da, db, dh, dxn, dx2, dq, dk, dv, dO;  // shared workspace: dxn, dx2 [n,C], dh [N,C]
  View2<T> hl, full, rs;             // TP: a norm's own rows [n,C] (sp); a gathered or partial [N,C]; a reduce's [n,C]
  View2<A> o_self, lse_self, o_acc;  // decode: the new tokens' own block; o widened
  std::vector<Layer> layers;
  double grad_exposed = 0;
  int64_t grad_bytes = 0;
  double grad_busy = 0;  // the collective thread's time on them (NaN: no such thread)  // bytes the last backward's dW
                         // all-reduces sent (comm::bytes_leaving)
  comm::Group grad_group;  // the dW all-reduce's: the CP group, or with DP the CP x DP group
  int replica = 0;         // the DP replica whose sequence this rank runs

  Impl(const StackConfig& c, const cp::SchemeInfo& s, comm::Communicator& cm)
      : cfg(c), acfg(attention_config(c)), info(s), comm(cm), m(c.shape) {
    check_and_join_mesh();
    C = m.hidden, H = tps.shape.heads, Hkv = tps.shape.kv_heads, D = m.head_dim, F = tps.shape.ffn;
    params = layer_params(tps.shape);
    const int rank = comm.world().rank;
    const cp::Shard sh = info.shard(acfg, rank);
    shard = sh.q;
    N = int64_t(shard.size());
    sp = sequence_parallel(cfg);  // (check_mesh: N divides by tp)
    n = sp ? N / tps.tp : N;
    rows.assign(shard.begin() + (sp ? tps.rank * n : 0), shard.begin() + (sp ? tps.rank * n : 0) + n);
    pos = cp::to_device(shard, "model::pos");
    if (cfg.pass == Pass::Decode) cache_rows = sh.kv;
    const bool train = cfg.pass == Pass::Train;
    const auto mat = buffer;
    xs.resize(size_t(m.layers) + 1);
    for (auto& x : xs) x = mat("model::x", n, C);
    fill_rows(xs[0], Stream::Input);
    layers.resize(size_t(m.layers));
    for (int l = 0; l < m.layers; ++l) {
      Layer& L = layers[size_t(l)];
      L.w = View1<T>(Kokkos::view_alloc(std::string("model::w"), Kokkos::WithoutInitializing),
                     size_t(params.back().offset + params.back().size()));
      fill_params(L.w, l);
      if (train) L.dw = View1<A>("model::dw", L.w.extent(0));
      if (train && kMixed && cfg.bf16_grad_allreduce)
        L.dw_wire =
            View1<T>(Kokkos::view_alloc(std::string("model::dw_wire"), Kokkos::WithoutInitializing), L.w.extent(0));
      L.scheme = make_scheme();
      if (l == 0 || train) {  // forward-only passes keep no activations: the layers share one set
        L.h1 = mat("model::h1", N, C);
        L.q = mat("model::q", N, H * D);
        L.k = mat("model::k", N, Hkv * D);
        L.v = mat("model::v", N, Hkv * D);
        L.o = mat("model::o", N, H * D);
        L.x2 = mat("model::x2", n, C);
        L.h2 = mat("model::h2", N, C);
        L.a = mat("model::a", N, F);
        L.b = mat("model::b", N, F);
        L.rstd1 = View1<A>("model::rstd1", n);
        L.rstd2 = View1<A>("model::rstd2", n);
        L.lse = View2<A>("model::lse", N, H);
      } else {
        const Layer& f = layers[0];
        L.h1 = f.h1, L.q = f.q, L.k = f.k, L.v = f.v, L.o = f.o, L.x2 = f.x2, L.h2 = f.h2, L.a = f.a, L.b = f.b;
        L.rstd1 = f.rstd1, L.rstd2 = f.rstd2, L.lse = f.lse;
      }
      if (cfg.pass == Pass::Decode) {
        L.kc = View3<T>(Kokkos::view_alloc(std::string("model::cache_k"), Kokkos::WithoutInitializing), sh.kv.size(),
                        Hkv, D);
        L.vc = View3<T>(Kokkos::view_alloc(std::string("model::cache_v"), Kokkos::WithoutInitializing), sh.kv.size(),
                        Hkv, D);
        fill_cache(L.kc, sh.kv, stream_id(Stream::CacheK, l));  // its K/V heads' of the cache
        fill_cache(L.vc, sh.kv, stream_id(Stream::CacheV, l));
      }
    }
    alloc_workspace();
  }

  static View2<T> buffer(const char* label, int64_t r, int64_t cols) {
    return View2<T>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), r, cols);
  }
  // The buffers the layers share: the gate, TP's, the backward's, decode's own block.
  void alloc_workspace() {
    const auto mat = buffer;
    const bool train = cfg.pass == Pass::Train;
    g = mat("model::g", N, F);
    if (sp) hl = mat("model::h_own", n, C);
    if (tps.tp > 1) full = mat("model::tp_full", N, C), rs = mat("model::tp_rs", n, C);
    if (train) {
      dy = mat("model::dy", n, C);
      fill_rows(dy, Stream::UpstreamGrad);
      gbuf[0] = mat("model::dx_a", n, C);
      gbuf[1] = mat("model::dx_b", n, C);
      dg = mat("model::dg", N, F);
      da = mat("model::da", N, F);
      db = mat("model::db", N, F);
      dh = mat("model::dh", N, C);
      dxn = mat("model::dxn", n, C);
      dx2 = mat("model::dx2", n, C);
      dq = mat("model::dq", N, H * D);
      dk = mat("model::dk", N, Hkv * D);
      dv = mat("model::dv", N, Hkv * D);
      dO = mat("model::do", N, H * D);
    }
    if (cfg.pass == Pass::Decode) {
      o_self = View2<A>("model::o_self", N, H * D);
      lse_self = View2<A>("model::lse_self", N, H);
      if (kMixed) o_acc = View2<A>("model::o_acc", N, H * D);
    }
  }

  std::unique_ptr<cp::Scheme<T>> make_scheme() const { return cp::make_scheme<T>(info); }

  // x[i, c] = gen(global row i, c): the same token gets the same values on any rank.
  // Refuses a shape or a mesh the layer cannot run; then this rank's TP slice and groups, the
  // group the weight gradients are reduced over and this rank's DP replica (see
  // StackConfig::mesh), collective over the job's ranks when the mesh has TP or DP.
  void check_and_join_mesh() {
    if (const std::string why = check(m); !why.empty()) throw std::invalid_argument(why);
    const comm::Mesh& mesh = cfg.mesh;
    if (const std::string why = check_mesh(cfg, info); !why.empty()) throw std::invalid_argument(why);
    grad_group = comm.world(), replica = cfg.replica, tps = tp_slice(m, 1, 0);
    if (mesh.tp() == 1 && mesh.dp() == 1) return;
    if (mesh.cp() != comm.world().size || mesh.ranks() != comm.job().size)
      throw std::invalid_argument("mesh " + mesh.id() + " on a communicator of " + std::to_string(comm.job().size) +
                                  " ranks whose world holds " + std::to_string(comm.world().size) +
                                  " (narrow_world to the CP group first)");
    const int me = comm.job().rank;
    if (mesh.tp() > 1) {
      tps = tp_slice(m, mesh.tp(), mesh.coord(me, comm::Axis::TP));
      tp_group = comm.split_job(mesh.color(me, comm::Axis::TP), "tp");
      if (tps.kv_copies > 1)  // the TP ranks that hold this rank's replicated K/V head
        kv_group = comm.split_job(mesh.color(me, comm::Axis::TP) * m.kv_heads + tps.kv_head0, "tp_kv");
    }
    if (mesh.dp() > 1) {
      grad_group = comm.split_job(mesh.grad_color(me), "grad");
      replica = mesh.coord(me, comm::Axis::DP);
    }
  }

  void fill_rows(View2<T> x, Stream s) const {
    auto h = Kokkos::create_mirror_view(x);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < C; ++c)
        h(i, c) = T(gen_unit(cfg.seed, stream_id(s, replica), uint64_t(rows[size_t(i)] * C + c)));
    Kokkos::deep_copy(x, h);
  }
  // Norm weights 1 + 0.1 u, matrices u / sqrt(rows) (activations stay O(1) through the layers),
  // drawn by the element's index in the whole layer: a TP slice holds the whole layer's values.
  void fill_params(View1<T> w, int layer) const {
    auto h = Kokkos::create_mirror_view(w);
    const TpMap map(m, tps);
    for (size_t p = 0; p < params.size(); ++p) {
      const Param &pr = params[p], &whole = map.whole()[p];
      const uint64_t st = stream_id(Stream::Weight, layer, int(p));
      const double scale = pr.cols == 0 ? 0.1 : 1.0 / std::sqrt(double(whole.rows));
      const bool same = tps.tp == 1 || pr.cols == 0;  // the whole parameter: element i is i
      for (int64_t i = 0; i < pr.size(); ++i)
        h(pr.offset + i) = T((pr.cols == 0 ? 1.0 : 0.0) +
                             scale * gen_unit(cfg.seed, st, uint64_t(same ? i : map.at(int(p), i) - whole.offset)));
    }
    Kokkos::deep_copy(w, h);
  }
  // A cache shard [Nc,Hkv,D] (this TP rank's K/V heads) as a prefill would leave it (K after
  // RoPE), drawn by global token and K/V head.
  void fill_cache(View3<T> x, const std::vector<int64_t>& tok, uint64_t st) const {
    auto h = Kokkos::create_mirror_view(x);
    const int64_t w = Hkv * D, whole = int64_t(m.kv_heads) * D, first = int64_t(tps.kv_head0) * D;
    for (size_t i = 0; i < tok.size(); ++i)
      for (int64_t j = 0; j < w; ++j)
        h(i, j / D, j % D) = T(gen_unit(cfg.seed, st, uint64_t(tok[i] * whole + first + j)));
    Kokkos::deep_copy(x, h);
  }
  // A cache shard with every K/V head [Nc, kv_heads, D], each head from the first TP rank
  // that holds it (summed over the TP group in double, exact as whole_of).
  View3<T> whole_cache(View3<T> mine) const {
    if (tps.tp == 1 || !mine.data()) return mine;
    const int64_t Nc = int64_t(mine.extent(0)), Hw = m.kv_heads;
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mine);
    std::vector<double> all(size_t(Nc * Hw * D), 0.0);
    if (tps.rank % tps.kv_copies == 0)
      for (int64_t i = 0; i < Nc; ++i)
        for (int64_t k = 0; k < Hkv; ++k)
          for (int64_t d = 0; d < D; ++d) all[size_t((i * Hw + tps.kv_head0 + k) * D + d)] = double(h(i, k, d));
    MPI_Allreduce(MPI_IN_PLACE, all.data(), int(all.size()), MPI_DOUBLE, MPI_SUM, comm::mpi_of(tp_group));
    View3<T> out(Kokkos::view_alloc(std::string("model::whole_cache"), Kokkos::WithoutInitializing), Nc, Hw, D);
    auto ho = Kokkos::create_mirror_view(out);
    for (int64_t i = 0; i < Nc; ++i)
      for (int64_t k = 0; k < Hw; ++k)
        for (int64_t d = 0; d < D; ++d) ho(i, k, d) = T(all[size_t((i * Hw + k) * D + d)]);
    Kokkos::deep_copy(out, ho);
    return out;
  }
  // The whole layer's values from this rank's slice (TP: each element from the rank that owns
  // it, summed over the TP group in double, which holds fp64, fp32 and bf16 values exactly).
  template <class E>
  View1<E> whole_of(View1<E> mine) const {
    if (tps.tp == 1 || !mine.data()) return mine;
    const TpMap map(m, tps);
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mine);
    std::vector<double> all(size_t(layer_param_count(m)), 0.0);
    for (size_t p = 0; p < params.size(); ++p)
      if (tp_owner(tps, int(p)))
        for (int64_t i = 0; i < params[p].size(); ++i) all[size_t(map.at(int(p), i))] = double(h(params[p].offset + i));
    MPI_Allreduce(MPI_IN_PLACE, all.data(), int(all.size()), MPI_DOUBLE, MPI_SUM, comm::mpi_of(tp_group));
    View1<E> out(Kokkos::view_alloc(std::string("model::whole"), Kokkos::WithoutInitializing), all.size());
    auto ho = Kokkos::create_mirror_view(out);
    for (size_t i = 0; i < all.size(); ++i) ho(i) = E(all[i]);
    Kokkos::deep_copy(out, ho);
    return out;
  }

  // Views of a layer's parameter p (a vector or a [rows, cols] matrix) inside a flat buffer.
  // (flat: the weights, T, or the gradients, A.)
  template <class E>
  View1<E> vec(View1<E> flat, int p) const {
    return View1<E>(flat.data() + params[size_t(p)].offset, params[size_t(p)].rows);
  }
  template <class E>
  View2<E> mat(View1<E> flat, int p) const {
    const Param& pr = params[size_t(p)];
    return View2<E>(flat.data() + pr.offset, pr.rows, pr.cols);
  }
  enum P { AttnNorm, Wq, Wk, Wv, Wo, MlpNorm, W1, W3, W2 };

  template <class E>
  static View3<E> heads(View2<E> x, int64_t h, int64_t d) {
    return View3<E>(x.data(), x.extent(0), h, d);
  }

  // Decode: the scheme's output o3 (T) and lse merged with the new tokens' own block os (A),
  // in A; a T narrower than A is widened for the merge and rounded once after it.
  void merge_self(View3<T> o3, View2<A> lse, View3<A> os) {
    if constexpr (kMixed) {
      const View3<A> wide = heads(o_acc, H, D);
      kernels::convert_view<A, T>(wide, o3);
      kernels::lse_merge<A>(wide, lse, os, lse_self);
      kernels::convert_view<T, A>(o3, wide);
    } else {
      kernels::lse_merge<T>(o3, lse, os, lse_self);
    }
  }
  static bool computes(const cp::Context& ctx) { return ctx.cfg.mode != cp::Mode::CommOnly; }

  // Runs f (one kernel of phase p, doing `flops` GEMM FLOPs), fenced and timed, and records
  // a Kernel event. Comm-only mode skips it.
  template <class Fn>
  void timed(const cp::Context& ctx, PhaseTimes& t, Phase p, double flops, Fn&& f) {
    if (!computes(ctx)) return;
    harness::Watchdog::instance().part(int(p));
    const double t0 = MPI_Wtime();
    f();
    Kokkos::fence();
    const double t1 = MPI_Wtime();
    t.s[int(p)] += t1 - t0;
    if (comm.trace().enabled()) {
      comm::Event e{comm::EventKind::Kernel, -1, -1, -1, 0, flops, t0, t1};
      e.label = int32_t(p);
      comm.trace().add(e);
    }
  }

  // The scheme call: its time blocked on communication is attention comm, the rest compute.
  // The stall watchdog names it by its compute phase (`attention`).
  template <class Fn>
  void timed_attention(cp::Context& ctx, PhaseTimes& t, Fn&& f) {
    harness::Watchdog& dog = harness::Watchdog::instance();
    dog.part(int(Phase::AttnCompute));
    dog.test_stop(comm.trace().context().pass == 1 ? "backward-attention" : "forward-attention");
    const double t0 = MPI_Wtime(), w0 = ctx.stats.comm_wait_s;
    f();
    Kokkos::fence();
    const double wait = ctx.stats.comm_wait_s - w0;
    t.s[int(Phase::AttnComm)] += wait;
    t.s[int(Phase::AttnCompute)] += MPI_Wtime() - t0 - wait;
  }

  // The layer's wall time is measured, not summed: what no phase timed (the loop, tracing,
  // launches) is `other`, so a layer's phases add up to its time.
  static void close_layer(PhaseTimes& t, double t_layer) {
    t.s[int(Phase::Other)] = 0;
    t.s[int(Phase::Other)] = std::max(0.0, MPI_Wtime() - t_layer - t.total());
  }

  static void add(View2<T> out, CV2 a, CV2 b) { residual_add<T>(out, a, b); }
  // The DP mean of a gradient summed over the replicas, as a data-parallel trainer takes it.
  void average_over_replicas(View1<A> dw) const {
    const A inv = A(1) / A(cfg.mesh.dp());
    Kokkos::parallel_for(
        "model::dp_average", Kokkos::RangePolicy<kernels::Exec>(0, dw.extent(0)),
        KOKKOS_LAMBDA(const size_t i) { dw(i) *= inv; });
  }

  // One GEMM of phase p as its own timed kernel event: C = op(X) op(Y) + beta C. C is T (an
  // activation or its gradient) or A (a weight gradient: kernels::gemm_acc).
  template <class E>
  void gemm(const cp::Context& ctx, PhaseTimes& t, Phase p, Trans ta, Trans tb, CV2 X, CV2 Y, A beta, View2<E> Cm) {
    const double K = double(ta == Trans::N ? X.extent(1) : X.extent(0));
    timed(ctx, t, p, 2.0 * double(Cm.extent(0)) * double(Cm.extent(1)) * K, [&] {
      if constexpr (std::is_same<E, T>::value)
        kernels::gemm<T>(ta, tb, 1, X, Y, beta, Cm);
      else
        kernels::gemm_acc<T>(ta, tb, 1, X, Y, beta, Cm);
    });
  }

  // A TP collective in flight: tp_post posts it, tp_wait waits for it. Both count as phase
  // TpComm (the time the compute path pays); the bytes go to tp_bytes when it is posted.
  // Compute-only mode posts nothing.
  struct TpInFlight {
    comm::Request r;
    bool live = false;
  };
  template <class Post>
  TpInFlight tp_post(const cp::Context& ctx, PhaseTimes& t, Post&& post) {
    if (ctx.cfg.mode == cp::Mode::ComputeOnly) return {};
    harness::Watchdog::instance().part(int(Phase::TpComm));
    const double t0 = MPI_Wtime();
    const int64_t b0 = comm.bytes_sent();
    TpInFlight f{post(), true};
    t.s[int(Phase::TpComm)] += MPI_Wtime() - t0;
    tp_bytes += comm.bytes_sent() - b0;
    return f;
  }
  void tp_wait(PhaseTimes& t, TpInFlight& f) {
    if (!f.live) return;
    harness::Watchdog::instance().part(int(Phase::TpComm));
    const double t0 = MPI_Wtime();
    comm.wait(f.r);
    f.live = false;
    t.s[int(Phase::TpComm)] += MPI_Wtime() - t0;
  }
  template <class Post>
  void tp_comm(const cp::Context& ctx, PhaseTimes& t, Post&& post) {
    TpInFlight f = tp_post(ctx, t, post);
    tp_wait(t, f);
  }
  // Rows [r0, r0 + nr) of x, as a view of their own.
  static View2<T> row_range(View2<T> x, int64_t r0, int64_t nr) {
    return View2<T>(x.data() + r0 * int64_t(x.extent(1)), size_t(nr), x.extent(1));
  }
  // Column-parallel GEMMs on the CP shard's rows [N,C] of a tensor each TP rank holds n rows
  // of (`mine`): gemms(X, r0, first) runs them on X, the shard's rows [r0, r0 + X rows), the
  // first call with beta 0 into the weight gradients (later calls add). With sequence
  // parallelism the rows are all-gathered into `out` (TP rank r's are the shard's r-th n).
  // With tp_overlap the GEMMs on the rank's own rows run while the all-gather is in flight,
  // the others' after it; else one call on all N rows, after it. Returns the N rows.
  template <class Gemms>
  CV2 column_parallel(const cp::Context& ctx, PhaseTimes& t, CV2 mine, View2<T> out, Gemms&& gemms) {
    if (!sp) {
      gemms(mine, 0, true);
      return mine;
    }
    TpInFlight f =
        tp_post(ctx, t, [&] { return comm.iallgather(mine.data(), out.data(), mine.span() * sizeof(T), tp_group); });
    const int64_t r0 = tps.rank * n;
    if (!cfg.tp_overlap) {
      tp_wait(t, f);
      gemms(out, 0, true);
      return out;
    }
    gemms(mine, r0, true);
    tp_wait(t, f);
    if (r0 > 0) gemms(row_range(out, 0, r0), 0, false);
    if (r0 + n < N) gemms(row_range(out, r0 + n, N - r0 - n), r0 + n, false);
    return out;
  }
  // A row-parallel product's partial sums `part` [N,C] summed over TP: with sequence
  // parallelism this rank's n rows, reduce-scattered into rs; else all-reduced in place.
  // beside() runs while the collective is in flight with tp_overlap, after it without;
  // it must not touch part or rs.
  template <class Beside>
  View2<T> reduce(const cp::Context& ctx, PhaseTimes& t, View2<T> part, Beside&& beside) {
    if (tps.tp == 1) {
      beside();
      return part;
    }
    const comm::DType dt = cp::dtype_of<T>();
    TpInFlight f = tp_post(ctx, t, [&] {
      return sp ? comm.ireduce_scatter(part.data(), rs.data(), rs.span(), dt, tp_group)
                : comm.iallreduce(part.data(), part.span(), dt, comm::ReduceOp::Sum, tp_group);
    });
    if (!cfg.tp_overlap) tp_wait(t, f);
    beside();
    tp_wait(t, f);
    return sp ? rs : part;
  }
  View2<T> reduce(const cp::Context& ctx, PhaseTimes& t, View2<T> part) {
    return reduce(ctx, t, part, [] {});
  }
  // y = x + in W, W row-parallel ([its rows, C]): without TP one GEMM accumulating into the
  // copy of x; with TP the partial product summed over TP (reduce), then added to x.
  void row_parallel(const cp::Context& ctx, PhaseTimes& t, Phase p, CV2 in, CV2 W, CV2 x, View2<T> y) {
    if (tps.tp == 1) {
      timed(ctx, t, p, 0, [&] { Kokkos::deep_copy(y, x); });
      gemm(ctx, t, p, Trans::N, Trans::N, in, W, 1, y);
      return;
    }
    gemm(ctx, t, p, Trans::N, Trans::N, in, W, 0, full);
    const View2<T> r = reduce(ctx, t, full);
    timed(ctx, t, p, 0, [&] { add(y, x, r); });
  }
  // The weight gradients TP ranks hold copies of, summed over the copies' holders: the norms'
  // with sequence parallelism (each rank saw its own rows), replicated K/V heads' (each rank's
  // query heads' share).
  void sum_tp_copies(const cp::Context& ctx, PhaseTimes& t, Layer& L) {
    const comm::DType dt = cp::dtype_of<A>();
    auto sum = [&](View1<A> v, const comm::Group& g) {
      tp_comm(ctx, t, [&] { return comm.iallreduce(v.data(), v.span(), dt, comm::ReduceOp::Sum, g); });
    };
    if (sp) sum(vec(L.dw, AttnNorm), tp_group), sum(vec(L.dw, MlpNorm), tp_group);
    if (tps.kv_copies > 1)  // wk and wv, one after the other in the buffer
      sum(View1<A>(L.dw.data() + params[Wk].offset, size_t(params[Wk].size() + params[Wv].size())), kv_group);
  }

  void forward_layer(cp::Context& ctx, int l) {
    Layer& L = layers[size_t(l)];
    L.fwd = PhaseTimes{};
    comm.trace().context().layer = l;
    comm.trace().context().pass = 0;
    harness::Watchdog::instance().layer(l, 0);
    const View2<T> x = xs[size_t(l)], y = xs[size_t(l) + 1];
    PhaseTimes& t = L.fwd;
    const double t_layer = MPI_Wtime();
    const View2<T> h1 = sp ? hl : L.h1;  // the norm's rows: this rank's n, gathered into L.h1 [N,C]
    timed(ctx, t, Phase::Norm, 0, [&] { kernels::rmsnorm_fwd<T>(x, vec(L.w, AttnNorm), A(m.norm_eps), h1, L.rstd1); });
    column_parallel(ctx, t, h1, L.h1, [&](CV2 X, int64_t r0, bool) {  // X: rows [r0, r0 + r) of h1
      const int64_t r = int64_t(X.extent(0));
      gemm(ctx, t, Phase::Qkv, Trans::N, Trans::N, X, mat(L.w, Wq), 0, row_range(L.q, r0, r));  // [r,C] x [C,H*D]
      gemm(ctx, t, Phase::Qkv, Trans::N, Trans::N, X, mat(L.w, Wk), 0, row_range(L.k, r0, r));  // [r,C] x [C,Hkv*D]
      gemm(ctx, t, Phase::Qkv, Trans::N, Trans::N, X, mat(L.w, Wv), 0, row_range(L.v, r0, r));
    });
    const View3<T> q3 = heads(L.q, H, D), k3 = heads(L.k, Hkv, D), v3 = heads(L.v, Hkv, D), o3 = heads(L.o, H, D);
    timed(ctx, t, Phase::Rope, 0, [&] { kernels::rope_apply<T>(q3, pos, m.rope_theta); });
    timed(ctx, t, Phase::Rope, 0, [&] { kernels::rope_apply<T>(k3, pos, m.rope_theta); });
    if (cfg.pass == Pass::Decode) {
      timed_attention(ctx, t, [&] {
        L.scheme->forward(ctx, q3, L.kc, L.vc, o3, L.lse);  // against the cache
        if (computes(ctx)) {                                // the new tokens' own block, then one LSE merge
          const auto mask = cp::make_mask(acfg, rows, rows);
          const View3<A> os = heads(o_self, H, D);
          ctx.stats.flops += kernels::attention_fwd<T>(q3, k3, v3, mask, os, lse_self, acfg.attn).flops;
          merge_self(o3, L.lse, os);
        }
      });
    } else {
      timed_attention(ctx, t, [&] { L.scheme->forward(ctx, q3, k3, v3, o3, L.lse); });
    }
    row_parallel(ctx, t, Phase::OutProj, L.o, mat(L.w, Wo), x, L.x2);  // x2 = x + o Wo
    const View2<T> h2 = sp ? hl : L.h2;
    timed(ctx, t, Phase::Norm, 0,
          [&] { kernels::rmsnorm_fwd<T>(L.x2, vec(L.w, MlpNorm), A(m.norm_eps), h2, L.rstd2); });
    column_parallel(ctx, t, h2, L.h2, [&](CV2 X, int64_t r0, bool) {
      const int64_t r = int64_t(X.extent(0));
      gemm(ctx, t, Phase::Mlp, Trans::N, Trans::N, X, mat(L.w, W1), 0, row_range(L.a, r0, r));  // [r,C] x [C,F]
      gemm(ctx, t, Phase::Mlp, Trans::N, Trans::N, X, mat(L.w, W3), 0, row_range(L.b, r0, r));
    });
    timed(ctx, t, Phase::Mlp, 0, [&] { kernels::swiglu_fwd<T>(L.a, L.b, g); });
    row_parallel(ctx, t, Phase::Mlp, g, mat(L.w, W2), L.x2, y);  // y = x2 + g W2
    close_layer(t, t_layer);
  }

  // dyl[N,C] (gradient of layer l's output) -> dxl[N,C]; the layer's dW are overwritten (each
  // dW GEMM writes with beta = 0, so no pass over the 9 weight blocks zeroes them first).
  void backward_layer(cp::Context& ctx, int l, CV2 dyl, View2<T> dxl) {
    Layer& L = layers[size_t(l)];
    L.bwd = PhaseTimes{};
    comm.trace().context().layer = l;
    comm.trace().context().pass = 1;
    harness::Watchdog::instance().layer(l, 1);
    PhaseTimes& t = L.bwd;
    const double t_layer = MPI_Wtime();
    const View2<T> x = xs[size_t(l)];
    timed(ctx, t, Phase::Mlp, 0, [&] { kernels::swiglu_fwd<T>(L.a, L.b, g); });  // recomputed gate [N,F]
    column_parallel(ctx, t, dyl, full, [&](CV2 X, int64_t r0, bool first) {      // X: rows of dy (sp: gathered)
      const int64_t r = int64_t(X.extent(0));
      gemm(ctx, t, Phase::Mlp, Trans::N, Trans::T, X, mat(L.w, W2), 0, row_range(dg, r0, r));  // dg = dy W2^T
      gemm(ctx, t, Phase::Mlp, Trans::T, Trans::N, row_range(g, r0, r), X, first ? 0 : 1, mat(L.dw, W2));  // g^T dy
    });
    timed(ctx, t, Phase::Mlp, 0, [&] { kernels::swiglu_bwd<T>(L.a, L.b, dg, da, db); });
    gemm(ctx, t, Phase::Mlp, Trans::N, Trans::T, da, mat(L.w, W1), 0, dh);  // dh = da W1^T + db W3^T
    gemm(ctx, t, Phase::Mlp, Trans::N, Trans::T, db, mat(L.w, W3), 1, dh);
    const View2<T> dh2 = reduce(ctx, t, dh, [&] {                                // summed over TP: [n,C]
      gemm(ctx, t, Phase::Mlp, Trans::T, Trans::N, L.h2, da, 0, mat(L.dw, W1));  // dW1 = h2^T da
      gemm(ctx, t, Phase::Mlp, Trans::T, Trans::N, L.h2, db, 0, mat(L.dw, W3));  // dW3 = h2^T db
    });
    timed(ctx, t, Phase::Norm, 0, [&] {
      Kokkos::deep_copy(vec(L.dw, MlpNorm), A(0));  // rmsnorm_bwd accumulates dw
      kernels::rmsnorm_bwd<T>(L.x2, vec(L.w, MlpNorm), L.rstd2, dh2, dxn, vec(L.dw, MlpNorm));
    });
    timed(ctx, t, Phase::Norm, 0, [&] { add(dx2, dyl, dxn); });  // the residual
    column_parallel(ctx, t, dx2, full, [&](CV2 X, int64_t r0, bool first) {
      const int64_t r = int64_t(X.extent(0));
      gemm(ctx, t, Phase::OutProj, Trans::N, Trans::T, X, mat(L.w, Wo), 0, row_range(dO, r0, r));  // dx2 Wo^T
      gemm(ctx, t, Phase::OutProj, Trans::T, Trans::N, row_range(L.o, r0, r), X, first ? 0 : 1,
           mat(L.dw, Wo));  // dWo = o^T dx2
    });
    const View3<T> dq3 = heads(dq, H, D), dk3 = heads(dk, Hkv, D);
    timed_attention(ctx, t, [&] {
      L.scheme->backward(ctx, heads(L.q, H, D), heads(L.k, Hkv, D), heads(L.v, Hkv, D), heads(L.o, H, D), L.lse,
                         heads(dO, H, D), dq3, dk3, heads(dv, Hkv, D));
    });
    timed(ctx, t, Phase::Rope, 0, [&] { kernels::rope_apply<T>(dq3, pos, m.rope_theta, true); });
    timed(ctx, t, Phase::Rope, 0, [&] { kernels::rope_apply<T>(dk3, pos, m.rope_theta, true); });
    gemm(ctx, t, Phase::Qkv, Trans::N, Trans::T, dq, mat(L.w, Wq), 0, dh);  // dh = dq Wq^T + dk Wk^T + dv Wv^T
    gemm(ctx, t, Phase::Qkv, Trans::N, Trans::T, dk, mat(L.w, Wk), 1, dh);
    gemm(ctx, t, Phase::Qkv, Trans::N, Trans::T, dv, mat(L.w, Wv), 1, dh);
    const View2<T> dh1 = reduce(ctx, t, dh, [&] {
      gemm(ctx, t, Phase::Qkv, Trans::T, Trans::N, L.h1, dq, 0, mat(L.dw, Wq));  // dWq = h1^T dq
      gemm(ctx, t, Phase::Qkv, Trans::T, Trans::N, L.h1, dk, 0, mat(L.dw, Wk));
      gemm(ctx, t, Phase::Qkv, Trans::T, Trans::N, L.h1, dv, 0, mat(L.dw, Wv));
    });
    timed(ctx, t, Phase::Norm, 0, [&] {
      Kokkos::deep_copy(vec(L.dw, AttnNorm), A(0));
      kernels::rmsnorm_bwd<T>(x, vec(L.w, AttnNorm), L.rstd1, dh1, dxn, vec(L.dw, AttnNorm));
    });
    timed(ctx, t, Phase::Norm, 0, [&] { add(dxl, dx2, dxn); });
    if (tps.tp > 1) sum_tp_copies(ctx, t, L);
    // The layer's dW are final: summed over the group while the layers below compute.
    // Posting can block (Open MPI copies or takes the progress thread's lock): that time is
    // all-reduce time the compute path pays, so it counts as such.
    if (grad_group.size > 1 && ctx.cfg.mode != cp::Mode::ComputeOnly) {
      harness::Watchdog::instance().part(int(Phase::GradAllreduce));
      const double p0 = MPI_Wtime();
      const int64_t b0 = comm.bytes_sent();
      const bool wire = L.dw_wire.data() != nullptr;  // summed in bf16: round first
      if constexpr (kMixed)
        if (wire) kernels::convert_view<T, A>(L.dw_wire, L.dw);
      char* buf = wire ? reinterpret_cast<char*>(L.dw_wire.data()) : reinterpret_cast<char*>(L.dw.data());
      const comm::DType dt = wire ? comm::DType::BF16 : cp::dtype_of<A>();
      const size_t elem = comm::dtype_size(dt), bucket = std::max<size_t>(1, kGradBucketBytes / elem);
      for (size_t at = 0; at < L.dw.span(); at += bucket)
        L.grad_reqs.push_back(comm.iallreduce(buf + at * elem, std::min(bucket, L.dw.span() - at), dt,
                                              comm::ReduceOp::Sum, grad_group, l));
      const double posting = MPI_Wtime() - p0;
      t.s[int(Phase::GradAllreduce)] += posting;
      grad_exposed += posting;
      grad_bytes += comm.bytes_sent() - b0;
    }
    close_layer(t, t_layer);
  }

  // The stack's own time between and around its layers (the loop, the final waits' loop)
  // goes to `other` of the layer that ran last, so the layers' phases add up to the call.
  // pass: &Layer::fwd or &Layer::bwd; last: the layer that ran last.
  void close_stack(double t_call, PhaseTimes Layer::*pass, Layer& last) {
    double inside = 0;
    for (const Layer& L : layers) inside += (L.*pass).total();
    (last.*pass).s[int(Phase::Other)] += std::max(0.0, MPI_Wtime() - t_call - inside);
  }

  void forward(cp::Context& ctx) {
    const double t_call = MPI_Wtime();
    tp_bytes = 0;
    for (int l = 0; l < m.layers; ++l) forward_layer(ctx, l);
    close_stack(t_call, &Layer::fwd, layers.back());
  }

  void backward(cp::Context& ctx) {
    if (cfg.pass != Pass::Train)
      throw std::logic_error(std::string("the ") + to_string(cfg.pass) + " pass has no backward");
    const double t_call = MPI_Wtime(), busy0 = comm.collective_busy_s();
    grad_exposed = 0;
    grad_bytes = 0;
    CV2 cur = dy;
    for (int l = m.layers - 1; l >= 0; --l) {
      View2<T> out = gbuf[(m.layers - 1 - l) % 2];
      backward_layer(ctx, l, cur, out);
      cur = out;
      dx = out;
    }
    for (int l = 0; l < m.layers; ++l) {  // what is left of the all-reduces after the last layer's backward
      Layer& L = layers[size_t(l)];
      if (L.grad_reqs.empty()) continue;
      harness::Watchdog::instance().layer(l, 1);
      harness::Watchdog::instance().part(int(Phase::GradAllreduce));
      const double t0 = MPI_Wtime();
      for (comm::Request& r : L.grad_reqs) comm.wait(r);
      L.grad_reqs.clear();
      if constexpr (kMixed)
        if (L.dw_wire.data()) kernels::convert_view<A, T>(L.dw, L.dw_wire);
      if (cfg.mesh.dp() > 1) average_over_replicas(L.dw);
      const double dt = MPI_Wtime() - t0;
      L.bwd.s[int(Phase::GradAllreduce)] += dt;
      grad_exposed += dt;
    }
    grad_busy = comm.collective_busy_s() - busy0;
    close_stack(t_call, &Layer::bwd, layers.front());
  }
};

template <class T>
Stack<T>::Stack(const StackConfig& cfg, const cp::SchemeInfo& scheme, comm::Communicator& comm)
    : p_(std::make_unique<Impl>(cfg, scheme, comm)) {}
template <class T>
Stack<T>::~Stack() = default;
template <class T>
void Stack<T>::forward(cp::Context& ctx) {
  p_->forward(ctx);
}
template <class T>
void Stack<T>::backward(cp::Context& ctx) {
  p_->backward(ctx);
}
template <class T>
const std::vector<int64_t>& Stack<T>::rows() const {
  return p_->rows;
}
template <class T>
View2<T> Stack<T>::x() const {
  return p_->xs.front();
}
template <class T>
View2<T> Stack<T>::y() const {
  return p_->xs.back();
}
template <class T>
View2<T> Stack<T>::dy() const {
  return p_->dy;
}
template <class T>
View2<T> Stack<T>::dx() const {
  return p_->dx;
}
template <class T>
View1<T> Stack<T>::params(int layer) const {
  return p_->layers.at(size_t(layer)).w;
}
template <class T>
View1<kernels::acc_t<T>> Stack<T>::grads(int layer) const {
  return p_->layers.at(size_t(layer)).dw;
}
template <class T>
View3<T> Stack<T>::cache_k(int layer) const {
  return p_->layers.at(size_t(layer)).kc;
}
template <class T>
View3<T> Stack<T>::cache_v(int layer) const {
  return p_->layers.at(size_t(layer)).vc;
}
template <class T>
View3<T> Stack<T>::whole_cache_k(int layer) const {
  return p_->whole_cache(cache_k(layer));
}
template <class T>
View3<T> Stack<T>::whole_cache_v(int layer) const {
  return p_->whole_cache(cache_v(layer));
}
template <class T>
bool Stack<T>::owns_rows() const {
  return p_->sp || p_->tps.rank == 0;
}
template <class T>
const std::vector<int64_t>& Stack<T>::cache_rows() const {
  return p_->cache_rows;
}
template <class T>
const PhaseTimes& Stack<T>::forward_times(int layer) const {
  return p_->layers.at(size_t(layer)).fwd;
}
template <class T>
const PhaseTimes& Stack<T>::backward_times(int layer) const {
  return p_->layers.at(size_t(layer)).bwd;
}
template <class T>
View1<T> Stack<T>::whole_params(int layer) const {
  return p_->whole_of(p_->layers.at(size_t(layer)).w);
}
template <class T>
View1<kernels::acc_t<T>> Stack<T>::whole_grads(int layer) const {
  return p_->whole_of(p_->layers.at(size_t(layer)).dw);
}
template <class T>
int64_t Stack<T>::tp_bytes() const {
  return p_->tp_bytes;
}
template <class T>
double Stack<T>::grad_allreduce_exposed_s() const {
  return p_->grad_exposed;
}
template <class T>
int64_t Stack<T>::grad_allreduce_bytes() const {
  return p_->grad_bytes;
}
template <class T>
double Stack<T>::grad_allreduce_busy_s() const {
  return p_->grad_busy;
}

template class Stack<float>;
template class Stack<double>;
template class Stack<kernels::bf16>;

}  // namespace minicp::model
