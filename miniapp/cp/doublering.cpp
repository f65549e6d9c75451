// Scheme `doublering` (LoongTrain): pass-KV as two nested rings over a zigzag layout. An
// inner ring of I ranks inside a node runs the plain ring (ring_common.hpp) on the "outer
// block" each rank holds, while the outer ring moves those blocks one node on (P/I steps)
// in the background, so the slow cross-node hop is paid once per I inner steps, not per step.
// Backward: both rings run the other way from the blocks the forward ended with and end
// with the own block; each outer step's dK/dV partial goes straight back to its owner node.
// Inner ring size I: the inner_ring setting when > 0; else the fewest ranks sharing a node (MIN over
// ranks) when that divides P and is < P; else 2 when P >= 4 and even; else P (one ring).
#include <optional>
#include <stdexcept>

#include "miniapp/cp/layout.hpp"
#include "miniapp/cp/ring_common.hpp"

namespace minicp::cp {
namespace {

// The default rule above, from the communicator's node topology.
int inner_ring_size(const Config& cfg, const comm::Topology& topo, int P) {
  if (const int I = cfg.setting("inner_ring"); I > 0) return I;
  const int fewest = topo.min_local_size;
  if (fewest < P && P % fewest == 0) return fewest;
  if (P >= 4 && P % 2 == 0) return 2;
  return P;
}

// Outer blocks travel in T; the outer merge, dQ and the dK/dV sums are in acc_t<T>, and each
// outer step's dK/dV partial goes home on the DkvWire (fp32, or bf16 with bf16_dkv).
template <class T>
class DoubleRing final : public Scheme<T> {
  using A = kernels::acc_t<T>;
  using CVA = Kokkos::View<const A*, Kokkos::LayoutRight, kernels::Mem>;

 public:
  // q, k, v[S/P, H|Hkv, D] (zigzag shard) -> o[S/P,H,D], lse[S/P,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    setup(ctx);
    const int O = outer_.size, nd = outer_.rank;
    const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span(), bytes = 2 * n * sizeof(T);
    const bool outer_comm = O > 1 && communicates(ctx);
    const auto qpos = block_positions(ctx, 0);
    // Outer blocks of steps 1..O-1 alternate between two buffers; the last one is the
    // object's own (kept for the backward). Step 0 computes on k, v; buf[0] holds their
    // packed copy for the outer ring.
    View1<T> buf[2];
    outer_kept_.valid = false;
    if (outer_comm) {
      buf[0] = scratch<T>("doublering_kv0", 2 * n);
      buf[1] = scratch<T>("doublering_kv1", 2 * n);
      buf[(O - 1) % 2] = outer_kept_.reserve(2 * n);
      pack_kv<T>(k, v, buf[0]);
    }
    const AccOut<T> oa(o, "doublering_o_acc");
    OnlineMerge<A> acc(oa.acc(), lse, "doublering");
    for (int s = 0; s < O; ++s) {
      comm::Request req;
      if (s < O - 1 && outer_comm)  // next outer block, in flight during the inner ring
        req = ctx.comm.isendrecv(buf[s % 2].data(), bytes, (nd + 1) % O, buf[(s + 1) % 2].data(), bytes,
                                 (nd - 1 + O) % O, outer_, s);
      const auto kpos = block_positions(ctx, s);
      CView3<T> Kc = k, Vc = v;
      if (s > 0 && outer_comm) {
        Kc = view3<T>(buf[s % 2].data(), Skv, Hkv, D);
        Vc = view3<T>(buf[s % 2].data() + n, Skv, Hkv, D);
      }
      // The last outer step's inner ring keeps its last block: the backward starts there.
      KeptBlock<T>* keep = s == O - 1 ? &inner_kept_ : nullptr;
      const auto [ob, lb] = acc.next();
      ring_forward<T>(ctx, inner_, q, Kc, Vc, qpos, kpos, ob, lb, keep);
      if (computes(ctx)) acc.merge(ctx);
      timed_wait(ctx, req);
    }
    acc.finish();
    oa.store(ctx);
    if (outer_comm) outer_kept_.keep(k, v);
  }

