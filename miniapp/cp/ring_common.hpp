// Pass-KV ring attention over a group, shared by ring, zigzag, stripe (the layout is the
// only difference), usp (over its ring group) and doublering. Forward: at step s rank r
// computes against the K/V block that started on group rank (r - s) mod P while the next
// block is in flight; it ends with the block of rank r + 1, which it can keep (KeptBlock).
// Backward runs the ring the other way and ends with the rank's own block: at step s it
// computes block (r + 1 + s) mod P, starting from the kept block (else fetched, exposed),
// and each block's dK/dV accumulator travels with it, one step behind, so it reaches its
// owner during the owner's last step: every transfer overlaps a step of compute, and the
// backward moves P-2 K/V blocks and P-1 accumulators instead of P-1 and P. Blocks whose
// positions are fully masked are skipped (positions are all-gathered once, not sent). Blocks
// may hold unequal token counts (a dispatch's): each exchange sends the block it holds and
// receives the next one's size, and the buffers hold the largest.
// Precision (bf16 runs): K/V blocks travel in the stored type T (bf16); partial (O, LSE),
// their merges and dQ are in acc_t<T> (fp32); the dK/dV accumulators travel in fp32, or in
// bf16 with Config::bf16_dkv (DkvWire). Callers round the acc_t results into their outputs.
#pragma once
#include <functional>
#include <vector>

#include "kernels/attention.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {

// isendrecv channel of the dK/dV accumulators (K/V blocks use channel 0).
constexpr int kAccChannel = 1;

// The [K | V] block (2 * Skv * Hkv * D values) a ring forward ended with: group rank r + 1's,
// which the backward starts from. Owned by one scheme object (one per layer), so another
// forward on another object cannot overwrite it. It is reused by a backward handed the k, v
// the forward had (fingerprints), when every rank of the group agrees (a later forward on
// the same object with other data replaces it; see Fingerprint).
template <class T>
struct KeptBlock {
  View1<T> buf;
  Fingerprint k, v;
  bool valid = false;
  // Invalidates the block and returns its buffer, sized for n2 values (allocated once).
  View1<T> reserve(size_t n2) {
    valid = false;
    if (buf.extent(0) != n2)
      buf = View1<T>(Kokkos::view_alloc(std::string("cp_kept_kv"), Kokkos::WithoutInitializing), n2);
    return buf;
  }
  // Marks the buffer as the block a forward on (kd, vd) ended with.
  void keep(CView3<T> kd, CView3<T> vd) {
    k = fingerprint(kd);
    v = fingerprint(vd);
    valid = true;
  }
  // True on this rank when it holds the block a forward on (kd, vd) ended with (its buffer
  // holds the group's largest block, at least this rank's).
  bool holds(CView3<T> kd, CView3<T> vd) const {
    return valid && buf.extent(0) >= 2 * kd.span() && k == fingerprint(kd) && v == fingerprint(vd);
  }
  // True on every rank of g when each holds its block (collective over g).
  bool holds_everywhere(Context& ctx, const comm::Group& g, CView3<T> kd, CView3<T> vd) const {
    return all_agree(ctx, g, holds(kd, vd));
  }
};

// A backward without a kept block: sends this rank's [K | V] to group rank `to`, receives
// group rank `from`'s (from_rows rows; default: as many as this rank's) into the scratch
// buffer `name` and waits for it (exposed).
template <class T>
View1<T> fetch_block(Context& ctx, const comm::Group& g, CView3<T> k, CView3<T> v, int to, int from,
                     const std::string& name, size_t from_rows = SIZE_MAX) {
  const size_t n2 = 2 * k.span(), row = k.extent(1) * k.extent(2);
  const size_t m2 = from_rows == SIZE_MAX ? n2 : 2 * from_rows * row;
  View1<T> own = scratch<T>(name + "_own", n2), got = scratch<T>(name, m2);
  pack_kv<T>(k, v, own);
  comm::Request req = ctx.comm.isendrecv(own.data(), n2 * sizeof(T), to, got.data(), m2 * sizeof(T), from, g, -1);
  timed_wait(ctx, req);
  return got;
}

