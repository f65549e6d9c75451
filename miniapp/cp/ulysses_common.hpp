// The Ulysses all-to-all shared by `ulysses` and `usp`: a group of U ranks trades its
// sequence shards x[n,H,D] for head shards x_h[U*n,H/U,D] (all the group's tokens, in
// member order), runs attention on those (locally, or as a ring across groups for usp),
// and trades the results back. K/V heads are replicated when kv_heads < U, and their
// gradients are summed on the way back. Each tensor moves in its own all-to-all: into the
// head-sharded tensor directly after a pack, and out of it directly before an unpack.
// Precision (bf16 runs): q, k, v, dout and the results o, dq travel in the stored type T
// (rounded once, before they leave), the LSE in acc_t<T> (fp32); dK/dV of replicated K/V
// heads are partials summed on arrival, so they travel in fp32 (bf16 with Config::bf16_dkv),
// those of unreplicated heads are final and travel in T.
#pragma once
#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/cp/ring_common.hpp"

namespace minicp::cp {

// Which heads group rank w holds after the exchange: `per` slots, slot j holding head
// head(w, j) = (w*stride + j*mult) / group. Query heads are split in disjoint blocks of H/U.
// A rank needs the K/V heads of its own query heads (GQA: query head h reads K/V head
// h / g, g = H/Hkv), laid out so that attention sees a plain GQA problem on the rank:
//   whole K/V groups per rank (H/U a multiple of g): per = H/(U*g), disjoint blocks;
//   all the rank's queries in one K/V group (g a multiple of H/U): per = 1, and g/(H/U)
//     consecutive ranks hold the same K/V head (replicated);
//   otherwise (e.g. H=12, Hkv=4, U=6: ranks straddle groups): one slot per query head,
//     per = H/U, each holding its query head's K/V head (replicated within and across ranks).
// Gradients of a replicated head are summed on the way back (ulysses_unpack).
struct HeadSplit {
  int ranks = 1, per = 1, stride = 1, mult = 1, group = 1;
  KOKKOS_INLINE_FUNCTION int head(int w, int j) const { return (w * stride + j * mult) / group; }
  static HeadSplit query(int H, int U) { return {U, H / U, H / U, 1, 1}; }
  static HeadSplit kv(int H, int Hkv, int U) {
    const int pq = H / U, g = H / Hkv;
    if (pq % g == 0) return {U, pq / g, pq, g, g};
    if (g % pq == 0) return {U, 1, pq, 1, g};
    return {U, pq, pq, 1, g};
  }
};

// The head rule of a Ulysses group of U ranks ("" when met); `unit` names U in the message
// ("ranks" for ulysses, "ulysses" for usp). Any kv_heads dividing heads works (HeadSplit).
inline std::string ulysses_head_check(const std::string& scheme, int H, int U, const std::string& unit) {
  if (H % U == 0) return "";
  return scheme + " needs heads (" + std::to_string(H) + ") divisible by " + unit + " (" + std::to_string(U) + ")";
}

// usp's Ulysses group size for cfg: the ulysses setting when set; otherwise the largest divisor U
// of ranks with U <= ranks/2 (so the ring keeps >= 2 ranks) that divides the heads; 1 when
// ranks == 1 or none does. The ring size is ranks / U.
inline int usp_ulysses_size(const Config& cfg) {
  if (const int U = cfg.setting("ulysses"); U > 0) return U;
  for (int U = cfg.ranks / 2; U > 1; --U)
    if (cfg.ranks % U == 0 && cfg.heads % U == 0) return U;
  return 1;
}

// True when the group's K/V head slots replicate heads (kv_heads < U slots): their dK/dV are
// partials, summed when they come back.
inline bool replicates_kv(const HeadSplit& ks, int kv_heads) { return ks.ranks * ks.per > kv_heads; }

// dK/dV of a Ulysses group go back in acc_t (fp32 for bf16): partials of replicated heads,
// unless Config::bf16_dkv.
inline bool ulysses_dkv_wide(const Config& c, const HeadSplit& ks) {
  return replicates_kv(ks, c.kv_heads) && !c.bf16_dkv;
}

// The engine's buffers for a group of U ranks holding n sequence rows each, in units u: each
// object keeps the head-sharded q, o, dout [U*n, H/U, D], dq and lse in acc_t, k, v [U*n, per,
// D] and dk, dv in acc_t, and, when U > 1, one exchange buffer of the larger of the two (U = 1
// packs in place); a bf16 run also holds an fp32 exchange buffer (LSE; dK/dV when they go back
// wide), and, shared, o's fp32 accumulator and a bf16 buffer results are rounded into.
inline Workspace ulysses_workspace(const Units& u, const Config& c, int U, double n) {
  const HeadSplit ks = HeadSplit::kv(c.heads, c.kv_heads, U);
  const double N = U * n, qh = N * (c.heads / U) * c.head_dim, kh = N * ks.per * c.head_dim, lh = N * (c.heads / U);
  const double exchange =
      U > 1 ? std::max(qh, kh) + u.extra * u.acc * std::max(lh, ulysses_dkv_wide(c, ks) ? kh : 0) : 0;
  return {u.extra * (u.acc * qh + std::max(qh, kh)), (3 + u.acc) * qh + u.acc * lh + (2 + 2 * u.acc) * kh + exchange};
}

// The Ulysses engine as the performance model sees it, on member u of a group of U ranks
// (world rank base + i for member i) holding n sequence rows each: the all-to-alls into head
// shards, `middle` (the attention: one local call, or the ring steps across groups), the
// all-to-alls back. Forward: q, k, v in, o and lse out; backward: dout in, dq, dk, dv out.
inline std::vector<predict::Step> ulysses_steps(const Config& c, const predict::Topo& t, int U, int base, double n,
                                                std::vector<predict::Step> middle, bool backward, size_t elem) {
  const HeadSplit qs = HeadSplit::query(c.heads, U), ks = HeadSplit::kv(c.heads, c.kv_heads, U);
  const bool inter = t.spans_nodes(base, U, 1);
  // One tensor's exchange: per destination, n rows of `per` heads of `width` values of `e` bytes.
  auto a2a = [&](int per, int width, size_t e) {
    return predict::CommCall{comm::EventKind::AllToAll, int64_t(n * per * width * e), U, inter};
  };
  const size_t dkv = ulysses_dkv_wide(c, ks) ? kernels::acc_size(elem) : elem;
  predict::Step in, out;
  if (U > 1) {
    if (backward) {
      in.exposed = {predict::CommCall{comm::EventKind::AllReduce, 8, U, inter}, a2a(qs.per, c.head_dim, elem)};
      out.exposed = {a2a(qs.per, c.head_dim, elem), a2a(ks.per, c.head_dim, dkv), a2a(ks.per, c.head_dim, dkv)};
    } else {
      in.exposed = {a2a(qs.per, c.head_dim, elem), a2a(ks.per, c.head_dim, elem), a2a(ks.per, c.head_dim, elem)};
      out.exposed = {a2a(qs.per, c.head_dim, elem), a2a(qs.per, 1, kernels::acc_size(elem))};
    }
  }
  const double qv = U * n * qs.per * c.head_dim, kv = U * n * ks.per * c.head_dim;
  in.aux_values = backward ? qv : qv + 2 * kv;  // packing
  out.aux_values = backward ? qv + 2 * kv : qv;
  std::vector<predict::Step> steps{in};
  steps.insert(steps.end(), middle.begin(), middle.end());
  steps.push_back(out);
  return steps;
}

// send[w][t][j][:] = x[t, head(w, j), :] for w < U, t < n, j < per (one block per destination).
template <class T>
void ulysses_pack(CView3<T> x, const HeadSplit& s, View1<T> send) {
  const int64_t n = x.extent(0), D = x.extent(2), per = s.per;
  Kokkos::parallel_for(
      "cp::ulysses::pack", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, s.ranks * n * per),
      KOKKOS_LAMBDA(const int64_t row) {
        const int64_t j = row % per, t = (row / per) % n, w = row / (per * n);
        const int64_t h = s.head(int(w), int(j));
        for (int64_t d = 0; d < D; ++d) send(row * D + d) = x(t, h, d);
      });
}

