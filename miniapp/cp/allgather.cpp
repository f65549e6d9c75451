// Scheme `allgather` (Llama 3): each rank all-gathers K,V and attends its zigzag queries to all of it.
// Unlike one up-front gather, K,V rows go in chunks pipelined with compute (double-buffered),
// each chunk holding a piece of both zigzag halves so its causal work is balanced; the backward
// re-gathers the same way and reduce-scatters each chunk's dK,dV under the next chunk's compute.
// Its layout is a choice: a dispatch that gives every rank as many tokens replaces zigzag, its
// shards cut into chunks of consecutive local rows (one "half"; the gathers are equal-sized).
// Precision (bf16 runs): K,V are gathered in bf16; the merge, dQ and the per-chunk dK,dV are
// fp32, reduce-scattered in fp32 (DType::F32), or with Config::bf16_dkv rounded to bf16 and
// reduce-scattered as BF16 (summed in fp32 where they arrive, rounded once into dk, dv).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "miniapp/cp/common.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {
namespace {

// Row chunks of the local K,V. A zigzag shard is two halves (an early and a late chunk of
// the sequence); chunk c takes the c-th piece of EACH half, so that every chunk carries
// early and late keys and the causal work per chunk is balanced across ranks like zigzag
// itself (chunks of one half made one rank wait for the other at every gather). Piece h of
// chunk c is local rows [h*half + begin(c), h*half + begin(c) + size(c)); sizes differ by at
// most one and are the same on every rank (all shards are equal-sized). A dispatch's shard is
// one half (halves = 1).
struct Chunks {
  int64_t half = 0, count = 1;  // rows per half; chunks
  int halves = 2;
  int64_t size(int64_t c) const { return half / count + (c < half % count ? 1 : 0); }
  int64_t begin(int64_t c) const { return c * (half / count) + std::min(c, half % count); }
  int64_t first_row(int64_t c, int h) const { return h * half + begin(c); }
  int64_t max_size() const { return size(0); }
  // Rows of gathered chunk c over P ranks.
  size_t gathered(int64_t c, int P) const { return size_t(halves) * size_t(P) * size_t(size(c)); }
};

// The chunks of a case whose shards hold `rows` rows each (zigzag: two halves; a dispatch: one).
Chunks chunks_of(const Config& cfg, int64_t rows) {
  const int halves = cfg.tokens ? 1 : 2;
  const int64_t half = rows / halves;
  return Chunks{half, std::max<int64_t>(1, std::min<int64_t>(cfg.setting("chunks"), half)), halves};
}

// Key positions of gathered chunk c: piece 0 of every rank in rank order, then piece 1.
std::vector<int64_t> chunk_positions(const std::vector<std::vector<int64_t>>& all, const Chunks& ch, int64_t c) {
  std::vector<int64_t> out;
  for (int h = 0; h < ch.halves; ++h)
    for (const auto& p : all)
      out.insert(out.end(), p.begin() + ch.first_row(c, h), p.begin() + ch.first_row(c, h) + ch.size(c));
  return out;
}

// The chunked, double-buffered all-gather of K,V rows [Sl,Hkv,D] into [P*rows_c,Hkv,D] per
// chunk (two requests per chunk: K and V land contiguous, no packing). Without
// communication every chunk reuses slot 0.
template <class T>
class KVGather {
 public:
  KVGather(Context& ctx, CView3<T> k, CView3<T> v, const Chunks& ch)
      : ctx_(ctx), k_(k), v_(v), ch_(ch), P_(ctx.comm.world().size), row_(k.extent(1) * k.extent(2)) {
    const size_t n = ch.gathered(0, P_) * row_;
    for (int i = 0; i < 2; ++i) {
      k_buf_[i] = scratch<T>("cp::allgather::k" + std::to_string(i), n);
      v_buf_[i] = scratch<T>("cp::allgather::v" + std::to_string(i), n);
    }
    if (!communicates(ctx)) {  // never filled: zero them so compute sees numbers
      Kokkos::deep_copy(k_buf_[0], T(0));
      Kokkos::deep_copy(v_buf_[0], T(0));
    }
  }
  // Starts the gather of chunk c (no-op past the last chunk or without communication).
  void post(int64_t c) {
    if (c >= ch_.count || !communicates(ctx_)) return;
    const size_t bytes = size_t(ch_.size(c)) * row_ * sizeof(T), gathered = size_t(P_) * size_t(ch_.size(c)) * row_;
    const int s = slot(c);
    for (int h = 0; h < ch_.halves; ++h) {  // piece h lands after piece h-1 of every rank
      const size_t off = size_t(ch_.first_row(c, h)) * row_, dst = h * gathered;
      req_[s][2 * h] = ctx_.comm.iallgather(k_.data() + off, k_buf_[s].data() + dst, bytes, ctx_.comm.world(), int(c));
      req_[s][2 * h + 1] =
          ctx_.comm.iallgather(v_.data() + off, v_buf_[s].data() + dst, bytes, ctx_.comm.world(), int(c));
    }
  }
  void wait(int64_t c) {
    for (auto& r : req_[slot(c)]) timed_wait(ctx_, r);
  }
  // Gathered K, V of chunk c: [P*rows_c, Hkv, D].
  View3<T> k(int64_t c) const { return view3<T>(k_buf_[slot(c)].data(), rows(c), k_.extent(1), k_.extent(2)); }
  View3<T> v(int64_t c) const { return view3<T>(v_buf_[slot(c)].data(), rows(c), v_.extent(1), v_.extent(2)); }