  // Given o, lse and dout[S/P,H,D] -> dq[S/P,H,D], dk, dv[S/P,Hkv,D] (overwritten). The outer
  // ring runs the other way, like the inner one (ring_common.hpp): it starts from the outer
  // block the forward ended with (node nd+1's) and ends with the node's own, so each outer
  // step's dK/dV partial goes straight home while a later step computes, and the last
  // partial for this rank's own block arrives during its own last step.
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq_out, View3<T> dk_out, View3<T> dv_out) override {
    setup(ctx);
    const int O = outer_.size, nd = outer_.rank;
    const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span(), bytes = 2 * n * sizeof(T);
    const bool outer_comm = O > 1 && communicates(ctx);
    const auto qpos = block_positions(ctx, 0);
    const AccOut<T> dqa(dq_out, "doublering_dq_acc"), dka(dk_out, "doublering_dk_acc"),
        dva(dv_out, "doublering_dv_acc");
    const View3<A>&dq = dqa.acc(), &dk = dka.acc(), &dv = dva.acc();
    Kokkos::deep_copy(dq, A(0));
    Kokkos::deep_copy(dk, A(0));
    Kokkos::deep_copy(dv, A(0));
    View1<T> kv[2], first;
    View1<A> dkv[2] = {scratch<A>("doublering_dkv0", 2 * n), {}};
    std::optional<DkvWire<T>> wire;
    if (outer_comm) {
      kv[0] = scratch<T>("doublering_kv0", 2 * n);
      kv[1] = scratch<T>("doublering_kv1", 2 * n);
      dkv[1] = scratch<A>("doublering_dkv1", 2 * n);
      wire.emplace(ctx, 2 * n, "doublering_dkv_recv");
      // No forward on this object: node nd+1's block is fetched now.
      first = outer_kept_.holds_everywhere(ctx, outer_, k, v)
                  ? outer_kept_.buf
                  : fetch_block<T>(ctx, outer_, k, v, (nd - 1 + O) % O, (nd + 1) % O, "doublering_kv_first");
    }
    auto kv_of = [&](int t) { return t == 0 ? first : kv[(t - 1) % 2]; };
    View3<A> dq_step =
        view3<A>(scratch<A>("doublering_dq_step", dq.span()).data(), dq.extent(0), dq.extent(1), dq.extent(2));
    // dk, dv += a [dK | dV] buffer of 2n values.
    auto add_dkv = [&](View1<A> src) {
      timed_aux(ctx, [&] {
        add_into<A>(flat(dk), CVA(src.data(), n));
        add_into<A>(flat(dv), CVA(src.data() + n, n));
      });
    };
    comm::Request req_dkv;
    for (int t = 0; t < O; ++t) {
      const bool own = t == O - 1;
      const int b = (nd + 1 + t) % O;  // the node whose outer block this step computes
      CView3<T> Kc = k, Vc = v;        // the own block (and every block in compute-only mode)
      comm::Request req_kv;
      if (!own && outer_comm) {
        View1<T> cur = kv_of(t);
        Kc = view3<T>(cur.data(), Skv, Hkv, D);
        Vc = view3<T>(cur.data() + n, Skv, Hkv, D);
        if (t + 1 < O - 1) {  // step t+1's block; this one goes on to node nd-1
          req_kv = ctx.comm.isendrecv(cur.data(), bytes, (nd - 1 + O) % O, kv_of(t + 1).data(), bytes, (nd + 1) % O,
                                      outer_, t);
        }
      }
      const auto kpos = outer_block_positions(ctx, b);
      // This node's dK/dV partial for outer block b.
      View1<A> part = outer_comm ? dkv[t % 2] : dkv[0];
      ring_backward<T>(ctx, inner_, q, Kc, Vc, o, lse, dout, qpos, kpos, dq_step, view3<A>(part.data(), Skv, Hkv, D),
                       view3<A>(part.data() + n, Skv, Hkv, D), t == 0 ? &inner_kept_ : nullptr);
      timed_aux(ctx, [&] { add_into<A>(flat(dq), CVA(dq_step.data(), dq_step.span())); });
      if (req_dkv.active()) {  // a partial for this rank's own block, from node nd-t
        timed_wait(ctx, req_dkv);
        timed_aux(ctx, [&] {
          wire->add_received(flat(dk), 0);
          wire->add_received(flat(dv), n);
        });
      }
      if (own || !outer_comm) {
        add_dkv(part);
      } else {  // home to node b; node nd-1-t's partial for this rank's block comes back
        req_dkv = ctx.comm.isendrecv(wire->to_send(ctx, part), wire->bytes(), b, wire->received(), wire->bytes(),
                                     (nd - 1 - t + 2 * O) % O, outer_, t, kAccChannel);
      }
      timed_wait(ctx, req_kv);
    }
    for (const AccOut<T>* x : {&dqa, &dka, &dva}) x->store(ctx);
  }

