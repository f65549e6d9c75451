// Pieces every scheme file uses: timed compute and waits (into Context::stats and the
// trace), views over raw buffers, position all-gathers, and copies between tensors.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/convert.hpp"
#include "miniapp/cp/layout.hpp"
#include "miniapp/cp/scheme.hpp"

namespace minicp::cp {

inline bool computes(const Context& c) { return c.cfg.mode != Mode::CommOnly; }
inline bool communicates(const Context& c) { return c.cfg.mode != Mode::ComputeOnly; }

// Runs f() (an attention call returning AttnStats), fenced and timed as a Compute event.
template <class F>
void timed_compute(Context& ctx, F&& f) {
  const double t0 = MPI_Wtime();
  const kernels::AttnStats st = f();
  Kokkos::fence();
  const double t1 = MPI_Wtime();
  ctx.stats.compute_s += t1 - t0;
  ctx.stats.flops += st.flops;
  ++ctx.stats.blocks_computed;
  ctx.comm.trace().add(comm::Event{comm::EventKind::Compute, -1, -1, ctx.step, 0, st.flops, t0, t1});
}

// Other compute (merges, adds, packing) counted in compute time but not as a block.
template <class F>
void timed_aux(Context& ctx, F&& f) {
  const double t0 = MPI_Wtime();
  f();
  Kokkos::fence();
  ctx.stats.compute_s += MPI_Wtime() - t0;
}

inline void timed_wait(Context& ctx, comm::Request& r) {
  if (!r.active()) return;
  const double t0 = MPI_Wtime();
  ctx.comm.wait(r);
  ctx.stats.comm_wait_s += MPI_Wtime() - t0;
}

// The communicator's data type of T (bf16, float or double).
template <class T>
constexpr comm::DType dtype_of() {
  if constexpr (std::is_same<T, kernels::bf16>::value) return comm::DType::BF16;
  return std::is_same<T, float>::value ? comm::DType::F32 : comm::DType::F64;
}

// A blocking all-reduce over the world, counted as communication wait.
template <class T>
void timed_allreduce(Context& ctx, T* buf, size_t count, comm::ReduceOp op) {
  const double t0 = MPI_Wtime();
  ctx.comm.allreduce(buf, count, dtype_of<T>(), op, ctx.comm.world(), ctx.step);
  ctx.stats.comm_wait_s += MPI_Wtime() - t0;
}

// A blocking all-to-all of bytes_per_rank to every rank of g, its time counted as time
// blocked in communication.
inline void timed_alltoall(Context& ctx, const comm::Group& g, const void* send, void* recv, size_t bytes_per_rank) {
  const double t0 = MPI_Wtime();
  ctx.comm.alltoall(send, recv, bytes_per_rank, g, ctx.step);
  ctx.stats.comm_wait_s += MPI_Wtime() - t0;
}

// Step s of a ring of g.size steps: posts the exchange that sends send_bytes of cur to the
// next rank and receives recv_bytes into nxt from the previous one; nothing on the last step
// or when the mode skips communication.
inline comm::Request ring_pass(Context& ctx, const comm::Group& g, int s, const void* cur, size_t send_bytes, void* nxt,
                               size_t recv_bytes) {
  if (s >= g.size - 1 || !communicates(ctx)) return {};
  return ctx.comm.isendrecv(cur, send_bytes, (g.rank + 1) % g.size, nxt, recv_bytes, (g.rank - 1 + g.size) % g.size, g,
                            s);
}
// The same with blocks of one size.
inline comm::Request ring_pass(Context& ctx, const comm::Group& g, int s, const void* cur, void* nxt, size_t bytes) {
  return ring_pass(ctx, g, s, cur, bytes, nxt, bytes);
}

// A View over n0*n1*n2 elements at p (unmanaged: p must outlive it).
template <class T>
View3<T> view3(T* p, size_t n0, size_t n1, size_t n2) {
  return View3<T>(p, n0, n1, n2);
}

namespace detail {
// Registers the function that empties one scratch cache (one per value type), for
// release_scratch().
void register_scratch_cache(std::function<void()> clear);
}  // namespace detail

// A named scratch buffer of n elements, kept across calls so that page first-touch and the
// MPI library's registration of the pages are paid once, not on every step. Contents are
// undefined on return. Buffers are released by a Kokkos finalize hook, or by release_scratch().
template <class T>
View1<T> scratch(const std::string& name, size_t n) {
  static std::map<std::string, View1<T>>* cache = [] {
    auto* c = new std::map<std::string, View1<T>>();
    Kokkos::push_finalize_hook([c] { c->clear(); });
    detail::register_scratch_cache([c] { c->clear(); });
    return c;
  }();
  View1<T>& buf = (*cache)[name];
  if (buf.extent(0) < n) buf = View1<T>(Kokkos::view_alloc(name, Kokkos::WithoutInitializing), n);
  return View1<T>(buf.data(), n);
}

// Frees every scratch buffer of every value type now (the next scratch() call allocates
// afresh), e.g. between cases that should not inherit each other's buffers. No view returned
// by scratch() may be used afterwards: call it between scheme calls, never during one.
void release_scratch();

// What a scheme keeps from a forward for the backward is reused only when the backward is
// handed the same data: the same buffer, the same size, and the same contents (a hash of the
// bits). A reused buffer with new contents, as in micro-batch or recompute schedules, differs.
struct Fingerprint {
  const void* data = nullptr;
  size_t n = 0;
  uint64_t hash = 0;
  bool operator==(const Fingerprint& o) const { return data == o.data && n == o.n && hash == o.hash; }
  bool operator!=(const Fingerprint& o) const { return !(*this == o); }
};

template <class T>
Fingerprint fingerprint(const T* p, size_t n) {
  using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  static_assert(sizeof(T) == sizeof(Bits), "fingerprint: 2-, 4- or 8-byte values");
  uint64_t h = 0;
  // A sum of mixed (bits, index) pairs: order-free, so the parallel reduction is exact.
  Kokkos::parallel_reduce(
      "cp::fingerprint", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, int64_t(n)),
      KOKKOS_LAMBDA(const int64_t i, uint64_t& acc) {
        Bits b;
        memcpy(&b, p + i, sizeof b);
        uint64_t z = uint64_t(b) + uint64_t(i) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        acc += z ^ (z >> 31);
      },
      h);
  return Fingerprint{p, n, h};
}
template <class V>
Fingerprint fingerprint(const V& v) {
  return fingerprint(v.data(), v.span());
}