// q[Sq,H,D] at positions qpos; k,v[Skv,Hkv,D] at kpos (Skv may differ between group ranks).
// o, lse: the merged result in acc_t<T>.
template <class T>
void ring_forward(Context& ctx, const comm::Group& g, CView3<T> q, CView3<T> k, CView3<T> v,
                  const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos, View3<kernels::acc_t<T>> o,
                  View2<kernels::acc_t<T>> lse, KeptBlock<T>* keep = nullptr) {
  const int P = g.size, r = g.rank;
  const size_t Hkv = k.extent(1), D = k.extent(2), row = Hkv * D;
  const auto allpos = allgather_positions(ctx, g, kpos);
  const size_t n = max_rows(allpos) * row;  // values of the largest K (or V) block
  auto rows = [&](int b) { return allpos[size_t((b + P) % P)].size(); };
  const std::string gid = ":g" + std::to_string(g.id);
  View1<T> buf[2] = {scratch<T>("ring_kv0" + gid, 2 * n), scratch<T>("ring_kv1" + gid, 2 * n)};
  if (keep) keep->valid = false;
  if (keep && P > 1 && communicates(ctx)) buf[(P - 1) % 2] = keep->reserve(2 * n);  // the last step's: kept
  if (!communicates(ctx)) Kokkos::deep_copy(buf[0], T(0.0f));                       // larger blocks read past k, v
  pack_kv<T>(k, v, buf[0]);
  OnlineMerge<kernels::acc_t<T>> acc(o, lse, "ring" + gid);
  for (int s = 0; s < P; ++s) {
    ctx.at_step(s);
    View1<T> cur = communicates(ctx) ? buf[s % 2] : buf[0], nxt = buf[(s + 1) % 2];
    const size_t Sb = rows(r - s);  // rows of this step's block (compute-only: read from buf[0], zeroed past k, v)
    comm::Request req =
        ring_pass(ctx, g, s, cur.data(), 2 * Sb * row * sizeof(T), nxt.data(), 2 * rows(r - s - 1) * row * sizeof(T));
    const std::vector<int64_t>& bpos = allpos[size_t(r - s + P) % P];
    if (computes(ctx)) {
      if (fully_masked(ctx.cfg, qpos, bpos)) {
        ++ctx.stats.blocks_skipped;
      } else {
        const auto Kc = view3<T>(cur.data(), Sb, Hkv, D), Vc = view3<T>(cur.data() + Sb * row, Sb, Hkv, D);
        const auto mask = make_mask(ctx.cfg, qpos, bpos);
        const auto [ob, lb] = acc.next();
        timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, Kc, Vc, mask, ob, lb, ctx.cfg.attn); });
        acc.merge(ctx);
      }
    }
    timed_wait(ctx, req);
  }
  acc.finish();  // nothing visible to any local row: 0 / -inf
  if (keep && P > 1 && communicates(ctx)) keep->keep(k, v);
}