 private:
  // Splits the world into the node (inner) and cross-node (outer) rings once per object, or
  // again if the rank count or the requested inner size changed. Collective.
  void setup(Context& ctx) {
    const int P = ctx.comm.world().size;
    if (ready_ && P == ranks_ && ctx.cfg.setting("inner_ring") == requested_) return;
    const int I = inner_ring_size(ctx.cfg, ctx.comm.topology(), P);
    if (I < 1 || P % I != 0)
      throw std::invalid_argument("doublering needs inner_ring (" + std::to_string(I) + ") dividing ranks (" +
                                  std::to_string(P) + ")");
    inner_ = ctx.comm.split_contiguous(I, "node");
    outer_ = ctx.comm.split_strided(P / I, "cross");
    ranks_ = P;
    requested_ = ctx.cfg.setting("inner_ring");
    ready_ = true;
  }

  // Positions of the outer block held at forward outer step s: it started on rank (node - s,
  // inner rank).
  std::vector<int64_t> block_positions(const Context& ctx, int s) const {
    const int O = outer_.size;
    return outer_block_positions(ctx, (outer_.rank - s + O) % O);
  }
  // Positions of node b's outer block as this inner rank holds it.
  std::vector<int64_t> outer_block_positions(const Context& ctx, int b) const {
    return layout::zigzag(ctx.cfg.seq_len, ranks_, b * inner_.size + inner_.rank);
  }

  comm::Group inner_, outer_;
  KeptBlock<T> outer_kept_;  // the forward's last outer block (node nd+1's)
  KeptBlock<T> inner_kept_;  // the inner ring's last block of the forward's last outer step
  bool ready_ = false;
  int ranks_ = 0, requested_ = 0;
};

}  // namespace

// The model's view: for each outer step an inner ring (ring_steps) over the I ranks of a node on
// the outer block of node (nd - s) mod O (backward: (nd + 1 + t) mod O, from a fetched first
// block after the first step), while the outer transfers (the next outer block; backward also
// the dK/dV partial going home) run beside it; they are waited for after the inner ring, so
// the model lays them on its last step. I follows inner_ring_size's rule on the job's layout.
static predict::Schedule doublering_schedule(const Config& c, const predict::Topo& t, int r, bool backward,
                                             size_t elem) {
  const int P = c.ranks, per_node = std::min(t.ranks_per_node, P);
  const int fewest = std::min(per_node, P - (t.nodes() - 1) * per_node);
  const int set = c.setting("inner_ring");
  const int I = set > 0 ? set : (fewest < P && P % fewest == 0) ? fewest : (P >= 4 && P % 2 == 0) ? 2 : P;
  const int O = P / I, nd = r / I, ir = r % I;
  const predict::Spans own = layout::zigzag_spans(c.seq_len, P, r);
  const double block = 2.0 * double(layout::count(own)) * c.kv_heads * c.head_dim;
  const bool inter = !t.same_node(r, ((nd + 1) % O) * I + ir) || !t.same_node(r, ((nd - 1 + O) % O) * I + ir);
  const predict::CommCall outer{comm::EventKind::SendRecv, int64_t(block * elem), O, inter};
  const predict::CommCall partial{comm::EventKind::SendRecv, int64_t(block * dkv_elem(c, elem)), O, inter};
  predict::Schedule out;
  for (int s = 0; s < O; ++s) {
    const int b = backward ? (nd + 1 + s) % O : (nd - s + O) % O;
    auto inner = ring_steps(
        c, t, I, ir, [&](int i) { return nd * I + i; },
        [&](int i) { return layout::zigzag_spans(c.seq_len, P, b * I + i); }, c.heads, c.kv_heads, backward, elem,
        backward && s > 0, &own);
    if (O > 1) {
      if (backward ? s + 1 < O - 1 : s < O - 1) inner.back().overlapped.push_back(outer);
      if (backward && s < O - 1) inner.back().overlapped.push_back(partial);  // the partial going home
      if (backward && s == 0) inner.front().exposed.push_back({comm::EventKind::AllReduce, 8, O, inter});
    }
    out.steps.insert(out.steps.end(), inner.begin(), inner.end());
  }
  return out;
}