// out[t, c, :] = sum over the slots (w, j) holding head c of recv[w][t][j][:] (one term
// unless heads were replicated), summed in acc_t<X> and stored once. Overwrites out[n,Hx,D].
template <class S, class X>
void ulysses_unpack(Kokkos::View<const S*, Kokkos::LayoutRight, kernels::Mem> recv, const HeadSplit& s, View3<X> out) {
  using A = kernels::acc_t<X>;
  const int64_t n = out.extent(0), Hx = out.extent(1), D = out.extent(2), per = s.per;
  Kokkos::parallel_for(
      "cp::ulysses::unpack", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, n * Hx),
      KOKKOS_LAMBDA(const int64_t row) {
        const int64_t t = row / Hx, c = row % Hx;
        // The slots holding head c are found once per row, not per element: one slot (the
        // rule unless K/V heads were replicated) is a copy the compiler vectorises; searching
        // the U x per slots for each of the D elements made this 8x a copy at 8 heads.
        int hits = 0;
        int64_t first = 0;
        for (int w = 0; w < s.ranks; ++w)
          for (int j = 0; j < per; ++j)
            if (s.head(w, j) == c) first = hits++ == 0 ? ((w * n + t) * per + j) * D : first;
        if (hits == 1) {
          for (int64_t d = 0; d < D; ++d) out(t, c, d) = X(A(recv(first + d)));
          return;
        }
        for (int64_t d = 0; d < D; ++d) {
          A sum = A(0);
          for (int w = 0; w < s.ranks; ++w)
            for (int j = 0; j < per; ++j)
              if (s.head(w, j) == c) sum += A(recv(((w * n + t) * per + j) * D + d));
          out(t, c, d) = X(sum);
        }
      });
}

