// Team attention: the flash forward and backward in Kokkos hierarchical parallelism, written
// once for every execution space. A team owns one tile of rows and walks the other tensor's
// tiles through team scratch with the online softmax of attention_tiled.hpp:
//   forward  - a team per (head, query tile): Q, O and the row statistics stay in scratch
//              while K, V tiles pass;
//   backward - a team per (kv head, key tile): K, V, dK, dV stay in scratch while the query
//              tiles of every head of the group pass; dQ is added atomically (several key
//              tiles share a query row), dK and dV once per team (no two teams share a key).
// Tiles that the mask hides entirely are skipped. Inputs of type T are read into scratch in
// acc_t<T> (fp32 for bf16), so every product, softmax statistic and sum is in the
// accumulator type. It is the device kernel; on the host the tests hold it to the same fp64
// reference as the other two implementations.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/attention_impl.hpp"

namespace minicp::kernels::detail {

namespace {

using Team = Kokkos::TeamPolicy<Exec>::member_type;
template <class A>
using Tile =
    Kokkos::View<A**, Kokkos::LayoutRight, Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class A>
using Row = Kokkos::View<A*, Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// What one call computed, added to once per team: executed FLOPs, blocks computed, skipped.
struct Counters {
  Kokkos::View<double[3], Mem> v{"kernels::attention::team_counters"};
  KOKKOS_INLINE_FUNCTION void add(const Team& t, double flops, double computed, double skipped) const {
    Kokkos::single(Kokkos::PerTeam(t), [&] {
      Kokkos::atomic_add(&v(0), flops);
      Kokkos::atomic_add(&v(1), computed);
      Kokkos::atomic_add(&v(2), skipped);
    });
  }
  AttnStats read() const {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    AttnStats st;
    st.flops = h(0), st.blocks_computed = int64_t(h(1)), st.blocks_skipped = int64_t(h(2));
    return st;
  }
};

// Whether any (query, key) pair of the block is visible; every thread of the team gets the
// same answer (a team reduction), so a skipped block is skipped by the whole team.
KOKKOS_INLINE_FUNCTION bool any_visible(const Team& t, const AttnMask& mask, int i0, int rows, int j0, int cols) {
  int n = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(t, rows * cols),
      [&](const int x, int& acc) { acc += mask.visible(i0 + x / cols, j0 + x % cols) ? 1 : 0; }, n);
  return n > 0;
}

// Tiles of at most 64 rows, halved until the team's scratch fits in `budget` bytes: 48 KiB on
// a device (the shared memory every GPU gives a block without opting in), 512 KiB on the host.
struct TeamTiles {
  int q = 0, k = 0;
};
TeamTiles team_tiles(int D, size_t elem, bool backward, int tile_q, int tile_k) {
  const size_t budget = kHostExec ? (size_t(512) << 10) : (size_t(48) << 10);
  auto bytes = [&](size_t bq, size_t bk) {  // the tiles each kernel below carves from its scratch
    return elem *
           (backward ? 2 * bq * D + 4 * bk * D + 2 * bq * bk + 2 * bq : 2 * bq * D + 2 * bk * D + bq * bk + 3 * bq);
  };
  int t = 64;
  while (t > 8 && bytes(t, t) > budget) t /= 2;
  return {tile_q > 0 ? tile_q : t, tile_k > 0 ? tile_k : t};
}

// league teams of team_size threads (0: Kokkos's choice), each with `scratch` bytes.
Kokkos::TeamPolicy<Exec> make_policy(int league, int team_size, size_t scratch) {
  auto p = team_size > 0 ? Kokkos::TeamPolicy<Exec>(league, team_size) : Kokkos::TeamPolicy<Exec>(league, Kokkos::AUTO);
  return p.set_scratch_size(0, Kokkos::PerTeam(scratch));
}

template <class A>
size_t tile_bytes(int r, int c) {
  return Tile<A>::shmem_size(r, c);
}
template <class A>
size_t row_bytes(int n) {
  return Row<A>::shmem_size(n);
}

// The online softmax of one block of scores P (rows x cols, scaled, -inf where hidden): the
// running max m and sum l of each row, alpha(i) = exp(old max - new max) for the output's
// rescale, and P turned into the block's probabilities.
template <class A>
KOKKOS_INLINE_FUNCTION void softmax_rows(const Team& t, const Tile<A>& P, const Row<A>& m, const Row<A>& l,
                                         const Row<A>& alpha, int rows, int cols) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const int i) {
    A mx = m(i);
    for (int j = 0; j < cols; ++j) mx = P(i, j) > mx ? P(i, j) : mx;
    if (mx == neg_inf<A>()) {  // nothing visible to this row yet
      alpha(i) = A(1);
      for (int j = 0; j < cols; ++j) P(i, j) = A(0);
      return;
    }
    A sum = 0;
    for (int j = 0; j < cols; ++j) {
      const A p = exp(P(i, j) - mx);  // exp(-inf) = 0 for a hidden key
      P(i, j) = p;
      sum += p;
    }
    alpha(i) = exp(m(i) - mx);  // 0 while the row had seen nothing
    l(i) = alpha(i) * l(i) + sum;
    m(i) = mx;
  });
}

