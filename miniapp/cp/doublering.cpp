// Scheme `doublering` (LoongTrain): pass-KV as two nested rings over a zigzag layout. An
// inner ring of I ranks inside a node runs the plain ring (ring_common.hpp) on the "outer
// block" each rank holds, while the outer ring moves those blocks one node on (P/I steps)
// in the background, so the slow cross-node hop is paid once per I inner steps, not per step.
// Backward: each outer step's dK/dV partial goes straight back to the block's owner node.
// Inner ring size I: cfg.inner_ring when > 0; else the fewest ranks sharing a node (MIN over
// ranks) when that divides P and is < P; else 2 when P >= 4 and even; else P (one ring).
#include <mpi.h>

#include <stdexcept>

#include "miniapp/cp/ring_common.hpp"
#include "miniapp/layout.hpp"

namespace minicp::cp {
namespace {

// The default rule above; collective over MPI_COMM_WORLD when cfg.inner_ring == 0.
int inner_ring_size(const Config& cfg, int P) {
  if (cfg.inner_ring > 0) return cfg.inner_ring;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1, fewest = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  MPI_Allreduce(&local, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest < P && P % fewest == 0) return fewest;
  if (P >= 4 && P % 2 == 0) return 2;
  return P;
}

template <class T>
class DoubleRing final : public Scheme<T> {
  using CV1 = Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>;

 public:
  // q, k, v[S/P, H|Hkv, D] (zigzag shard) -> o[S/P,H,D], lse[S/P,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<T> lse) override {
    setup(ctx);
    const int O = outer_.size, nd = outer_.rank;
    const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span(), bytes = 2 * n * sizeof(T);
    const auto qpos = block_positions(ctx, 0);
    View1<T> buf[2] = {scratch<T>("doublering_kv0", 2 * n), {}};
    if (O > 1 && communicates(ctx))
      buf[1] = scratch<T>("doublering_kv1", 2 * n);
    Kokkos::deep_copy(View1<T>(buf[0].data(), n), CV1(k.data(), n));
    Kokkos::deep_copy(View1<T>(buf[0].data() + n, n), CV1(v.data(), n));
    View3<T> o_part;
    View2<T> lse_part;
    for (int s = 0; s < O; ++s) {
      View1<T> cur = communicates(ctx) ? buf[s % 2] : buf[0];
      comm::Request req;
      if (s < O - 1 && communicates(ctx)) {  // next outer block, in flight during the inner ring
        req = ctx.comm.isendrecv(cur.data(), bytes, (nd + 1) % O, buf[(s + 1) % 2].data(), bytes, (nd - 1 + O) % O,
                                 outer_, s);
        ctx.stats.bytes_sent += int64_t(bytes);
      }
      const auto kpos = block_positions(ctx, s);
      const auto Kc = view3<T>(cur.data(), Skv, Hkv, D), Vc = view3<T>(cur.data() + n, Skv, Hkv, D);
      if (s == 0) {
        ring_forward<T>(ctx, inner_, q, Kc, Vc, qpos, kpos, o, lse);
      } else {
        if (!o_part.data()) {
          o_part = view3<T>(scratch<T>("doublering_o_part", o.span()).data(), o.extent(0), o.extent(1), o.extent(2));
          lse_part = View2<T>(scratch<T>("doublering_lse_part", lse.span()).data(), lse.extent(0), lse.extent(1));
        }
        ring_forward<T>(ctx, inner_, q, Kc, Vc, qpos, kpos, o_part, lse_part);
        if (computes(ctx)) timed_aux(ctx, [&] { kernels::lse_merge<T>(o, lse, o_part, lse_part); });
      }
      timed_wait(ctx, req);
    }
  }

