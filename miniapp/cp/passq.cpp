// Scheme `passq` (Meta's pass-Q): K,V stay, Q blocks travel a ring (next in flight during compute).
// Unlike pass-KV, a visited rank only makes a partial (O, LSE); one all-to-all returns the partials to
// their owners, which merge by LSE. Backward: Q travels with dout, o, lse; dQ partials return the same way.
// Precision (bf16 runs): Q (backward: Q, dOut, O) travels in bf16, the LSE and the partials
// that go home to be merged or summed, (O, LSE) and dQ, in fp32; dK, dV stay on their rank.
// Its layout is a choice: a dispatch that gives every rank as many tokens replaces zigzag
// (the Q blocks and the all-to-all of the partials are equal-sized).
#include <string>
#include <vector>

#include "miniapp/cp/common.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {
namespace {

// out[n] = sum over p < P of slots[p*n + i] (the dQ partials of one block, in rank order),
// summed in acc_t and stored once.
template <class T>
void sum_slots(View1<T> out, View1<kernels::acc_t<T>> slots, int P) {
  using A = kernels::acc_t<T>;
  const int64_t n = int64_t(out.extent(0));
  Kokkos::parallel_for(
      "cp::passq::sum_dq", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, n),
      KOKKOS_LAMBDA(const int64_t i) {
        A acc = 0;
        for (int p = 0; p < P; ++p) acc += slots(p * n + i);
        out(i) = T(acc);
      });
}

// dst[0, n) = src[0, n) (same memory space).
template <class T>
void copy_into(T* dst, const T* src, size_t n) {
  Kokkos::deep_copy(View1<T>(dst, n), Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>(src, n));
}