// One backward block's tiles: P and dS (bq, bk), Q and dO (bq, D), K (bk, D).
template <class A>
struct BwdTiles {
  Tile<A> P, dS, Qs, dOs, Ks;
};

// A backward block's gradients: dV += P^T dO and dK += dS^T Q into the team's key tiles, and
// dQ += dS K into dq's rows i0.. of head h (atomically: other teams add to the same rows).
template <class A>
KOKKOS_INLINE_FUNCTION void block_grads(const Team& t, const BwdTiles<A>& b, const Tile<A>& dKs, const Tile<A>& dVs,
                                        const View3<A>& dq, int i0, int h, int rows, int cols) {
  const int D = int(b.Qs.extent(1));
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * D), [&](const int x) {
    const int j = x / D, d = x % D;
    A gv = 0, gk = 0;
    for (int i = 0; i < rows; ++i) {
      gv += b.P(i, j) * b.dOs(i, d);
      gk += b.dS(i, j) * b.Qs(i, d);
    }
    dVs(j, d) += gv;
    dKs(j, d) += gk;
  });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * D), [&](const int x) {
    const int i = x / D, d = x % D;
    A gq = 0;
    for (int j = 0; j < cols; ++j) gq += b.dS(i, j) * b.Ks(j, d);
    Kokkos::atomic_add(&dq(i0 + i, h, d), gq);
  });
}

}  // namespace

template <class T>
AttnStats attention_fwd_team(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                             View2<acc_t<T>> lse, acc_t<T> scale, int tile_q, int tile_k, int team_size) {
  using A = acc_t<T>;
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int group = H / int(k.extent(1));
  const TeamTiles tt = team_tiles(D, sizeof(A), false, tile_q, tile_k);
  const int bq = tt.q, bk = tt.k, nq = (Sq + bq - 1) / bq;
  const size_t scratch =
      2 * tile_bytes<A>(bq, D) + 2 * tile_bytes<A>(bk, D) + tile_bytes<A>(bq, bk) + 3 * row_bytes<A>(bq);
  const Counters count;
  const auto policy = make_policy(H * nq, team_size, scratch);
  Kokkos::parallel_for(
      "kernels::attention::fwd_team", policy, KOKKOS_LAMBDA(const Team& t) {
        const int h = t.league_rank() % H, g = h / group, i0 = (t.league_rank() / H) * bq;
        const int rows = Sq - i0 < bq ? Sq - i0 : bq;
        Tile<A> Qs(t.team_scratch(0), bq, D), Os(t.team_scratch(0), bq, D);  // (bq, D)
        Tile<A> Ks(t.team_scratch(0), bk, D), Vs(t.team_scratch(0), bk, D);  // (bk, D)
        Tile<A> P(t.team_scratch(0), bq, bk);                                // scores, then probabilities (bq, bk)
        Row<A> m(t.team_scratch(0), bq), l(t.team_scratch(0), bq), alpha(t.team_scratch(0), bq);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * D), [&](const int x) {
          Qs(x / D, x % D) = A(q(i0 + x / D, h, x % D));
          Os(x / D, x % D) = A(0);
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const int i) {
          m(i) = neg_inf<A>();
          l(i) = A(0);
        });
        double flops = 0, computed = 0, skipped = 0;
        for (int j0 = 0; j0 < Sk; j0 += bk) {
          const int cols = Sk - j0 < bk ? Sk - j0 : bk;
          if (!any_visible(t, mask, i0, rows, j0, cols)) {
            skipped += 1;
            continue;
          }
          computed += 1, flops += 4.0 * rows * cols * D;
          t.team_barrier();  // the previous block's reads of Ks, Vs are done
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * D), [&](const int x) {
            Ks(x / D, x % D) = A(k(j0 + x / D, g, x % D));
            Vs(x / D, x % D) = A(v(j0 + x / D, g, x % D));
          });
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * cols), [&](const int x) {
            const int i = x / cols, j = x % cols;
            A s = neg_inf<A>();
            if (mask.visible(i0 + i, j0 + j)) {
              A dot = 0;
              for (int d = 0; d < D; ++d) dot += Qs(i, d) * Ks(j, d);
              s = dot * scale;
            }
            P(i, j) = s;
          });
          t.team_barrier();
          softmax_rows(t, P, m, l, alpha, rows, cols);
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * D), [&](const int x) {
            const int i = x / D, d = x % D;
            A acc = alpha(i) * Os(i, d);
            for (int j = 0; j < cols; ++j) acc += P(i, j) * Vs(j, d);
            Os(i, d) = acc;
          });
        }
        t.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * D), [&](const int x) {
          const int i = x / D, d = x % D;
          const A li = l(i);
          o(i0 + i, h, d) = li > A(0) ? Os(i, d) / li : A(0);
          if (d == 0) lse(i0 + i, h) = li > A(0) ? m(i) + log(li) : neg_inf<A>();
        });
        count.add(t, flops, computed, skipped);
      });
  return count.read();
}