// Given the forward's o, lse[Sq,H] and dout[Sq,H,D] -> dq[Sq,H,D], dk, dv[Skv,Hkv,D] in
// acc_t<T> (overwritten). kept: the forward's KeptBlock, or null (the first block is then fetched).
template <class T>
void ring_backward(Context& ctx, const comm::Group& g, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o,
                   CView2<kernels::acc_t<T>> lse, CView3<T> dout, const std::vector<int64_t>& qpos,
                   const std::vector<int64_t>& kpos, View3<kernels::acc_t<T>> dq, View3<kernels::acc_t<T>> dk,
                   View3<kernels::acc_t<T>> dv, const KeptBlock<T>* kept = nullptr) {
  using A = kernels::acc_t<T>;
  const int P = g.size, r = g.rank, next = (r + 1) % P, prev = (r - 1 + P) % P;
  const size_t Hkv = k.extent(1), D = k.extent(2), row = Hkv * D;
  const bool talk = communicates(ctx) && P > 1;
  const auto allpos = allgather_positions(ctx, g, kpos);
  const size_t n = max_rows(allpos) * row;  // values of the largest K (or V) block
  auto rows = [&](int b) { return allpos[size_t((b + P) % P)].size(); };
  const std::string gid = ":g" + std::to_string(g.id);
  // K/V of steps 1..P-2 alternate between two scratch buffers; step 0's is the kept block
  // (or a buffer it is fetched into); step P-1 computes on k, v themselves.
  View1<T> kv[2] = {scratch<T>("ring_kv0" + gid, 2 * n), scratch<T>("ring_kv1" + gid, 2 * n)};
  View1<A> dkv[2] = {scratch<A>("ring_dkv0" + gid, 2 * n), scratch<A>("ring_dkv1" + gid, 2 * n)};
  const DkvWire<T> wire(ctx, 2 * n, "ring_dkv_recv" + gid);
  auto kv_of = [&](int s) { return kv[(s - 1) % 2]; };
  View1<T> first;  // no forward on this object: rank r+1's block is fetched now
  if (talk)
    first = kept && kept->holds_everywhere(ctx, g, k, v)
                ? kept->buf
                : fetch_block<T>(ctx, g, k, v, prev, next, "ring_kv_first" + gid, rows(next));
  Kokkos::deep_copy(dq, A(0));
  if (!talk && P > 1) wire.zero_received();
  comm::Request req_kv, req_acc;
  if (!talk && P > 1) Kokkos::deep_copy(kv[0], T(0.0f)), pack_kv<T>(k, v, kv[0]);  // compute-only's stand-in
  for (int s = 0; s < P; ++s) {
    ctx.at_step(s);
    const bool own = s == P - 1;
    const int b = r + 1 + s;  // this step's block
    const size_t Sb = rows(b), nb = Sb * row;
    // This step's K/V, and the [dK | dV] buffer its partial goes to (dk, dv on the last step).
    // Compute-only mode computes every step on a block of the step's size that holds k, v.
    CView3<T> Kc = k, Vc = v;
    View3<A> dKc = dk, dVc = dv;
    if (!own) {
      View1<T> cur = !talk ? kv[0] : s == 0 ? first : kv_of(s);
      Kc = view3<T>(cur.data(), Sb, Hkv, D);
      Vc = view3<T>(cur.data() + nb, Sb, Hkv, D);
      if (talk && s + 1 < P - 1)  // step s+1's block; this one goes on to the previous rank
        req_kv = ctx.comm.isendrecv(cur.data(), 2 * nb * sizeof(T), prev, kv_of(s + 1).data(),
                                    2 * rows(b + 1) * row * sizeof(T), next, g, s);
    }
    if (!own) {
      dKc = view3<A>(dkv[s % 2].data(), Sb, Hkv, D);
      dVc = view3<A>(dkv[s % 2].data() + nb, Sb, Hkv, D);
    }
    timed_aux(ctx, [&] {
      Kokkos::deep_copy(dKc, A(0));
      Kokkos::deep_copy(dVc, A(0));
    });
    const std::vector<int64_t>& bpos = allpos[size_t(b % P)];
    if (computes(ctx)) {
      if (fully_masked(ctx.cfg, qpos, bpos)) {
        ++ctx.stats.blocks_skipped;
      } else {
        const auto mask = make_mask(ctx.cfg, qpos, bpos);
        timed_compute(
            ctx, [&] { return kernels::attention_bwd<T>(q, Kc, Vc, o, lse, dout, mask, dq, dKc, dVc, ctx.cfg.attn); });
      }
    }
    if (s > 0) {  // this block's accumulator from the next rank (compute-only mode adds a
                  // zero buffer instead: same work, no communication)
      timed_wait(ctx, req_acc);
      if (computes(ctx))
        timed_aux(ctx, [&] {
          wire.add_received(flat(dKc), 0);
          wire.add_received(flat(dVc), nb);
        });
    }
    if (!own && talk) {  // on to the previous rank, which computes this block next step
      req_acc = ctx.comm.isendrecv(wire.to_send(ctx, dkv[s % 2], 2 * nb), wire.bytes(2 * nb), prev, wire.received(),
                                   wire.bytes(2 * rows(b + 1) * row), next, g, s, kAccChannel);
    }
    timed_wait(ctx, req_kv);
  }
}