template <class T>
class PassQ final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[Sl,H,D], k,v[Sl,Hkv,D] (zigzag rows, or the dispatch's) -> o[Sl,H,D], lse[Sl,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto& g = ctx.comm.world();
    const int P = g.size, r = g.rank;
    const size_t Sl = q.extent(0), H = q.extent(1), D = q.extent(2), n = q.span();
    const size_t slot = n + Sl * H;  // one partial: O[Sl,H,D] then LSE[Sl,H]
    const auto kvpos = shard_tokens(layout::Kind::Zigzag, ctx.cfg, P, r);
    const auto qpos = allgather_positions(ctx, g, kvpos);  // of every Q block
    View1<T> qbuf[2] = {scratch<T>("cp::passq::q0", n), scratch<T>("cp::passq::q1", n)};
    copy_into<T>(qbuf[0].data(), q.data(), n);
    // parts[b] = this rank's partial for Q block b (slot b goes to rank b), in acc_t.
    View1<A> parts = scratch<A>("cp::passq::parts", P * slot);
    auto O_of = [&](View1<A> buf, int b) { return view3<A>(buf.data() + b * slot, Sl, H, D); };
    auto L_of = [&](View1<A> buf, int b) { return View2<A>(buf.data() + b * slot + n, Sl, H); };
    for (int s = 0; s < P; ++s) {
      ctx.at_step(s);
      View1<T> cur = communicates(ctx) ? qbuf[s % 2] : qbuf[0], nxt = qbuf[(s + 1) % 2];
      comm::Request req = ring_pass(ctx, g, s, cur.data(), nxt.data(), n * sizeof(T));
      const int b = (r - s + P) % P;
      if (computes(ctx)) {
        auto Ob = O_of(parts, b);
        auto Lb = L_of(parts, b);
        if (fully_masked(ctx.cfg, qpos[b], kvpos)) {
          ++ctx.stats.blocks_skipped;
          timed_aux(ctx, [&] {
            Kokkos::deep_copy(Ob, A(0));
            Kokkos::deep_copy(Lb, kernels::neg_inf<A>());
          });
        } else {
          const auto Qb = view3<T>(cur.data(), Sl, H, D);
          const auto mask = make_mask(ctx.cfg, qpos[b], kvpos);
          timed_compute(ctx, [&] { return kernels::attention_fwd<T>(Qb, k, v, mask, Ob, Lb, ctx.cfg.attn); });
        }
      }
      timed_wait(ctx, req);
    }
    // Partials home: recv slot j = rank j's partial for my Q block.
    View1<A> recv = parts;
    if (communicates(ctx)) {
      recv = scratch<A>("cp::passq::recv", P * slot);
      ctx.at_step(P);
      timed_alltoall(ctx, g, parts.data(), recv.data(), slot * sizeof(A));
    }
    if (!computes(ctx)) {
      Kokkos::deep_copy(o, T(0));
      Kokkos::deep_copy(lse, kernels::neg_inf<A>());
      return;
    }
    const AccOut<T> oa(o, "cp::passq::o_acc");
    timed_aux(ctx, [&] {
      Kokkos::deep_copy(oa.acc(), O_of(recv, 0));
      Kokkos::deep_copy(lse, L_of(recv, 0));
      for (int j = 1; j < P; ++j) kernels::lse_merge<A>(oa.acc(), lse, O_of(recv, j), L_of(recv, j));
    });
    oa.store(ctx);
  }

  // Given o, lse, dout[Sl,H,D] -> dq[Sl,H,D], dk, dv[Sl,Hkv,D] (overwritten).
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk_out, View3<T> dv_out) override {
    const auto& g = ctx.comm.world();
    const int P = g.size, r = g.rank;
    const size_t Sl = q.extent(0), H = q.extent(1), D = q.extent(2), n = q.span();
    // One travelling block: Q, dOut, O [Sl,H,D] in T, then LSE [Sl,H] in acc_t (3n values of
    // T: 4-byte aligned, n being even with D).
    const size_t blk = 3 * n + lse_values(Sl * H);
    const auto kvpos = shard_tokens(layout::Kind::Zigzag, ctx.cfg, P, r);
    const auto qpos = allgather_positions(ctx, g, kvpos);
    View1<T> buf[2] = {scratch<T>("cp::passq::qblk0", blk), scratch<T>("cp::passq::qblk1", blk)};
    auto lse_of = [&](T* p) { return reinterpret_cast<A*>(p + 3 * n); };
    timed_aux(ctx, [&] {
      copy_into<T>(buf[0].data(), q.data(), n);
      copy_into<T>(buf[0].data() + n, dout.data(), n);
      copy_into<T>(buf[0].data() + 2 * n, o.data(), n);
      copy_into<A>(lse_of(buf[0].data()), lse.data(), Sl * H);
    });
    // dq_parts[b] = this rank's dQ contribution for Q block b [Sl,H,D], in acc_t.
    View1<A> dq_parts("cp::passq::dq_parts", P * n);
    const AccOut<T> dka(dk_out, "cp::passq::dk_acc"), dva(dv_out, "cp::passq::dv_acc");
    const View3<A>&dk = dka.acc(), &dv = dva.acc();
    Kokkos::deep_copy(dk, A(0));
    Kokkos::deep_copy(dv, A(0));
    for (int s = 0; s < P; ++s) {
      ctx.at_step(s);
      View1<T> cur = communicates(ctx) ? buf[s % 2] : buf[0], nxt = buf[(s + 1) % 2];
      comm::Request req = ring_pass(ctx, g, s, cur.data(), nxt.data(), blk * sizeof(T));
      const int b = (r - s + P) % P;
      if (computes(ctx)) {
        if (fully_masked(ctx.cfg, qpos[b], kvpos)) {
          ++ctx.stats.blocks_skipped;
        } else {
          T* p = cur.data();
          const CView3<T> Qb(p, Sl, H, D), dOb(p + n, Sl, H, D), Ob(p + 2 * n, Sl, H, D);
          const CView2<A> Lb(lse_of(p), Sl, H);
          auto dQb = view3<A>(dq_parts.data() + b * n, Sl, H, D);
          const auto mask = make_mask(ctx.cfg, qpos[b], kvpos);
          timed_compute(
              ctx, [&] { return kernels::attention_bwd<T>(Qb, k, v, Ob, Lb, dOb, mask, dQb, dk, dv, ctx.cfg.attn); });
        }
      }
      timed_wait(ctx, req);
    }
    // dQ partials home: recv slot j = rank j's contribution to my dQ.
    View1<A> recv = dq_parts;
    if (communicates(ctx)) {
      recv = scratch<A>("cp::passq::dq_recv", P * n);
      ctx.at_step(P);
      timed_alltoall(ctx, g, dq_parts.data(), recv.data(), n * sizeof(A));
    }
    timed_aux(ctx, [&] { sum_slots<T>(flat(dq), recv, P); });
    dka.store(ctx);
    dva.store(ctx);
  }

 private:
  // Values of T that hold m values of acc_t.
  static size_t lse_values(size_t m) { return m * sizeof(A) / sizeof(T); }
};

}  // namespace