// Head-sharded attention over Ulysses group `ug`, then locally (rg == nullptr or of size 1)
// or as a ring over group *rg. pos: positions of the head-sharded rows, the members' shards
// in member order.
// The head-sharded tensors of the forward stay for the backward (same object) and are reused
// when the backward is handed the forward's q, k, v, o, lse (fingerprints, agreed over ug);
// otherwise the backward exchanges them again, so any order of calls gives the right result.
template <class T>
class UlyssesEngine {
  using A = kernels::acc_t<T>;

 public:
  // q[n,H,D], k,v[n,Hkv,D] sequence-sharded -> o[n,H,D], lse[n,H].
  void forward(Context& ctx, const comm::Group& ug, const comm::Group* rg, const std::vector<int64_t>& pos, CView3<T> q,
               CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) {
    have_fwd_ = false;
    scatter_inputs(ctx, ug, q, k, v);
    const AccOut<T> oh(o_h_, "ulysses_o_h_acc");  // rounded into o_h_, which the backward reads
    if (!rg || rg->size == 1) {
      ctx.at_step(0);
      if (computes(ctx)) {
        const auto mask = make_mask(ctx.cfg, pos, pos);
        timed_compute(
            ctx, [&] { return kernels::attention_fwd<T>(q_h_, k_h_, v_h_, mask, oh.acc(), lse_h_, ctx.cfg.attn); });
      }
    } else {
      ring_forward<T>(ctx, *rg, q_h_, k_h_, v_h_, pos, pos, oh.acc(), lse_h_, &kept_);
    }
    oh.store(ctx);
    to_seq<T, T>(ctx, ug, o_h_, qs_, o);
    to_seq<A, A>(ctx, ug, lse3(lse_h_), qs_, lse3(lse));
    fwd_ = prints(q, k, v, o, lse);
    fwd_mode_ = ctx.cfg.mode;
    have_fwd_ = true;
  }