// The ring schemes over the whole CP group, differing only in their token layout.
template <class T>
class RingScheme final : public Scheme<T> {
 public:
  explicit RingScheme(layout::Kind kind) : kind_(kind) {}

  using A = kernels::acc_t<T>;
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto& g = ctx.comm.world();
    const auto pos = shard_tokens(kind_, ctx.cfg, g.size, g.rank);
    const AccOut<T> oa(o, "ring_o_acc");
    ring_forward<T>(ctx, g, q, k, v, pos, pos, oa.acc(), lse, &kept_);
    oa.store(ctx);
  }
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    const auto& g = ctx.comm.world();
    const auto pos = shard_tokens(kind_, ctx.cfg, g.size, g.rank);
    const AccOut<T> dqa(dq, "ring_dq_acc"), dka(dk, "ring_dk_acc"), dva(dv, "ring_dv_acc");
    ring_backward<T>(ctx, g, q, k, v, o, lse, dout, pos, pos, dqa.acc(), dka.acc(), dva.acc(), &kept_);
    for (const AccOut<T>* x : {&dqa, &dka, &dva}) x->store(ctx);
  }

 private:
  layout::Kind kind_;
  KeptBlock<T> kept_;  // the forward's last K/V block, which the backward starts from
};

// A ring of P ranks' buffers for q[sq,H,D], k,v[skv,Hkv,D], a forward then its backward, in
// units u (Units): scratch for two K/V blocks in flight and three dK/dV accumulators (2*skv*Hkv*D
// each, at any P: two in acc_t, the received one on the wire, which with bf16_dkv also has a
// send buffer), and with P > 1 one partial (O, LSE) in acc_t and the K/V block each object
// keeps. A backward without its forward's block (no forward on the object, or other data)
// fetches its first block into two more blocks (fetch_block): `fetched` counts them, for
// callers that do that.
inline Workspace ring_workspace(const Units& u, double sq, double skv, int H, int Hkv, int D, int P,
                                bool fetched = false) {
  const double block = 2.0 * skv * Hkv * D;
  const bool ring = P > 1;
  return {(2 + (fetched && ring ? 2 : 0) + 2 * u.acc + dkv_wire_values(u)) * block +
              (ring ? u.acc * sq * H * (D + 1.0) : 0),
          ring ? block : 0};
}