// True on every rank of g when `mine` is true on every rank of g (one small all-reduce):
// a reuse decision must be the same on all ranks, or one would post transfers the others
// never match.
bool all_agree(Context& ctx, const comm::Group& g, bool mine);

// The online merge of partial attention results over blocks of keys, in the accumulator type
// A (acc_t of the stored type: the kernels' partial results are in it, fp32 for bf16): the
// first block's (O, LSE) is written into o, lse directly, each later one into a scratch
// partial and merged by LSE (kernels::lse_merge); when no block was merged, finish() gives
// o = 0, lse = -inf (rows that see no key). Use:
//   OnlineMerge<A> acc(o_acc, lse, "ring:g3");
//   for each visible block: auto [ob, lb] = acc.next(); <attention into ob, lb>; acc.merge(ctx);
//   acc.finish();
template <class T>
class OnlineMerge {
 public:
  OnlineMerge(View3<T> o, View2<T> lse, std::string name) : o_(o), lse_(lse), name_(std::move(name)) {}
  // Where the next block's (O, LSE) goes.
  std::pair<View3<T>, View2<T>> next() {
    if (!have_) return {o_, lse_};
    if (!o_part_.data()) {
      o_part_ = view3<T>(scratch<T>(name_ + "_o_part", o_.span()).data(), o_.extent(0), o_.extent(1), o_.extent(2));
      lse_part_ = View2<T>(scratch<T>(name_ + "_lse_part", lse_.span()).data(), lse_.extent(0), lse_.extent(1));
    }
    return {o_part_, lse_part_};
  }
  // The block written to next() is complete: merge it (timed as compute).
  void merge(Context& ctx) {
    if (have_) timed_aux(ctx, [&] { kernels::lse_merge<T>(o_, lse_, o_part_, lse_part_); });
    have_ = true;
  }
  void finish() {
    if (have_) return;
    Kokkos::deep_copy(o_, T(0));
    Kokkos::deep_copy(lse_, kernels::neg_inf<T>());
  }