  // dout[n,H,D] -> dq[n,H,D], dk, dv[n,Hkv,D] (overwritten; replicated kv heads summed).
  void backward(Context& ctx, const comm::Group& ug, const comm::Group* rg, const std::vector<int64_t>& pos,
                CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout, View3<T> dq,
                View3<T> dk, View3<T> dv) {
    bool same = have_fwd_ && fwd_mode_ == ctx.cfg.mode && fwd_ == prints(q, k, v, o, lse);
    if (communicates(ctx)) same = all_agree(ctx, ug, same);
    if (!same) {  // not the forward's data (or no forward on this object): exchange again
      scatter_inputs(ctx, ug, q, k, v);
      to_heads<T>(ctx, ug, o, qs_, o_h_);
      to_heads<A>(ctx, ug, lse3(lse), qs_, lse3(lse_h_));
      have_fwd_ = false;
    }
    const size_t N = q_h_.extent(0), D = q_h_.extent(2);
    realloc(dout_h_, "ulysses_dout_h", N, size_t(qs_.per), D);
    realloc(dq_h_, "ulysses_dq_h", N, size_t(qs_.per), D);
    realloc(dk_h_, "ulysses_dk_h", N, size_t(ks_.per), D);
    realloc(dv_h_, "ulysses_dv_h", N, size_t(ks_.per), D);
    to_heads<T>(ctx, ug, dout, qs_, dout_h_);
    if (!rg || rg->size == 1) {
      ctx.at_step(0);
      timed_aux(ctx, [&] {
        Kokkos::deep_copy(dq_h_, A(0));
        Kokkos::deep_copy(dk_h_, A(0));
        Kokkos::deep_copy(dv_h_, A(0));
      });
      if (computes(ctx)) {
        const auto mask = make_mask(ctx.cfg, pos, pos);
        timed_compute(ctx, [&] {
          return kernels::attention_bwd<T>(q_h_, k_h_, v_h_, o_h_, lse_h_, dout_h_, mask, dq_h_, dk_h_, dv_h_,
                                           ctx.cfg.attn);
        });
      }
    } else {
      ring_backward<T>(ctx, *rg, q_h_, k_h_, v_h_, o_h_, lse_h_, dout_h_, pos, pos, dq_h_, dk_h_, dv_h_, &kept_);
    }
    const bool dkv_wide = ulysses_dkv_wide(ctx.cfg, ks_);
    result_to_seq(ctx, ug, dq_h_, qs_, dq, false);
    result_to_seq(ctx, ug, dk_h_, ks_, dk, dkv_wide);
    result_to_seq(ctx, ug, dv_h_, ks_, dv, dkv_wide);
  }

 private:
  template <class W>
  using CV1 = Kokkos::View<const W*, Kokkos::LayoutRight, kernels::Mem>;

  template <class W>
  static void realloc(View3<W>& x, const char* label, size_t n0, size_t n1, size_t n2) {
    if (x.extent(0) != n0 || x.extent(1) != n1 || x.extent(2) != n2)
      x = View3<W>(Kokkos::view_alloc(std::string(label)), n0, n1, n2);
  }
  // The exchange buffer of n values of W: one for T, and in a bf16 run one for its fp32 values.
  template <class W>
  View1<W> exchange_buffer(size_t n) {
    View1<W>* b = nullptr;
    if constexpr (std::is_same<W, T>::value)
      b = &buf_;
    else
      b = &buf_acc_;
    if (b->extent(0) < n) *b = View1<W>(Kokkos::view_alloc("ulysses_buf", Kokkos::WithoutInitializing), n);
    return *b;
  }
  // [n,H] seen as [n,H,1], so LSE moves through the same code as the tensors.
  static View3<A> lse3(const View2<A>& x) { return View3<A>(x.data(), x.extent(0), x.extent(1), 1); }
  static CView3<A> lse3(const CView2<A>& x) { return CView3<A>(x.data(), x.extent(0), x.extent(1), 1); }

  void scatter_inputs(Context& ctx, const comm::Group& ug, CView3<T> q, CView3<T> k, CView3<T> v) {
    const int U = ug.size, H = int(q.extent(1)), Hkv = int(k.extent(1));
    const std::string why = ulysses_head_check("ulysses group", H, U, "its size");
    if (!why.empty()) throw std::invalid_argument(why);
    qs_ = HeadSplit::query(H, U);
    ks_ = HeadSplit::kv(H, Hkv, U);
    const size_t N = size_t(U) * q.extent(0), D = q.extent(2);
    realloc(q_h_, "ulysses_q_h", N, size_t(qs_.per), D);
    realloc(k_h_, "ulysses_k_h", N, size_t(ks_.per), D);
    realloc(v_h_, "ulysses_v_h", N, size_t(ks_.per), D);
    realloc(o_h_, "ulysses_o_h", N, size_t(qs_.per), D);
    if (lse_h_.extent(0) != N || lse_h_.extent(1) != size_t(qs_.per))
      lse_h_ = View2<A>("ulysses_lse_h", N, size_t(qs_.per));
    to_heads<T>(ctx, ug, q, qs_, q_h_);
    to_heads<T>(ctx, ug, k, ks_, k_h_);
    to_heads<T>(ctx, ug, v, ks_, v_h_);
  }