 private:
  int slot(int64_t c) const { return communicates(ctx_) ? int(c % 2) : 0; }
  size_t rows(int64_t c) const { return ch_.gathered(c, P_); }
  Context& ctx_;
  CView3<T> k_, v_;
  Chunks ch_;
  int P_;
  size_t row_;  // elements per K/V row (Hkv*D)
  View1<T> k_buf_[2], v_buf_[2];
  comm::Request req_[2][4];  // [slot][K piece 0, V piece 0, K piece 1, V piece 1]
};

template <class T>
class AllGather final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[Sl,H,D], k,v[Sl,Hkv,D] (zigzag rows) -> o[Sl,H,D], lse[Sl,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto& g = ctx.comm.world();
    const auto all = positions(ctx.cfg, g.size);
    const std::vector<int64_t>& qpos = all[g.rank];
    const Chunks ch = chunks(ctx.cfg, k.extent(0));
    KVGather<T> gather(ctx, k, v, ch);
    const AccOut<T> oa(o, "cp::allgather::o_acc");
    OnlineMerge<A> acc(oa.acc(), lse, "cp::allgather");
    gather.post(0);
    for (int64_t c = 0; c < ch.count; ++c) {
      ctx.at_step(int(c));
      gather.post(c + 1);
      gather.wait(c);
      if (!computes(ctx)) continue;
      const auto kpos = chunk_positions(all, ch, c);
      if (fully_masked(ctx.cfg, qpos, kpos)) {
        ++ctx.stats.blocks_skipped;
        continue;
      }
      const auto mask = make_mask(ctx.cfg, qpos, kpos);
      const auto Kc = gather.k(c), Vc = gather.v(c);
      const auto [ob, lb] = acc.next();
      timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, Kc, Vc, mask, ob, lb, ctx.cfg.attn); });
      acc.merge(ctx);
    }
    acc.finish();  // nothing visible to any local row (or no compute): 0 / -inf
    oa.store(ctx);
  }

  // Given o, lse, dout[Sl,H,D] -> dq[Sl,H,D], dk, dv[Sl,Hkv,D] (overwritten).
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq_out, View3<T> dk, View3<T> dv) override {
    const auto& g = ctx.comm.world();
    const int P = g.size;
    const auto all = positions(ctx.cfg, P);
    const std::vector<int64_t>& qpos = all[g.rank];
    const Chunks ch = chunks(ctx.cfg, k.extent(0));
    const size_t Hkv = k.extent(1), D = k.extent(2), row = Hkv * D;
    const size_t n = ch.gathered(0, P) * row;
    const bool thin = DkvWire<T>::narrow(ctx.cfg);  // bf16 on the wire (see Grads)
    const comm::DType dt = thin ? dtype_of<T>() : dtype_of<A>();
    KVGather<T> gather(ctx, k, v, ch);
    Grads gr(thin, n, dk, dv);
    auto& dk_buf = gr.dk_buf;
    auto& dv_buf = gr.dv_buf;
    auto& dk16 = gr.dk16;
    auto& dv16 = gr.dv16;
    auto dst = [&](bool is_k, size_t off) { return gr.dst(is_k, off); };
    const AccOut<T> dqa(dq_out, "cp::allgather::dq_acc");
    const View3<A>& dq = dqa.acc();
    comm::Request rs[2][4];
    Kokkos::deep_copy(dq, A(0));
    if (!communicates(ctx)) gr.zero();  // nothing will be reduce-scattered into them
    gather.post(0);
    for (int64_t c = 0; c < ch.count; ++c) {
      ctx.at_step(int(c));
      const int s = int(c % 2);
      const size_t rows = size_t(ch.size(c)), cnt = rows * row;
      gather.post(c + 1);
      gather.wait(c);
      const size_t all_rows = ch.gathered(c, P);  // (rows per rank and half: `rows`)
      auto dKc = view3<A>(dk_buf[s].data(), all_rows, Hkv, D), dVc = view3<A>(dv_buf[s].data(), all_rows, Hkv, D);
      timed_aux(ctx, [&] {
        Kokkos::deep_copy(View1<A>(dk_buf[s].data(), all_rows * row), A(0));
        Kokkos::deep_copy(View1<A>(dv_buf[s].data(), all_rows * row), A(0));
      });
      if (computes(ctx)) {
        const auto kpos = chunk_positions(all, ch, c);
        if (fully_masked(ctx.cfg, qpos, kpos)) {
          ++ctx.stats.blocks_skipped;
        } else {
          const auto mask = make_mask(ctx.cfg, qpos, kpos);
          const auto Kc = gather.k(c), Vc = gather.v(c);
          timed_compute(ctx, [&] {
            return kernels::attention_bwd<T>(q, Kc, Vc, o, lse, dout, mask, dq, dKc, dVc, ctx.cfg.attn);
          });
        }
      }
      if (thin && communicates(ctx))  // this chunk's partials, rounded once for the wire
        timed_aux(ctx, [&] {
          kernels::convert<T, A>(dk16[s].data(), dk_buf[s].data(), int64_t(all_rows * row));
          kernels::convert<T, A>(dv16[s].data(), dv_buf[s].data(), int64_t(all_rows * row));
        });
      for (int h = 0; h < ch.halves; ++h) {
        // Block i of each piece's gathered rows belongs to rank i: each rank gets the sum of its own.
        const size_t off = size_t(ch.first_row(c, h)) * row, src = size_t(h) * P * cnt;
        if (communicates(ctx)) {
          const void* sk = thin ? static_cast<const void*>(dk16[s].data() + src) : dk_buf[s].data() + src;
          const void* sv = thin ? static_cast<const void*>(dv16[s].data() + src) : dv_buf[s].data() + src;
          rs[s][2 * h] = ctx.comm.ireduce_scatter(sk, dst(true, off), cnt, dt, g, int(c));
          rs[s][2 * h + 1] = ctx.comm.ireduce_scatter(sv, dst(false, off), cnt, dt, g, int(c));
        } else {  // local block only (numbers wrong, the copy stands in for the reduction)
          timed_aux(ctx, [&] { local_block(thin, dst(true, off), dk_buf[s].data() + src + g.rank * cnt, cnt); });
          timed_aux(ctx, [&] { local_block(thin, dst(false, off), dv_buf[s].data() + src + g.rank * cnt, cnt); });
        }
      }
      for (auto& r : rs[1 - s]) timed_wait(ctx, r);  // chunk c-1's, whose buffers chunk c+1 reuses
    }
    for (auto& pair : rs)
      for (auto& r : pair) timed_wait(ctx, r);
    dqa.store(ctx);
    gr.store(ctx);
  }

 private:
  // The backward's dK, dV buffers: per chunk, the partials of the gathered rows
  // [2*P*rows_c,Hkv,D] (piece 0 of every rank, then piece 1), double-buffered so chunk c's
  // reduce-scatters stay in flight while c+1 computes; bf16 on the wire (thin: rounded per
  // chunk into dk16, dv16, reduced straight into dk, dv), or acc_t into the accumulators of
  // dk, dv (dk, dv themselves for fp32 and fp64).
  struct Grads {
    bool thin;
    View3<T> dk, dv;
    View1<A> dk_buf[2], dv_buf[2];
    View1<T> dk16[2], dv16[2];
    std::optional<AccOut<T>> dka, dva;
    Grads(bool thin_, size_t n, View3<T> dk_, View3<T> dv_) : thin(thin_), dk(dk_), dv(dv_) {
      for (int i = 0; i < 2; ++i) {
        const std::string b = std::to_string(i);
        dk_buf[i] = scratch<A>("cp::allgather::dk" + b, n);
        dv_buf[i] = scratch<A>("cp::allgather::dv" + b, n);
        if (thin) dk16[i] = scratch<T>("cp::allgather::dk16_" + b, n);
        if (thin) dv16[i] = scratch<T>("cp::allgather::dv16_" + b, n);
      }
      if (!thin) dka.emplace(dk, "cp::allgather::dk_acc"), dva.emplace(dv, "cp::allgather::dv_acc");
    }
    // Where rank-local rows [off, off + cnt) of dK / dV land.
    void* dst(bool is_k, size_t off) {
      if (thin) return (is_k ? dk : dv).data() + off;
      return (is_k ? dka : dva)->acc().data() + off;
    }
    void zero() {
      if (thin) {
        Kokkos::deep_copy(dk, T(0));
        Kokkos::deep_copy(dv, T(0));
      } else {
        Kokkos::deep_copy(dka->acc(), A(0));
        Kokkos::deep_copy(dva->acc(), A(0));
      }
    }
    void store(Context& ctx) {
      if (!thin) dka->store(ctx), dva->store(ctx);
    }
  };

  // dst[0, cnt) = src[0, cnt): dst in T when thin, else in acc_t (compute-only mode's stand-in
  // for the reduction).
  static void local_block(bool thin, void* dst, const A* src, size_t cnt) {
    using CVA = Kokkos::View<const A*, Kokkos::LayoutRight, kernels::Mem>;
    if constexpr (!std::is_same<T, A>::value) {
      if (thin) return kernels::convert<T, A>(static_cast<T*>(dst), src, int64_t(cnt));
    }
    Kokkos::deep_copy(View1<A>(static_cast<A*>(dst), cnt), CVA(src, cnt));
  }
  static std::vector<std::vector<int64_t>> positions(const Config& cfg, int P) {
    if (cfg.tokens) return *cfg.tokens;
    std::vector<std::vector<int64_t>> all(P);
    for (int i = 0; i < P; ++i) all[i] = layout::zigzag(cfg.seq_len, P, i);
    return all;
  }
  static Chunks chunks(const Config& cfg, size_t rows) { return chunks_of(cfg, int64_t(rows)); }
};

}  // namespace

