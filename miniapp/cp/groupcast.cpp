// Scheme `groupcast`: each rank sends each of its K/V tokens only to the ranks whose queries
// see it, and gets dK/dV back only from those ranks (MagiAttention's GroupCast, here on
// point-to-point exchanges). It runs on any dispatch, with any token counts per rank (its own
// layout: zigzag in 2P near-equal chunks).
//
// The plan, computed once per mask and dispatch and shared by every call: each rank's tokens
// as runs of consecutive positions, and the keys its queries see as merged intervals (the
// union of Mask::keys_of over a run of consecutive queries is one interval, because a mask's
// first and last visible key never fall as the query advances and the next query's first key
// is at most one past this one's last). What rank o sends rank d is o's tokens inside d's
// intervals: exactly the need that traffic_redundancy divides by, so a groupcast run's
// redundancy is 1 by construction and the measured bytes check it.
//
// Forward, on rank r of P: step 0 attends to the own K/V while step 1's exchange is in flight;
// step s >= 1 exchanges with ranks r + s (send) and r - s (receive), the next step's exchange
// posted before this step's compute. Every pair exchanges at every step, zero-byte messages
// included, so the matching never depends on what the other side needs. The received K/V of
// every step is kept by the object (KV of every peer, in step order), and a backward handed
// the same k, v on every rank computes on it without moving K/V again; otherwise it fetches
// it first (exposed). The backward's dK/dV partials of step s go back to rank r - s while
// step s + 1 computes, and arrive here as rank r + s's partials of this rank's rows, added
// into dK/dV where they belong.
// Precision (bf16 runs): K/V travel in bf16; merges, dQ and the partials are fp32; partials
// travel in fp32, or in bf16 with Config::bf16_dkv (rounded once, added in fp32 on arrival).
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "miniapp/cp/common.hpp"
#include "miniapp/cp/dispatch.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {
namespace {

using Interval = std::pair<int64_t, int64_t>;  // [first, last] positions
constexpr int kReturns = 1;                    // isendrecv channel of the returned dK/dV (K/V: 0)

// A rank's tokens (sorted positions) as runs of consecutive positions: run i starts at
// position start[i] and local row row[i]; row has one entry more, the token count.
struct Runs {
  std::vector<int64_t> start, row;
  int64_t tokens() const { return row.back(); }
  int64_t count(size_t i) const { return row[i + 1] - row[i]; }
  // Tokens at positions below x.
  int64_t below(int64_t x) const {
    const auto it = std::lower_bound(start.begin(), start.end(), x);
    if (it == start.begin()) return 0;
    const size_t i = size_t(it - start.begin()) - 1;
    return row[i] + std::min(count(i), x - start[i]);
  }
};

Runs runs_of(const std::vector<int64_t>& pos) {
  Runs r;
  for (size_t i = 0; i < pos.size(); ++i)
    if (i == 0 || pos[i] != pos[i - 1] + 1) r.start.push_back(pos[i]), r.row.push_back(int64_t(i));
  r.row.push_back(int64_t(pos.size()));
  return r;
}

// The keys the queries of r see, merged, ascending.
std::vector<Interval> seen_by(const Mask& mask, const Runs& r) {
  std::vector<Interval> out;
  for (size_t i = 0; i < r.start.size(); ++i) {
    const Interval iv{mask.keys_of(r.start[i]).first, mask.keys_of(r.start[i] + r.count(i) - 1).second};
    if (!out.empty() && iv.first - 1 <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

// Consecutive tokens of one rank that another rank needs: `count` tokens from local row `row`,
// at positions pos, pos + 1, ...
struct Piece {
  int64_t row, pos, count;
};

struct Plan {
  std::shared_ptr<const std::vector<std::vector<int64_t>>> tokens;  // per rank, sorted
  std::vector<Runs> runs;                                           // per rank
  std::vector<std::vector<Interval>> seen;                          // per rank

  int ranks() const { return int(runs.size()); }
  // Rank o's tokens that rank d's queries see (o != d), in position order.
  std::vector<Piece> pieces(int o, int d) const {
    std::vector<Piece> out;
    const Runs& ro = runs[size_t(o)];
    for (const Interval& iv : seen[size_t(d)]) {
      size_t i = size_t(std::upper_bound(ro.start.begin(), ro.start.end(), iv.first) - ro.start.begin());
      for (i = i > 0 ? i - 1 : 0; i < ro.start.size() && ro.start[i] <= iv.second; ++i) {
        const int64_t lo = std::max(ro.start[i], iv.first), hi = std::min(ro.start[i] + ro.count(i) - 1, iv.second);
        if (lo <= hi) out.push_back({ro.row[i] + lo - ro.start[i], lo, hi - lo + 1});
      }
    }
    return out;
  }
  // How many tokens rank o sends rank d (0 for o == d).
  int64_t count(int o, int d) const {
    if (o == d) return 0;
    int64_t n = 0;
    const Runs& ro = runs[size_t(o)];
    for (const Interval& iv : seen[size_t(d)])
      n += ro.below(iv.second == INT64_MAX ? iv.second : iv.second + 1) - ro.below(iv.first);
    return n;
  }
};

bool same_mask(const Mask& a, const Mask& b) {
  return a.kind() == b.kind() && a.window() == b.window() && a.doc_period() == b.doc_period() &&
         a.doc_starts() == b.doc_starts();
}

// The plan of c (its dispatch, or zigzag), built once and kept for the calls that follow with
// the same tokens and mask (the last one: a case's calls and its model's share it).
std::shared_ptr<const Plan> plan_of(const Config& c) {
  static std::mutex mu;
  static std::shared_ptr<const Plan> last;
  static Config last_cfg;
  std::lock_guard<std::mutex> lock(mu);
  const bool hit = last && last_cfg.seq_len == c.seq_len && last_cfg.ranks == c.ranks &&
                   same_mask(last_cfg.mask, c.mask) && (c.tokens ? last->tokens == c.tokens : !last_cfg.tokens);
  if (hit) return last;
  auto p = std::make_shared<Plan>();
  p->tokens = c.tokens ? c.tokens
                       : std::make_shared<const std::vector<std::vector<int64_t>>>(
                             dispatch_tokens(Dispatch::parse("zigzag"), c.mask, c.seq_len, c.ranks));
  for (const auto& t : *p->tokens) p->runs.push_back(runs_of(t));
  for (const Runs& r : p->runs) p->seen.push_back(seen_by(c.mask, r));
  last = p;
  last_cfg = c;
  return p;
}

// Rank r's exchanges: at step s it sends to (r + s) mod P the rows send[s] and receives from
// (r - s) mod P the keys at positions recv[s] (step 0: none).
struct Exchanges {
  int P, r;
  std::vector<std::vector<int64_t>> send_rows, recv_pos;
  std::vector<int64_t> recv_offset;  // row of step s's keys in the kept buffer; last: the total
  int64_t max_send = 0;
  int to(int s) const { return (r + s) % P; }
  int from(int s) const { return (r - s + P) % P; }
  int64_t sent(int s) const { return int64_t(send_rows[size_t(s)].size()); }
  int64_t got(int s) const { return int64_t(recv_pos[size_t(s)].size()); }
};

Exchanges exchanges_of(const Plan& plan, int r) {
  Exchanges x{plan.ranks(), r, {}, {}, {0}, 0};
  x.send_rows.resize(size_t(x.P));
  x.recv_pos.resize(size_t(x.P));
  for (int s = 1; s < x.P; ++s) {
    for (const Piece& p : plan.pieces(r, x.to(s)))
      for (int64_t i = 0; i < p.count; ++i) x.send_rows[size_t(s)].push_back(p.row + i);
    for (const Piece& p : plan.pieces(x.from(s), r))
      for (int64_t i = 0; i < p.count; ++i) x.recv_pos[size_t(s)].push_back(p.pos + i);
    x.max_send = std::max(x.max_send, x.sent(s));
  }
  for (int s = 0; s < x.P; ++s) x.recv_offset.push_back(x.recv_offset.back() + x.got(s));
  return x;
}

// dst[i, :] = src[rows[i], :] for rows of `width` values (packing the K/V rows a peer needs).
template <class T>
void gather_rows(const T* src, T* dst, const Kokkos::View<int64_t*, kernels::Mem>& rows, size_t width) {
  Kokkos::parallel_for(
      "cp::groupcast::gather", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, rows.extent(0)),
      KOKKOS_LAMBDA(const int64_t i) {
        for (size_t j = 0; j < width; ++j) dst[size_t(i) * width + j] = src[size_t(rows(i)) * width + j];
      });
}

// dst[rows[i], :] += src[i, :] in dst's type (a peer's partials of this rank's rows; rows distinct).
template <class A, class S>
void add_rows(A* dst, const S* src, const Kokkos::View<int64_t*, kernels::Mem>& rows, size_t width) {
  Kokkos::parallel_for(
      "cp::groupcast::add", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, rows.extent(0)),
      KOKKOS_LAMBDA(const int64_t i) {
        for (size_t j = 0; j < width; ++j) dst[size_t(rows(i)) * width + j] += A(src[size_t(i) * width + j]);
      });
}

template <class T>
class GroupCast final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;

  // q[Sl,H,D], k,v[Sl,Hkv,D] (the dispatch's rows) -> o[Sl,H,D], lse[Sl,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto plan = plan_of(ctx.cfg);
    const Exchanges& x = exchanges(plan, ctx.comm.world().rank);
    const std::vector<int64_t>& mine = (*plan->tokens)[size_t(x.r)];
    Transfer tr(ctx, x, k, v, kept_reserve(ctx, x, k));
    const AccOut<T> oa(o, "groupcast_o_acc");
    OnlineMerge<A> acc(oa.acc(), lse, "groupcast");
    for (int s = 0; s < x.P; ++s) {  // step s + 1's exchange in flight during step s's compute
      ctx.at_step(s);
      tr.wait(s);
      tr.post(s + 1);
      const std::vector<int64_t>& kpos = s == 0 ? mine : x.recv_pos[size_t(s)];
      if (!computes(ctx)) continue;
      if (fully_masked(ctx.cfg, mine, kpos)) {
        ++ctx.stats.blocks_skipped;
        continue;
      }
      const auto [Kc, Vc] = tr.block(s);
      const auto mask = make_mask(ctx.cfg, mine, kpos);
      const auto [ob, lb] = acc.next();
      timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, Kc, Vc, mask, ob, lb, ctx.cfg.attn); });
      acc.merge(ctx);
    }
    acc.finish();
    oa.store(ctx);
    if (communicates(ctx)) kept_k_ = fingerprint(k), kept_v_ = fingerprint(v), kept_valid_ = true;
  }

  // Given o, lse, dout[Sl,H,D] -> dq[Sl,H,D], dk, dv[Sl,Hkv,D] (overwritten).
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    const auto plan = plan_of(ctx.cfg);
    const auto& g = ctx.comm.world();
    const Exchanges& x = exchanges(plan, g.rank);
    const std::vector<int64_t>& mine = (*plan->tokens)[size_t(x.r)];
    const bool held = kept_valid_ && kept_k_ == fingerprint(k) && kept_v_ == fingerprint(v);
    Transfer tr(ctx, x, k, v, held ? kept_ : kept_reserve(ctx, x, k));
    if (communicates(ctx) && x.P > 1 && !all_agree(ctx, g, held)) tr.fetch_all();  // exposed
    const AccOut<T> dqa(dq, "groupcast_dq_acc"), dka(dk, "groupcast_dk_acc"), dva(dv, "groupcast_dv_acc");
    Kokkos::deep_copy(dqa.acc(), A(0));
    Kokkos::deep_copy(dka.acc(), A(0));
    Kokkos::deep_copy(dva.acc(), A(0));
    Returns ret(ctx, x, k);
    for (int s = 0; s < x.P; ++s) {
      ctx.at_step(s);
      const std::vector<int64_t>& kpos = s == 0 ? mine : x.recv_pos[size_t(s)];
      const auto [Kc, Vc] = tr.block(s);
      const auto [dKc, dVc] = s == 0 ? std::make_pair(dka.acc(), dva.acc()) : ret.partials(s);
      if (computes(ctx) && !fully_masked(ctx.cfg, mine, kpos)) {
        const auto mask = make_mask(ctx.cfg, mine, kpos);
        timed_compute(ctx, [&] {
          return kernels::attention_bwd<T>(q, Kc, Vc, o, lse, dout, mask, dqa.acc(), dKc, dVc, ctx.cfg.attn);
        });
      } else if (computes(ctx)) {
        ++ctx.stats.blocks_skipped;
      }
      ret.post(s);
      ret.finish(s - 1, dka.acc(), dva.acc());
    }
    ret.finish(x.P - 1, dka.acc(), dva.acc());
    for (const AccOut<T>* a : {&dqa, &dka, &dva}) a->store(ctx);
  }

 private:
  // The K/V exchanges of one call: packs what each peer needs (two send buffers, each free
  // again once its exchange was waited for) and receives each step's keys into its rows of
  // the kept buffer ([K rows | V rows] per step). Without communication every step reads a
  // zeroed stand-in of its size.
  class Transfer {
   public:
    Transfer(Context& ctx, const Exchanges& x, CView3<T> k, CView3<T> v, View1<T> kept)
        : ctx_(ctx), x_(x), k_(k), v_(v), kept_(kept), row_(k.extent(1) * k.extent(2)) {
      for (int i = 0; i < 2; ++i)
        send_[i] = scratch<T>("groupcast_send" + std::to_string(i), size_t(2 * x.max_send) * row_);
    }
    // Posts step s's exchange (no-op at step 0, past the last, or without communication).
    void post(int s) {
      if (s <= 0 || s >= x_.P || !communicates(ctx_)) return;
      const size_t n = size_t(x_.sent(s)), got = size_t(x_.got(s));
      View1<T> buf = send_[s % 2];
      timed_aux(ctx_, [&] {
        const auto rows = to_device(x_.send_rows[size_t(s)], "groupcast_rows");
        gather_rows<T>(k_.data(), buf.data(), rows, row_);
        gather_rows<T>(v_.data(), buf.data() + n * row_, rows, row_);
      });
      req_[s % 2] = ctx_.comm.isendrecv(buf.data(), 2 * n * row_ * sizeof(T), x_.to(s), dest(s),
                                        2 * got * row_ * sizeof(T), x_.from(s), ctx_.comm.world(), s);
    }
    void wait(int s) { timed_wait(ctx_, req_[s % 2]); }
    // Every step's exchange, posted and waited for at once (a backward without the forward's keys).
    void fetch_all() {
      for (int s = 1; s < x_.P; ++s) post(s), wait(s);
    }
    // Step s's K, V [got(s), Hkv, D] (step 0: this rank's own).
    std::pair<CView3<T>, CView3<T>> block(int s) const {
      if (s == 0) return {k_, v_};
      const size_t got = size_t(x_.got(s));
      T* p = communicates(ctx_) ? dest(s) : kept_.data();
      return {view3<T>(p, got, k_.extent(1), k_.extent(2)), view3<T>(p + got * row_, got, k_.extent(1), k_.extent(2))};
    }

   private:
    T* dest(int s) const { return kept_.data() + size_t(2 * x_.recv_offset[size_t(s)]) * row_; }
    Context& ctx_;
    const Exchanges& x_;
    CView3<T> k_, v_;
    View1<T> kept_, send_[2];
    size_t row_;
    comm::Request req_[2];
  };

  // The backward's dK/dV partials: step s's of the keys received from rank r - s go back to
  // it (posted after the step's compute), and rank r + s's of this rank's rows arrive and
  // are added in (after the next step's compute). Two of each buffer, each free again once
  // its exchange was waited for; without communication a zeroed stand-in is added (same work).
  class Returns {
   public:
    Returns(Context& ctx, const Exchanges& x, CView3<T> k)
        : ctx_(ctx), x_(x), narrow_(DkvWire<T>::narrow(ctx.cfg)), Hkv_(k.extent(1)), D_(k.extent(2)), row_(Hkv_ * D_) {
      int64_t max_got = 0;
      for (int s = 1; s < x.P; ++s) max_got = std::max(max_got, x.got(s));
      const size_t out = size_t(2 * max_got) * row_, in = size_t(2 * x.max_send) * row_;
      for (int i = 0; i < 2; ++i) {
        const std::string b = std::to_string(i);
        part_[i] = scratch<A>("groupcast_part" + b, out);
        if (narrow_)
          part16_[i] = scratch<T>("groupcast_part16_" + b, out), in16_[i] = scratch<T>("groupcast_in16_" + b, in);
        if (!narrow_) in_[i] = scratch<A>("groupcast_in" + b, in);
      }
      if (!communicates(ctx))
        for (int i = 0; i < 2; ++i) narrow_ ? Kokkos::deep_copy(in16_[i], T(0.0f)) : Kokkos::deep_copy(in_[i], A(0));
    }
    // Step s's zeroed partials dK, dV [got(s), Hkv, D], for s >= 1.
    std::pair<View3<A>, View3<A>> partials(int s) {
      const size_t got = size_t(x_.got(s));
      A* p = part_[s % 2].data();
      timed_aux(ctx_, [&] { Kokkos::deep_copy(View1<A>(p, 2 * got * row_), A(0)); });
      return {view3<A>(p, got, Hkv_, D_), view3<A>(p + got * row_, got, Hkv_, D_)};
    }
    void post(int s) {
      if (s <= 0 || !communicates(ctx_)) return;
      const size_t got = size_t(x_.got(s)), n = size_t(x_.sent(s)), w = narrow_ ? sizeof(T) : sizeof(A);
      const void* send = part_[s % 2].data();
      if constexpr (!std::is_same<T, A>::value)
        if (narrow_) {
          timed_aux(ctx_, [&] {
            kernels::convert<T, A>(part16_[s % 2].data(), part_[s % 2].data(), int64_t(2 * got * row_));
          });
          send = part16_[s % 2].data();
        }
      void* recv = narrow_ ? static_cast<void*>(in16_[s % 2].data()) : static_cast<void*>(in_[s % 2].data());
      req_[s % 2] = ctx_.comm.isendrecv(send, 2 * got * row_ * w, x_.from(s), recv, 2 * n * row_ * w, x_.to(s),
                                        ctx_.comm.world(), s, kReturns);
    }
    // Waits for step s's returned partials and adds them into dk, dv [Sl,Hkv,D] (s >= 1).
    void finish(int s, View3<A> dk, View3<A> dv) {
      if (s <= 0) return;
      timed_wait(ctx_, req_[s % 2]);
      if (!computes(ctx_)) return;
      const size_t n = size_t(x_.sent(s));
      timed_aux(ctx_, [&] {
        const auto rows = to_device(x_.send_rows[size_t(s)], "groupcast_rows");
        if (narrow_) {
          add_rows<A, T>(dk.data(), in16_[s % 2].data(), rows, row_);
          add_rows<A, T>(dv.data(), in16_[s % 2].data() + n * row_, rows, row_);
        } else {
          add_rows<A, A>(dk.data(), in_[s % 2].data(), rows, row_);
          add_rows<A, A>(dv.data(), in_[s % 2].data() + n * row_, rows, row_);
        }
      });
    }

   private:
    Context& ctx_;
    const Exchanges& x_;
    bool narrow_;
    size_t Hkv_, D_, row_;
    View1<A> part_[2], in_[2];
    View1<T> part16_[2], in16_[2];
    comm::Request req_[2];
  };

  // The kept buffer sized for x's received keys, marked invalid until a forward fills it.
  // Without communication it is a zeroed stand-in (nothing will be received into it).
  View1<T> kept_reserve(const Context& ctx, const Exchanges& x, CView3<T> k) {
    kept_valid_ = false;
    const size_t n = size_t(2 * x.recv_offset.back()) * k.extent(1) * k.extent(2);
    if (kept_.extent(0) != n)
      kept_ = View1<T>(Kokkos::view_alloc(std::string("groupcast_kept"), Kokkos::WithoutInitializing), n);
    if (!communicates(ctx)) Kokkos::deep_copy(kept_, T(0.0f));
    return kept_;
  }

  // This rank's exchanges under plan, derived once per plan (every forward and backward of the
  // case reads the same).
  const Exchanges& exchanges(const std::shared_ptr<const Plan>& plan, int r) {
    if (plan != plan_ || !x_ || x_->r != r) x_ = std::make_unique<Exchanges>(exchanges_of(*plan, r)), plan_ = plan;
    return *x_;
  }

  std::shared_ptr<const Plan> plan_;  // the plan x_ was derived from
  std::unique_ptr<Exchanges> x_;
  View1<T> kept_;  // every step's received [K | V], in step order (Exchanges::recv_offset)
  Fingerprint kept_k_, kept_v_;
  bool kept_valid_ = false;
};

