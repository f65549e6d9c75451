// Pass-KV ring attention over a group, shared by ring, zigzag, stripe (the layout is the
// only difference), usp (over its ring group) and doublering. At step s rank r computes
// against the K/V block that started on group rank (r - s) mod P while the next block is
// in flight; blocks whose positions are fully masked are skipped (positions of every
// block are all-gathered once, so they need not travel). Backward: each block's dK/dV
// accumulator travels one step behind its block and arrives home after P steps.
#pragma once
#include <vector>

#include "kernels/attention.hpp"
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

// q[Sq,H,D] at positions qpos; k,v[Skv,Hkv,D] at kpos (equal Skv on every group rank).
template <class T>
void ring_forward(Context& ctx, const comm::Group& g, CView3<T> q, CView3<T> k, CView3<T> v,
                  const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos, View3<T> o, View2<T> lse) {
  const int P = g.size, r = g.rank;
  const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span();
  const auto allpos = allgather_positions(ctx, g, kpos);
  const std::string gid = ":g" + std::to_string(g.id);
  View1<T> buf[2] = {scratch<T>("ring_kv0" + gid, 2 * n), scratch<T>("ring_kv1" + gid, 2 * n)};
  Kokkos::deep_copy(View1<T>(buf[0].data(), n), Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>(k.data(), n));
  Kokkos::deep_copy(View1<T>(buf[0].data() + n, n),
                    Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>(v.data(), n));
  View3<T> o_blk;
  View2<T> lse_blk;
  bool have = false;
  for (int s = 0; s < P; ++s) {
    ctx.step = s;
    View1<T> cur = communicates(ctx) ? buf[s % 2] : buf[0], nxt = buf[(s + 1) % 2];
    comm::Request req = ring_pass(ctx, g, s, cur.data(), nxt.data(), 2 * n * sizeof(T));
    const std::vector<int64_t>& bpos = allpos[(r - s + P) % P];
    if (computes(ctx)) {
      if (fully_masked(ctx.cfg, qpos, bpos)) {
        ++ctx.stats.blocks_skipped;
      } else {
        const auto Kc = view3<T>(cur.data(), Skv, Hkv, D), Vc = view3<T>(cur.data() + n, Skv, Hkv, D);
        const auto mask = make_mask(ctx.cfg, qpos, bpos);
        if (!have) {
          timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, Kc, Vc, mask, o, lse, ctx.cfg.attn); });
          have = true;
        } else {
          if (!o_blk.data()) {
            o_blk = view3<T>(scratch<T>("ring_o_blk" + gid, o.span()).data(), o.extent(0), o.extent(1), o.extent(2));
            lse_blk = View2<T>(scratch<T>("ring_lse_blk" + gid, lse.span()).data(), lse.extent(0), lse.extent(1));
          }
          timed_compute(ctx,
                        [&] { return kernels::attention_fwd<T>(q, Kc, Vc, mask, o_blk, lse_blk, ctx.cfg.attn); });
          timed_aux(ctx, [&] { kernels::lse_merge<T>(o, lse, o_blk, lse_blk); });
        }
      }
    }
    timed_wait(ctx, req);
  }
  if (!have) {  // nothing visible to any local row
    Kokkos::deep_copy(o, T(0));
    Kokkos::deep_copy(lse, kernels::neg_inf<T>());
  }
}