// The model's view: chunk c's gather is posted during chunk c-1 (chunk 0's is waited for at
// once); the backward gathers again and reduce-scatters chunk c's dK, dV during chunk c+1,
// the last chunk's after the loop (exposed). Chunk c's keys: piece c of both halves of every
// rank's zigzag shard.
static predict::Schedule allgather_schedule(const Config& c, const predict::Topo& t, int r, bool backward,
                                            size_t elem) {
  const int P = c.ranks;
  const Chunks ch = chunks_of(c, c.tokens ? int64_t((*c.tokens)[0].size()) : c.seq_len / P);
  const int64_t half = ch.half;
  const bool inter = t.spans_nodes(0, P, 1);
  const auto table = c.tokens ? dispatch_spans(c.tokens) : nullptr;  // the dispatch's rows per rank
  const predict::Spans q = table ? (*table)[size_t(r)] : layout::zigzag_spans(c.seq_len, P, r);
  auto piece = [&](int64_t k, comm::EventKind op) {  // one of the calls per chunk (K, V x halves)
    const size_t e = op == comm::EventKind::ReduceScatter ? dkv_elem(c, elem) : elem;
    return predict::CommCall{op, int64_t(double(ch.size(k)) * c.kv_heads * c.head_dim * e), P, inter};
  };
  predict::Schedule out;
  for (int64_t k = 0; k < ch.count; ++k) {
    predict::Step st;
    predict::Spans kv;
    for (int h = 0; h < ch.halves; ++h)
      for (int i = 0; i < P; ++i)
        if (table) {
          const auto piece_spans = layout::rows_of((*table)[size_t(i)], ch.first_row(k, h), ch.size(k));
          kv.insert(kv.end(), piece_spans.begin(), piece_spans.end());
        } else {
          kv.push_back({(h == 0 ? i : 2 * P - 1 - i) * half + ch.begin(k), ch.size(k), 1});
        }
    st.attn.push_back({q, kv, c.heads, c.kv_heads});
    for (int j = 0; j < 2 * ch.halves; ++j) {
      if (k == 0) st.exposed.push_back(piece(0, comm::EventKind::AllGather));
      if (k + 1 < ch.count) st.overlapped.push_back(piece(k + 1, comm::EventKind::AllGather));
      if (backward && k >= 1) st.overlapped.push_back(piece(k - 1, comm::EventKind::ReduceScatter));
    }
    const double gathered = double(ch.gathered(k, P)) * c.kv_heads * c.head_dim;
    st.aux_values = backward ? 2 * gathered : double(layout::count(q)) * c.heads * (c.head_dim + 1.0);
    out.steps.push_back(st);
  }
  if (backward && P > 1) {
    predict::Step last;
    for (int j = 0; j < 2 * ch.halves; ++j) last.exposed.push_back(piece(ch.count - 1, comm::EventKind::ReduceScatter));
    out.steps.push_back(last);
  }
  return out;
}