// The model's view of rank r: step s attends to the keys rank r - s sends (step 0: its own);
// the forward posts step s+1's exchange during step s; the backward moves no K/V (the kept
// keys, agreed on by one all-reduce) and returns step s's partials during step s + 1, the
// last step's after the loop (exposed).
predict::Schedule groupcast_schedule(const Config& c, const predict::Topo& t, int r, bool backward, size_t elem) {
  const auto plan = plan_of(c);
  const int P = plan->ranks();
  const double row = double(c.kv_heads) * c.head_dim, nq = double(plan->runs[size_t(r)].tokens());
  const predict::Spans q = layout::spans_of_positions((*plan->tokens)[size_t(r)]);
  // Step s's exchange with its n tokens of K and V (or dK and dV) at e bytes a value: what r
  // sends (its peers' steps carry theirs).
  auto call = [&](int s, int64_t n, size_t e) {
    const bool inter = !t.same_node(r, (r + s) % P) || !t.same_node(r, (r - s + P) % P);
    return predict::CommCall{comm::EventKind::SendRecv, int64_t(2 * double(n) * row * e), P, inter};
  };
  auto exchange = [&](int s) { return call(s, plan->count(r, (r + s) % P), elem); };  // the K/V r sends
  auto give_back = [&](int s) {  // step s's partials of the keys r received, back to their owner
    return call(s, plan->count((r - s + P) % P, r), dkv_elem(c, elem));
  };

  predict::Schedule out;
  for (int s = 0; s < P; ++s) {
    predict::Step st;
    predict::Spans kv = q;
    if (s > 0) {
      kv.clear();
      for (const Piece& p : plan->pieces((r - s + P) % P, r)) kv.push_back({p.pos, p.count, 1});
    }
    st.attn.push_back({q, kv, c.heads, c.kv_heads});
    const double got = double(layout::count(kv)), sent = double(plan->count(r, (r + s) % P));
    if (!backward) {
      if (s + 1 < P) st.overlapped.push_back(exchange(s + 1));
      st.aux_values = (s + 1 < P ? 2 * double(plan->count(r, (r + s + 1) % P)) * row : 0) +
                      (s > 0 ? nq * c.heads * (c.head_dim + 1.0) : 0);
    } else {
      if (s >= 2) st.overlapped.push_back(give_back(s - 1));
      st.aux_values = s > 0 ? 2 * got * row + 2 * sent * row : 0;
    }
    out.steps.push_back(st);
  }
  if (backward && P > 1) {
    out.steps[0].exposed.push_back({comm::EventKind::AllReduce, 8, P, t.spans_nodes(0, P, 1)});
    predict::Step last;
    last.exposed.push_back(give_back(P - 1));
    out.steps.push_back(last);
  }
  return out;
}