template <class T>
void ring_backward(Context& ctx, const comm::Group& g, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o,
                   CView2<T> lse, CView3<T> dout, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos,
                   View3<T> dq, View3<T> dk, View3<T> dv) {
  const int P = g.size, r = g.rank, next = (r + 1) % P, prev = (r - 1 + P) % P;
  const size_t Skv = k.extent(0), Hkv = k.extent(1), D = k.extent(2), n = k.span();
  const size_t bytes = 2 * n * sizeof(T);
  const auto allpos = allgather_positions(ctx, g, kpos);
  using CV1 = Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>;
  const std::string gid = ":g" + std::to_string(g.id);
  View1<T> kv[2] = {scratch<T>("ring_kv0" + gid, 2 * n), scratch<T>("ring_kv1" + gid, 2 * n)};
  View1<T> dkv[2] = {scratch<T>("ring_dkv0" + gid, 2 * n), scratch<T>("ring_dkv1" + gid, 2 * n)};
  View1<T> dkv_recv = scratch<T>("ring_dkv_recv" + gid, 2 * n);
  Kokkos::deep_copy(View1<T>(kv[0].data(), n), CV1(k.data(), n));
  Kokkos::deep_copy(View1<T>(kv[0].data() + n, n), CV1(v.data(), n));
  Kokkos::deep_copy(dq, T(0));
  if (!communicates(ctx)) Kokkos::deep_copy(dkv_recv, T(0));
  comm::Request req_kv, req_dkv;
  for (int s = 0; s < P; ++s) {
    ctx.step = s;
    View1<T> cur = communicates(ctx) ? kv[s % 2] : kv[0], nxt = kv[(s + 1) % 2];
    req_kv = ring_pass(ctx, g, s, cur.data(), nxt.data(), bytes);
    View1<T> blk = dkv[s % 2];
    timed_aux(ctx, [&] { Kokkos::deep_copy(blk, T(0)); });
    const std::vector<int64_t>& bpos = allpos[(r - s + P) % P];
    if (computes(ctx)) {
      if (fully_masked(ctx.cfg, qpos, bpos)) {
        ++ctx.stats.blocks_skipped;
      } else {
        const auto Kc = view3<T>(cur.data(), Skv, Hkv, D), Vc = view3<T>(cur.data() + n, Skv, Hkv, D);
        auto dKc = view3<T>(blk.data(), Skv, Hkv, D), dVc = view3<T>(blk.data() + n, Skv, Hkv, D);
        const auto mask = make_mask(ctx.cfg, qpos, bpos);
        timed_compute(ctx, [&] {
          return kernels::attention_bwd<T>(q, Kc, Vc, o, lse, dout, mask, dq, dKc, dVc, ctx.cfg.attn);
        });
      }
    }
    if (s > 0) {  // the accumulator of this block, from the previous rank (compute-only
                  // mode adds the stale buffer instead: same work, no communication)
      timed_wait(ctx, req_dkv);
      if (computes(ctx)) timed_aux(ctx, [&] { add_into<T>(blk, dkv_recv); });
    }
    if (communicates(ctx)) {
      req_dkv = ctx.comm.isendrecv(blk.data(), bytes, next, dkv_recv.data(), bytes, prev, g, s);
      ctx.stats.bytes_sent += int64_t(bytes);
    }
    timed_wait(ctx, req_kv);
  }
  View1<T> result = dkv[(P - 1) % 2];
  if (communicates(ctx)) {
    timed_wait(ctx, req_dkv);
    result = dkv_recv;
  }
  Kokkos::deep_copy(View1<T>(dk.data(), n), CV1(result.data(), n));
  Kokkos::deep_copy(View1<T>(dv.data(), n), CV1(result.data() + n, n));
}

}  // namespace minicp::cp

#include "miniapp/layout.hpp"

namespace minicp::cp {

// The ring schemes over the whole CP group, differing only in their token layout.
template <class T>
class RingScheme final : public Scheme<T> {
 public:
  explicit RingScheme(layout::Kind kind) : kind_(kind) {}
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<T> lse) override {
    const auto& g = ctx.comm.world();
    const auto pos = layout::of(kind_, ctx.cfg.seq_len, g.size, g.rank);
    ring_forward<T>(ctx, g, q, k, v, pos, pos, o, lse);
  }
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    const auto& g = ctx.comm.world();
    const auto pos = layout::of(kind_, ctx.cfg.seq_len, g.size, g.rank);
    ring_backward<T>(ctx, g, q, k, v, o, lse, dout, pos, pos, dq, dk, dv);
  }

 private:
  layout::Kind kind_;
};

inline SchemeInfo ring_family_info(const std::string& name, layout::Kind kind, const std::string& summary) {
  SchemeInfo s;
  s.name = name;
  s.summary = summary;
  s.check = [name, kind](const Config& c) { return layout::check(kind, c.seq_len, c.ranks, name); };
  s.shard = [kind](const Config& c, int r) {
    const auto t = layout::of(kind, c.seq_len, c.ranks, r);
    return Shard{t, t};
  };
  s.make_f32 = [kind] { return std::make_unique<RingScheme<float>>(kind); };
  s.make_f64 = [kind] { return std::make_unique<RingScheme<double>>(kind); };
  return s;
}

}  // namespace minicp::cp