// ring_forward / ring_backward on group rank r of a ring of P members as the performance model
// sees them: member i is world rank world(i) and holds rows(i) as queries and keys (equal
// counts on every member). fetched: the backward fetches its first block (no kept block).
// own_q: the queries when they are not rows(r) (doublering's inner ring on another node's block).
inline std::vector<predict::Step> ring_steps(const Config& c, const predict::Topo& t, int P, int r,
                                             const std::function<int(int)>& world,
                                             const std::function<predict::Spans(int)>& rows, int heads, int kv_heads,
                                             bool backward, size_t elem, bool fetched = false,
                                             const predict::Spans* own_q = nullptr) {
  const predict::Spans q = own_q ? *own_q : rows(r);
  const double nq = double(layout::count(q));
  // Values of member b's [K | V] block (members may hold unequal counts: a dispatch's).
  std::vector<double> kv_values(static_cast<size_t>(P), 0.0);
  for (int b = 0; b < P; ++b) kv_values[size_t(b)] = 2.0 * double(layout::count(rows(b))) * kv_heads * c.head_dim;
  const bool inter = !t.same_node(world(r), world((r + 1) % P)) || !t.same_node(world(r), world((r - 1 + P) % P));
  auto pass = [&](int b, size_t e) {  // sending member b's block (K/V in elem, dK/dV in e)
    return predict::CommCall{comm::EventKind::SendRecv, int64_t(kv_values[size_t(b)] * e), P, inter};
  };
  std::vector<predict::Step> steps(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    predict::Step& st = steps[size_t(s)];
    const int b = backward ? (r + 1 + s) % P : (r - s + P) % P;
    st.attn.push_back({q, rows(b), heads, kv_heads});
    if (!backward) {
      if (s < P - 1) st.overlapped.push_back(pass(b, elem));
      st.aux_values = s == 0 ? kv_values[size_t(r)] : nq * heads * (c.head_dim + 1.0);  // pack, then merges
      continue;
    }
    if (P == 1) break;
    if (s + 1 < P - 1) st.overlapped.push_back(pass(b, elem));                  // this block on, the next one in
    if (s >= 1) st.overlapped.push_back(pass((r + s) % P, dkv_elem(c, elem)));  // the last step's block's dK/dV
    st.aux_values = (s >= 1 ? 2 : 1) * kv_values[size_t(b)] + (s == 0 ? nq * heads * c.head_dim : 0);
  }
  bool group_inter = false;
  for (int i = 1; i < P; ++i) group_inter = group_inter || !t.same_node(world(0), world(i));
  if (backward && P > 1)  // the agreement on the kept block (one int64), or the fetch of the first one
    steps[0].exposed.push_back(fetched ? pass(r, elem)
                                       : predict::CommCall{comm::EventKind::AllReduce, 8, P, group_inter});
  // Every call gathers the members' key positions first (allgather_positions), unless they
  // are the case's dispatch, which every rank knows.
  if (!c.tokens || int(c.tokens->size()) != P)
    steps[0].exposed.insert(steps[0].exposed.begin(), predict::CommCall{comm::EventKind::AllGather,
                                                                        int64_t(nq * sizeof(int64_t)), P, group_inter});
  return steps;
}

inline SchemeInfo ring_family_info(const std::string& name, layout::Kind kind, const std::string& summary) {
  SchemeInfo s = make_info<RingScheme>(name, summary, kind);
  s.ring_family = true;
  s.takes_dispatch = true;
  s.refuses = std::string("seq_len not divisible by ") + (kind == layout::Kind::Zigzag ? "2*ranks" : "ranks") +
              " (its own layout; a dispatch takes any)";
  s.check = [name, kind](const Config& c) {
    return c.tokens ? std::string() : layout::check(kind, c.seq_len, c.ranks, name);
  };
  s.shard = [kind](const Config& c, int r) {
    const auto t = shard_tokens(kind, c, c.ranks, r);
    return Shard{t, t};
  };
  s.workspace = [](const Config& c) {  // n: the largest block's tokens
    const double n = c.tokens ? double(max_rows(*c.tokens)) : double(c.seq_len) / c.ranks;
    return by_precision(c, [&](const Units& u) {
      Workspace w = ring_workspace(u, n, n, c.heads, c.kv_heads, c.head_dim, c.ranks);
      w.shared += output_accumulators(u, c, n, n);
      return w;
    });
  };
  s.schedule = [kind](const Config& c, const predict::Topo& t, int r, bool backward, size_t elem) {
    const auto table = c.tokens ? dispatch_spans(c.tokens) : nullptr;  // looked up once, not per step
    auto block = [&](int i) { return table ? (*table)[size_t(i)] : layout::spans_of(kind, c.seq_len, c.ranks, i); };
    return predict::Schedule{ring_steps(
        c, t, c.ranks, r, [](int i) { return i; }, block, c.heads, c.kv_heads, backward, elem)};
  };
  return s;
}

}  // namespace minicp::cp