SchemeInfo allgather_scheme() {
  SchemeInfo s = make_info<AllGather>(
      "allgather",
      "all-gather K,V in chunks overlapped with compute (Llama 3), zigzag layout; backward reduce-scatters dK,dV");
  s.settings = {{"chunks",
                 "allgather: pieces the K,V gather is cut into, each overlapping the previous one's compute",
                 4,
                 1,
                 {}}};
  s.takes_dispatch = true;
  s.refuses = "seq_len not divisible by 2*ranks (its own layout); a dispatch of unequal token counts";
  s.check = [](const Config& c) {
    return c.tokens ? equal_tokens(*c.tokens, "allgather", c.dispatch)
                    : layout::check(layout::Kind::Zigzag, c.seq_len, c.ranks, "allgather");
  };
  s.shard = [](const Config& c, int r) {
    const auto t = shard_tokens(layout::Kind::Zigzag, c, c.ranks, r);
    return Shard{t, t};
  };
  // Two gathered chunks of K and of V and two of dK and of dV ([2*P*rows_c, Hkv, D] each, dK
  // and dV in acc_t; with bf16_dkv in a bf16 run also their bf16 copies for the wire), and with
  // more than one chunk one partial (O, LSE) in acc_t; a bf16 run's fp32 accumulators of o, dq,
  // and of dk, dv unless they come back in bf16.
  s.workspace = [](const Config& c) {
    const double n = double(c.seq_len) / c.ranks, half = c.tokens ? n : n / 2;
    const double count = std::max(1.0, std::min<double>(c.setting("chunks"), std::floor(half)));
    const double rows_c = std::ceil(half / count);
    const double nq = n * c.heads * c.head_dim, nkv = n * c.kv_heads * c.head_dim;
    const double chunk = (c.tokens ? 1 : 2) * c.ranks * rows_c * c.kv_heads * c.head_dim;
    return by_precision(c, [&](const Units& u) {
      const bool thin = u.dkv < u.acc;
      const double partial = count > 1 ? u.acc * n * c.heads * (c.head_dim + 1.0) : 0;
      const double outputs = u.extra * u.acc * (2 * nq + (thin ? 0 : 2 * nkv));
      return Workspace{(4 + 4 * u.acc + (thin ? 4 : 0)) * chunk + partial + outputs, 0};
    });
  };
  s.schedule = allgather_schedule;
  return s;
}

}  // namespace minicp::cp