  // Given o, lse and dout[S/P,H,D] -> dq[S/P,H,D], dk, dv[S/P,Hkv,D] (overwritten).
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    setup(ctx);
    const int O = outer_.size, nd = outer_.rank;
    const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span(), bytes = 2 * n * sizeof(T);
    const bool outer_comm = O > 1 && communicates(ctx);
    const auto qpos = block_positions(ctx, 0);
    Kokkos::deep_copy(dq, T(0));
    Kokkos::deep_copy(dk, T(0));
    Kokkos::deep_copy(dv, T(0));
    View1<T> kv[2] = {scratch<T>("doublering_kv0", 2 * n), {}};
    View1<T> dkv[2] = {scratch<T>("doublering_dkv0", 2 * n), {}};
    View1<T> dkv_recv;
    if (outer_comm) {
      kv[1] = scratch<T>("doublering_kv1", 2 * n);
      dkv[1] = scratch<T>("doublering_dkv1", 2 * n);
      dkv_recv = scratch<T>("doublering_dkv_recv", 2 * n);
    }
    View3<T> dq_step = view3<T>(scratch<T>("doublering_dq_step", dq.span()).data(), dq.extent(0), dq.extent(1),
                                dq.extent(2));
    Kokkos::deep_copy(View1<T>(kv[0].data(), n), CV1(k.data(), n));
    Kokkos::deep_copy(View1<T>(kv[0].data() + n, n), CV1(v.data(), n));
    // dk, dv += a [dK | dV] buffer of 2n values.
    auto add_dkv = [&](View1<T> src) {
      timed_aux(ctx, [&] {
        add_into<T>(flat(dk), CV1(src.data(), n));
        add_into<T>(flat(dv), CV1(src.data() + n, n));
      });
    };
    comm::Request req_dkv;
    for (int s = 0; s < O; ++s) {
      View1<T> cur = outer_comm ? kv[s % 2] : kv[0];
      comm::Request req_kv;
      if (s < O - 1 && outer_comm) {
        req_kv = ctx.comm.isendrecv(cur.data(), bytes, (nd + 1) % O, kv[(s + 1) % 2].data(), bytes,
                                    (nd - 1 + O) % O, outer_, s);
        ctx.stats.bytes_sent += int64_t(bytes);
      }
      const auto kpos = block_positions(ctx, s);
      const auto Kc = view3<T>(cur.data(), Skv, Hkv, D), Vc = view3<T>(cur.data() + n, Skv, Hkv, D);
      // This node's dK/dV for the outer block this rank holds (it started on node nd - s).
      View1<T> part = outer_comm ? dkv[s % 2] : dkv[0];
      ring_backward<T>(ctx, inner_, q, Kc, Vc, o, lse, dout, qpos, kpos, dq_step, view3<T>(part.data(), Skv, Hkv, D),
                       view3<T>(part.data() + n, Skv, Hkv, D));
      timed_aux(ctx, [&] { add_into<T>(flat(dq), CV1(dq_step.data(), dq_step.span())); });
      if (s == 0 || !outer_comm) {
        add_dkv(part);
      } else {
        if (req_dkv.active()) {  // node (nd + s - 1)'s partial for this rank's own block
          timed_wait(ctx, req_dkv);
          add_dkv(dkv_recv);
        }
        req_dkv = ctx.comm.isendrecv(part.data(), bytes, (nd - s + O) % O, dkv_recv.data(), bytes, (nd + s) % O,
                                     outer_, s, kAccChannel);
        ctx.stats.bytes_sent += int64_t(bytes);
      }
      timed_wait(ctx, req_kv);
    }
    if (req_dkv.active()) {
      timed_wait(ctx, req_dkv);
      add_dkv(dkv_recv);
    }
  }

 private:
  // Splits the world into the node (inner) and cross-node (outer) rings once per object, or
  // again if the rank count or the requested inner size changed. Collective.
  void setup(Context& ctx) {
    const int P = ctx.comm.world().size;
    if (ready_ && P == ranks_ && ctx.cfg.inner_ring == requested_) return;
    const int I = inner_ring_size(ctx.cfg, P);
    if (I < 1 || P % I != 0)
      throw std::invalid_argument("doublering needs inner_ring (" + std::to_string(I) + ") dividing ranks (" +
                                  std::to_string(P) + ")");
    inner_ = ctx.comm.split_contiguous(I, "node");
    outer_ = ctx.comm.split_strided(P / I, "cross");
    ranks_ = P;
    requested_ = ctx.cfg.inner_ring;
    ready_ = true;
  }

  // Positions of the outer block held at outer step s: it started on rank (node - s, inner rank).
  std::vector<int64_t> block_positions(const Context& ctx, int s) const {
    const int O = outer_.size, src = (outer_.rank - s + O) % O;
    return layout::zigzag(ctx.cfg.seq_len, ranks_, src * inner_.size + inner_.rank);
  }

  comm::Group inner_, outer_;
  bool ready_ = false;
  int ranks_ = 0, requested_ = 0;
};

}  // namespace

SchemeInfo doublering_scheme() {
  SchemeInfo s;
  s.name = "doublering";
  s.summary = "LoongTrain double ring: pass-KV inner ring inside a node, outer ring across nodes, zigzag layout";
  s.check = [](const Config& c) -> std::string {
    const std::string why = layout::check(layout::Kind::Zigzag, c.seq_len, c.ranks, "doublering");
    if (!why.empty()) return why;
    if (c.inner_ring < 0 || (c.inner_ring > 0 && c.ranks % c.inner_ring != 0))
      return "doublering needs inner_ring (" + std::to_string(c.inner_ring) + ") dividing ranks (" +
             std::to_string(c.ranks) + ")";
    return "";
  };
  s.shard = [](const Config& c, int r) {
    const auto t = layout::zigzag(c.seq_len, c.ranks, r);
    return Shard{t, t};
  };
  s.make_f32 = [] { return std::make_unique<DoubleRing<float>>(); };
  s.make_f64 = [] { return std::make_unique<DoubleRing<double>>(); };
  return s;
}

}  // namespace minicp::cp