 private:
  View3<T> o_;
  View2<T> lse_;
  std::string name_;
  View3<T> o_part_;
  View2<T> lse_part_;
  bool have_ = false;
};

// Positions of every rank of group g (rank i's at [i]): a dispatch's tokens where g is the
// case's group and `mine` its rank's (every rank knows them: nothing is sent), else gathered
// (then all shards must be equal-sized).
std::vector<std::vector<int64_t>> allgather_positions(Context& ctx, const comm::Group& g,
                                                      const std::vector<int64_t>& mine);
// "" when every rank holds as many tokens as the others, else why `scheme` (whose exchanges
// need equal blocks) refuses the dispatch's tokens.
inline std::string equal_tokens(const std::vector<std::vector<int64_t>>& tokens, const std::string& scheme,
                                const std::string& dispatch) {
  size_t lo = SIZE_MAX, hi = 0;
  for (const auto& t : tokens) lo = std::min(lo, t.size()), hi = std::max(hi, t.size());
  if (lo == hi) return "";
  return scheme + " needs equal tokens on every rank; dispatch " + dispatch + " gives " + std::to_string(lo) + " to " +
         std::to_string(hi) + " over " + std::to_string(tokens.size()) + " ranks";
}
// The spans (consecutive runs) of every rank's tokens of a dispatch, computed once per token
// set and shared: the model asks a schedule for every rank, and each for every rank's rows.
std::shared_ptr<const std::vector<predict::Spans>> dispatch_spans(
    const std::shared_ptr<const std::vector<std::vector<int64_t>>>& tokens);
// Rank r's tokens of a scheme whose layout is a choice: the case's dispatch when it has one,
// else the scheme's own layout over P ranks.
inline std::vector<int64_t> shard_tokens(layout::Kind kind, const Config& c, int P, int r) {
  return c.tokens ? (*c.tokens)[size_t(r)] : layout::of(kind, c.seq_len, P, r);
}
// Tokens of the largest of these shards.
inline size_t max_rows(const std::vector<std::vector<int64_t>>& all) {
  size_t m = 0;
  for (const auto& a : all) m = std::max(m, a.size());
  return m;
}

// k, v[Skv,Hkv,D] -> dst[2 * Skv*Hkv*D] = [K | V], the block a pass-KV ring sends.
template <class T>
void pack_kv(CView3<T> k, CView3<T> v, View1<T> dst) {
  using CV1 = Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>;
  const size_t n = k.span();
  Kokkos::deep_copy(View1<T>(dst.data(), n), CV1(k.data(), n));
  Kokkos::deep_copy(View1<T>(dst.data() + n, n), CV1(v.data(), n));
}

// dst += src, elementwise over the whole span of dst, in dst's type (src may be narrower: a
// bf16 accumulator received into an fp32 one).
template <class T, class S = T>
void add_into(View1<T> dst, Kokkos::View<const S*, Kokkos::LayoutRight, kernels::Mem> src) {
  Kokkos::parallel_for(
      "cp::add_into", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, int64_t(dst.extent(0))),
      KOKKOS_LAMBDA(const int64_t i) { dst(i) += T(src(i)); });
}

// An output tensor out[n0,n1,n2] of the stored type T and the acc_t<T> tensor a scheme
// accumulates it in (the kernels' results, merges and sums of partials): out itself when T is
// its own accumulator (fp32, fp64: no copy), else the scratch buffer `name`, which store()
// rounds into out once, when the scheme writes its output.
template <class T>
class AccOut {
 public:
  using A = kernels::acc_t<T>;
  AccOut(View3<T> out, const std::string& name) : out_(out) {
    if constexpr (std::is_same<T, A>::value)
      acc_ = out;
    else
      acc_ = view3<A>(scratch<A>(name, out.span()).data(), out.extent(0), out.extent(1), out.extent(2));
  }
  const View3<A>& acc() const { return acc_; }
  void store(Context& ctx) const {
    if constexpr (!std::is_same<T, A>::value) timed_aux(ctx, [&] { kernels::convert_view<T, A>(out_, acc_); });
  }