SchemeInfo doublering_scheme() {
  SchemeInfo s = make_info<DoubleRing>(
      "doublering", "LoongTrain double ring: pass-KV inner ring inside a node, outer ring across nodes, zigzag layout");
  s.settings = {{"inner_ring",
                 "doublering: inner ring size (ranks); 0 = the fewest ranks on a node when that divides ranks, else 2 "
                 "when ranks >= 4 and even, else ranks",
                 0, 0, [](const Config& c, const comm::Topology& t) { return inner_ring_size(c, t, c.ranks); }}};
  s.ring_family = true;
  s.refuses = "inner_ring not dividing ranks; seq_len not divisible by 2*ranks";
  s.check = [](const Config& c) -> std::string {
    const std::string why = layout::check(layout::Kind::Zigzag, c.seq_len, c.ranks, "doublering");
    if (!why.empty()) return why;
    const int I = c.setting("inner_ring");
    if (I > 0 && c.ranks % I != 0)
      return "doublering needs inner_ring (" + std::to_string(I) + ") dividing ranks (" + std::to_string(c.ranks) + ")";
    return "";
  };
  s.shard = [](const Config& c, int r) {
    const auto t = layout::zigzag(c.seq_len, c.ranks, r);
    return Shard{t, t};
  };
  // For an inner ring of I ranks and an outer one of O = P/I: a dQ step, and with O > 1 the
  // outer ring's [K | V]-sized scratch buffers (two in flight, two dK/dV partials and the
  // received one on its wire) and a partial (O, LSE), else one dK/dV buffer, all but the K/V
  // blocks in acc_t; each object keeps the outer block it ended with (O > 1).
  // The inner ring's buffers are each object's own: its scratch is named by the inner group,
  // which every object splits anew (setup()); with O > 1 its backward fetches its first block
  // at every outer step after the first (no kept block there). I depends on the node topology
  // (inner_ring_size), which a Config does not carry: unless inner_ring is set, the most over
  // every divisor of P (the rule picks one of them).
  s.workspace = [](const Config& c) {
    const double n = double(c.seq_len) / c.ranks, nkv = n * c.kv_heads * c.head_dim, nq = n * c.heads * c.head_dim;
    const double block = 2 * nkv;
    auto of = [&](int I) {
      return by_precision(c, [&](const Units& u) {
        const int O = c.ranks / I;
        const Workspace inner = ring_workspace(u, n, n, c.heads, c.kv_heads, c.head_dim, I, O > 1);
        const double outer =
            O > 1 ? (2 + 2 * u.acc + dkv_wire_values(u)) * block + u.acc * (nq + n * c.heads) : u.acc * block;
        return Workspace{u.acc * nq + outer + output_accumulators(u, c, n, n),
                         (O > 1 ? block : 0) + inner.shared + inner.per_object};
      });
    };
    if (const int I = c.setting("inner_ring"); I > 0) return of(I);
    Workspace most;
    for (int I = 1; I <= c.ranks; ++I) {
      if (c.ranks % I != 0) continue;
      const Workspace w = of(I);
      if (w.values(sizeof(float), 1) > most.values(sizeof(float), 1))
        most.shared = w.shared, most.per_object = w.per_object;
      if (w.values(2, 1) > most.values(2, 1))
        most.narrow_shared = w.narrow_shared, most.narrow_per_object = w.narrow_per_object;
    }
    return most;
  };
  s.schedule = doublering_schedule;
  return s;
}

}  // namespace minicp::cp