template <class T>
AttnStats attention_bwd_team(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                             const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                             acc_t<T> scale, int tile_q, int tile_k, int team_size) {
  using A = acc_t<T>;
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int Hkv = int(k.extent(1)), group = H / Hkv;
  const TeamTiles tt = team_tiles(D, sizeof(A), true, tile_q, tile_k);
  const int bq = tt.q, bk = tt.k, nk = (Sk + bk - 1) / bk;
  const View2<A> delta = attention_delta<T>(o, dout);  // (Sq, H): dO . O per row
  const size_t scratch =
      2 * tile_bytes<A>(bq, D) + 4 * tile_bytes<A>(bk, D) + 2 * tile_bytes<A>(bq, bk) + 2 * row_bytes<A>(bq);
  const Counters count;
  const auto policy = make_policy(Hkv * nk, team_size, scratch);
  Kokkos::parallel_for(
      "kernels::attention::bwd_team", policy, KOKKOS_LAMBDA(const Team& t) {
        const int g = t.league_rank() % Hkv, j0 = (t.league_rank() / Hkv) * bk;
        const int cols = Sk - j0 < bk ? Sk - j0 : bk;
        Tile<A> Ks(t.team_scratch(0), bk, D), Vs(t.team_scratch(0), bk, D);    // (bk, D)
        Tile<A> dKs(t.team_scratch(0), bk, D), dVs(t.team_scratch(0), bk, D);  // (bk, D)
        Tile<A> Qs(t.team_scratch(0), bq, D), dOs(t.team_scratch(0), bq, D);   // (bq, D)
        Tile<A> P(t.team_scratch(0), bq, bk), dS(t.team_scratch(0), bq, bk);   // (bq, bk)
        Row<A> L(t.team_scratch(0), bq), Dl(t.team_scratch(0), bq);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * D), [&](const int x) {
          Ks(x / D, x % D) = A(k(j0 + x / D, g, x % D));
          Vs(x / D, x % D) = A(v(j0 + x / D, g, x % D));
          dKs(x / D, x % D) = A(0);
          dVs(x / D, x % D) = A(0);
        });
        double flops = 0, computed = 0, skipped = 0;
        for (int h = g * group; h < (g + 1) * group; ++h)
          for (int i0 = 0; i0 < Sq; i0 += bq) {
            const int rows = Sq - i0 < bq ? Sq - i0 : bq;
            if (!any_visible(t, mask, i0, rows, j0, cols)) {
              skipped += 1;
              continue;
            }
            computed += 1, flops += 10.0 * rows * cols * D;
            t.team_barrier();  // the previous block's reads of Qs, dOs, P, dS are done
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * D), [&](const int x) {
              Qs(x / D, x % D) = A(q(i0 + x / D, h, x % D));
              dOs(x / D, x % D) = A(dout(i0 + x / D, h, x % D));
            });
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const int i) {
              L(i) = lse(i0 + i, h);
              Dl(i) = delta(i0 + i, h);
            });
            t.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * cols), [&](const int x) {
              const int i = x / cols, j = x % cols;
              A p = 0, ds = 0;
              if (L(i) != neg_inf<A>() && mask.visible(i0 + i, j0 + j)) {
                A s = 0, dp = 0;
                for (int d = 0; d < D; ++d) {
                  s += Qs(i, d) * Ks(j, d);
                  dp += dOs(i, d) * Vs(j, d);
                }
                p = exp(s * scale - L(i));
                ds = p * (dp - Dl(i)) * scale;
              }
              P(i, j) = p;
              dS(i, j) = ds;
            });
            t.team_barrier();
            block_grads(t, {P, dS, Qs, dOs, Ks}, dKs, dVs, dq, i0, h, rows, cols);
          }
        t.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * D), [&](const int x) {
          dk(j0 + x / D, g, x % D) += dKs(x / D, x % D);
          dv(j0 + x / D, g, x % D) += dVs(x / D, x % D);
        });
        count.add(t, flops, computed, skipped);
      });
  return count.read();
}

#define MINICP_ATTN_TEAM_INST(T)                                                                                    \
  template AttnStats attention_fwd_team<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<acc_t<T>>,       \
                                           View2<acc_t<T>>, acc_t<T>, int, int, int);                               \
  template AttnStats attention_bwd_team<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<acc_t<T>>, CView3<T>, \
                                           const AttnMask&, View3<acc_t<T>>, View3<acc_t<T>>, View3<acc_t<T>>,      \
                                           acc_t<T>, int, int, int);
MINICP_ATTN_TEAM_INST(float)
MINICP_ATTN_TEAM_INST(double)
MINICP_ATTN_TEAM_INST(bf16)
#undef MINICP_ATTN_TEAM_INST

}  // namespace minicp::kernels::detail