 private:
  View3<T> out_;
  View3<A> acc_;
};

// Bytes per value of a dK/dV accumulator on the wire in a run of elem-byte stored values.
inline size_t dkv_elem(const Config& c, size_t elem) { return c.bf16_dkv ? elem : kernels::acc_size(elem); }

// The wire of the dK/dV accumulators a backward passes on (n values each, acc_t<T> where they
// are summed): acc_t<T> itself, or, in a bf16 run with cfg.bf16_dkv, T: each hop rounds the
// sum it sends, and the receiver adds it in acc_t (receive bf16, add in fp32, round, send).
// fp32 and fp64 runs send their accumulator buffers as they are.
template <class T>
class DkvWire {
 public:
  using A = kernels::acc_t<T>;
  static bool narrow(const Config& c) { return !std::is_same<T, A>::value && c.bf16_dkv; }
  // recv: the scratch buffer a received accumulator lands in (a "_bf16" one when narrow).
  DkvWire(const Context& ctx, size_t n, const std::string& recv) : narrow_(narrow(ctx.cfg)), n_(n) {
    if (narrow_) {
      in16_ = scratch<T>(recv + "_bf16", n);
      out16_ = scratch<T>(recv + "_bf16_send", n);
    } else {
      in_ = scratch<A>(recv, n);
    }
  }
  // Bytes of the first `count` values on the wire (default: all n).
  size_t bytes(size_t count = SIZE_MAX) const { return std::min(count, n_) * (narrow_ ? sizeof(T) : sizeof(A)); }
  void* received() const { return narrow_ ? static_cast<void*>(in16_.data()) : static_cast<void*>(in_.data()); }
  // What goes on the wire for the accumulator acc: acc itself, or acc rounded into the one send
  // buffer (free again once the previous send was waited for, as every caller does first).
  // (its first `count` values; default: all n).
  const void* to_send(Context& ctx, View1<A> acc, size_t count = SIZE_MAX) const {
    if (!narrow_) return acc.data();
    if constexpr (!std::is_same<T, A>::value)
      timed_aux(ctx, [&] { kernels::convert<T, A>(out16_.data(), acc.data(), int64_t(std::min(count, n_))); });
    return out16_.data();
  }
  // dst += the received values [off, off + dst.extent(0)), in acc_t.
  void add_received(View1<A> dst, size_t off) const {
    using CVT = Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>;
    using CVA = Kokkos::View<const A*, Kokkos::LayoutRight, kernels::Mem>;
    if (narrow_)
      add_into<A, T>(dst, CVT(in16_.data() + off, dst.extent(0)));
    else
      add_into<A>(dst, CVA(in_.data() + off, dst.extent(0)));
  }
  void zero_received() const {
    if (narrow_)
      Kokkos::deep_copy(in16_, T(0.0f));
    else
      Kokkos::deep_copy(in_, A(0));
  }

 private:
  bool narrow_;
  size_t n_;
  View1<A> in_;
  View1<T> in16_, out16_;
};

// Values (units u) of a DkvWire per accumulator value: the received buffer, and with
// bf16_dkv in a bf16 run also the rounded send buffer.
inline double dkv_wire_values(const Units& u) { return u.dkv < u.acc ? 2 * u.dkv : u.dkv; }

// Values (in units u) of the AccOut buffers of a scheme's outputs for sq query rows and skv
// key rows: o, and for train dq, dk, dv (none for fp32 and fp64, which accumulate in place).
inline double output_accumulators(const Units& u, const Config& c, double sq, double skv) {
  const double q = sq * c.heads * c.head_dim, kv = skv * c.kv_heads * c.head_dim;
  return u.extra * u.acc * (c.problem == Problem::Train ? 2 * q + 2 * kv : q);
}

template <class T>
View1<T> flat(const View3<T>& v) {
  return View1<T>(v.data(), v.span());
}

}  // namespace minicp::cp