// The model's view: step s computes Q block (r - s) mod P against the own K, V while the next
// block travels (forward: Q; backward: Q, dOut, O, LSE); one all-to-all then returns the
// partials (forward: O, LSE; backward: dQ) to their owners, which merge them.
static predict::Schedule passq_schedule(const Config& c, const predict::Topo& t, int r, bool backward, size_t elem) {
  const int P = c.ranks;
  const double n = double(c.seq_len) / P * c.heads * c.head_dim, lse = double(c.seq_len) / P * c.heads;
  const bool inter = !t.same_node(r, (r + 1) % P) || !t.same_node(r, (r - 1 + P) % P);
  const size_t acc = kernels::acc_size(elem);  // the LSE and the partials that go home
  const predict::CommCall pass{comm::EventKind::SendRecv, int64_t(backward ? 3 * n * elem + lse * acc : n * elem), P,
                               inter};
  auto rows = [&](int b) {
    return c.tokens ? (*dispatch_spans(c.tokens))[size_t(b)] : layout::zigzag_spans(c.seq_len, P, b);
  };
  const predict::Spans kv = rows(r);
  predict::Schedule out;
  for (int s = 0; s < P; ++s) {
    predict::Step st;
    if (s == 0 && !c.tokens)  // the positions of every Q block (a dispatch's every rank knows)
      st.exposed.push_back(
          {comm::EventKind::AllGather, int64_t(layout::count(kv) * sizeof(int64_t)), P, t.spans_nodes(0, P, 1)});
    st.attn.push_back({rows((r - s + P) % P), kv, c.heads, c.kv_heads});
    if (s < P - 1) st.overlapped.push_back(pass);
    out.steps.push_back(st);
  }
  predict::Step home;
  if (P > 1)
    home.exposed.push_back(
        {comm::EventKind::AllToAll, int64_t((backward ? n : n + lse) * acc), P, t.spans_nodes(0, P, 1)});
  home.aux_values = P * (backward ? n : n + lse);
  out.steps.push_back(home);
  return out;
}

SchemeInfo passq_scheme() {
  SchemeInfo s = make_info<PassQ>(
      "passq",
      "Q blocks around a ring, K,V stay (Meta's pass-Q), zigzag layout; partial (O, LSE) and dQ return by all-to-all");
  s.ring_family = true;
  s.takes_dispatch = true;
  s.refuses = "seq_len not divisible by 2*ranks (its own layout); a dispatch of unequal token counts";
  s.check = [](const Config& c) {
    return c.tokens ? equal_tokens(*c.tokens, "passq", c.dispatch)
                    : layout::check(layout::Kind::Zigzag, c.seq_len, c.ranks, "passq");
  };
  s.shard = [](const Config& c, int r) {
    const auto t = shard_tokens(layout::Kind::Zigzag, c, c.ranks, r);
    return Shard{t, t};
  };
  // Forward: two Q blocks, P partials (O, LSE) and their received copies; backward: two
  // travelling [Q | dOut | O | LSE] blocks, P dQ partials and their received copies; the
  // partials and LSEs in acc_t, and a bf16 run's fp32 accumulators of o, dk, dv.
  s.workspace = [](const Config& c) {
    const double n = double(c.seq_len) / c.ranks, P = c.ranks, nq = n * c.heads * c.head_dim, nh = n * c.heads;
    const double nkv = n * c.kv_heads * c.head_dim;
    return by_precision(c, [&](const Units& u) {
      const double a = u.acc;
      return Workspace{
          2 * nq + 2 * P * a * (nq + nh) + 2 * (3 * nq + a * nh) + 2 * P * a * nq + u.extra * a * (nq + 2 * nkv), 0};
    });
  };
  s.schedule = passq_schedule;
  return s;
}

}  // namespace minicp::cp