// The buffers of the rank that needs most: two send buffers of the largest send, the kept
// keys of every step (per object), two partial dK/dV buffers of the largest receive (and
// their bf16 copies with bf16_dkv) and two received ones of the largest send, one partial
// (O, LSE), and a bf16 run's fp32 accumulators of its outputs.
Workspace groupcast_workspace(const Config& c) {
  const auto plan = plan_of(c);
  const int P = plan->ranks();
  const double row = double(c.kv_heads) * c.head_dim;
  Workspace most;
  for (int r = 0; r < P; ++r) {
    double send = 0, got = 0, kept = 0;
    for (int s = 1; s < P; ++s) {
      const double n = double(plan->count((r - s + P) % P, r));
      send = std::max(send, double(plan->count(r, (r + s) % P))), got = std::max(got, n), kept += n;
    }
    const double nq = double(plan->runs[size_t(r)].tokens());
    const Workspace w = by_precision(c, [&](const Units& u) {
      const bool thin = u.dkv < u.acc;
      const double partial = P > 1 ? u.acc * nq * c.heads * (c.head_dim + 1.0) : 0;
      return Workspace{4 * send * row + 4 * got * row * (u.acc + (thin ? u.dkv : 0)) + 4 * send * row * u.dkv +
                           partial + output_accumulators(u, c, nq, nq),
                       2 * kept * row};
    });
    if (w.values(4, 1) > most.values(4, 1)) most = w;
  }
  return most;
}

}  // namespace

SchemeInfo groupcast_scheme() {
  SchemeInfo s = make_info<GroupCast>(
      "groupcast",
      "each K/V token sent only to the ranks whose queries see it, dK/dV back only from them (point-to-point, "
      "overlapped); any dispatch, any token counts; zigzag layout");
  s.takes_dispatch = true;
  s.refuses = "seq_len below ranks";
  s.check = [](const Config& c) {
    return c.seq_len >= c.ranks ? std::string()
                                : "groupcast needs seq_len >= ranks (a token per rank); seq_len " +
                                      std::to_string(c.seq_len) + " over " + std::to_string(c.ranks) + " ranks";
  };
  s.shard = [](const Config& c, int r) {
    const auto t = (*plan_of(c)->tokens)[size_t(r)];
    return Shard{t, t};
  };
  s.workspace = groupcast_workspace;
  s.schedule = groupcast_schedule;
  return s;
}

}  // namespace minicp::cp