  // Moves blocks of count_per_rank values from send to recv over ug (a local copy when comm is skipped).
  template <class W>
  void exchange(Context& ctx, const comm::Group& ug, const W* send, W* recv, size_t count_per_rank) {
    const size_t bytes = count_per_rank * sizeof(W);
    if (communicates(ctx)) {
      timed_alltoall(ctx, ug, send, recv, bytes);
    } else {
      timed_aux(ctx, [&] {
        Kokkos::deep_copy(View1<W>(recv, count_per_rank * ug.size), CV1<W>(send, count_per_rank * ug.size));
      });
    }
  }

  // x[n,Hx,D] sequence-sharded -> x_h[U*n,per,D] head-sharded, in W.
  template <class W>
  void to_heads(Context& ctx, const comm::Group& ug, CView3<W> x, const HeadSplit& s, View3<W> x_h) {
    const size_t total = x_h.span();
    if (ug.size == 1) {
      timed_aux(ctx, [&] { ulysses_pack<W>(x, s, View1<W>(x_h.data(), total)); });
      return;
    }
    View1<W> buf = exchange_buffer<W>(total);
    timed_aux(ctx, [&] { ulysses_pack<W>(x, s, buf); });
    exchange<W>(ctx, ug, buf.data(), x_h.data(), total / ug.size);
  }

  // x_h[U*n,per,D] head-sharded, in W -> x[n,Hx,D] sequence-sharded (replicated heads summed).
  template <class W, class X>
  void to_seq(Context& ctx, const comm::Group& ug, CView3<W> x_h, const HeadSplit& s, View3<X> x) {
    const size_t total = x_h.span();
    if (ug.size == 1) {
      timed_aux(ctx, [&] { ulysses_unpack<W, X>(CV1<W>(x_h.data(), total), s, x); });
      return;
    }
    View1<W> buf = exchange_buffer<W>(total);
    exchange<W>(ctx, ug, x_h.data(), buf.data(), total / ug.size);
    timed_aux(ctx, [&] { ulysses_unpack<W, X>(CV1<W>(buf.data(), total), s, x); });
  }

  // A result in acc_t back to x[n,Hx,D]: in acc_t when wide (or without a wire: U = 1),
  // else rounded to T first. fp32 and fp64 send x_h as it is.
  void result_to_seq(Context& ctx, const comm::Group& ug, View3<A> x_h, const HeadSplit& s, View3<T> x, bool wide) {
    if constexpr (!std::is_same<T, A>::value) {
      if (!wide && ug.size > 1) {
        const View3<T> r =
            view3<T>(cp::scratch<T>("ulysses_rounded", x_h.span()).data(), x_h.extent(0), x_h.extent(1), x_h.extent(2));
        timed_aux(ctx, [&] { kernels::convert_view<T, A>(r, x_h); });
        to_seq<T, T>(ctx, ug, r, s, x);
        return;
      }
    }
    to_seq<A, T>(ctx, ug, x_h, s, x);
  }

  using Prints = std::array<Fingerprint, 5>;  // q, k, v, o, lse
  static Prints prints(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse) {
    return {fingerprint(q), fingerprint(k), fingerprint(v), fingerprint(o), fingerprint(lse)};
  }

  HeadSplit qs_, ks_;
  View3<T> q_h_, k_h_, v_h_, o_h_;
  View2<A> lse_h_;
  View3<T> dout_h_;
  View3<A> dq_h_, dk_h_, dv_h_;
  View1<T> buf_;
  View1<A> buf_acc_;       // a bf16 run's fp32 exchange buffer (unused when T is its own acc_t)
  bool have_fwd_ = false;  // the head-sharded tensors are the last forward's
  Prints fwd_;             // of the last forward's q, k, v, o, lse
  Mode fwd_mode_ = Mode::Full;
  KeptBlock<T> kept_;  // the ring forward's last K/V block, for the ring backward
};

}  // namespace minicp::cp
