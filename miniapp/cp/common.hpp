// Pieces every scheme file uses: timed compute and waits (into Context::stats and the
// trace), views over raw buffers, position all-gathers, and copies between tensors.
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention.hpp"
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

// The communicator's data type of T (float or double).
template <class T>
constexpr comm::DType dtype_of() {
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

// Step s of a ring of g.size steps: posts the exchange that sends `bytes` of cur to the next
// rank and receives the same into nxt from the previous one; nothing on the last step or
// when the mode skips communication.
inline comm::Request ring_pass(Context& ctx, const comm::Group& g, int s, const void* cur, void* nxt, size_t bytes) {
  if (s >= g.size - 1 || !communicates(ctx)) return {};
  return ctx.comm.isendrecv(cur, bytes, (g.rank + 1) % g.size, nxt, bytes, (g.rank - 1 + g.size) % g.size, g, s);
}

// A View over n0*n1*n2 elements at p (unmanaged: p must outlive it).
template <class T>
View3<T> view3(T* p, size_t n0, size_t n1, size_t n2) {
  return View3<T>(p, n0, n1, n2);
}

// A named scratch buffer of n elements, kept across calls so that page first-touch and the
// MPI library's registration of the pages are paid once, not on every step. Contents are
// undefined on return. Buffers are released by a Kokkos finalize hook.
template <class T>
View1<T> scratch(const std::string& name, size_t n) {
  static std::map<std::string, View1<T>>* cache = [] {
    auto* c = new std::map<std::string, View1<T>>();
    Kokkos::push_finalize_hook([c] { c->clear(); });
    return c;
  }();
  View1<T>& buf = (*cache)[name];
  if (buf.extent(0) < n) buf = View1<T>(Kokkos::view_alloc(name, Kokkos::WithoutInitializing), n);
  return View1<T>(buf.data(), n);
}

// Positions of every rank of group g, gathered (rank i's at [i]); all shards equal-sized.
std::vector<std::vector<int64_t>> allgather_positions(Context& ctx, const comm::Group& g,
                                                      const std::vector<int64_t>& mine);

// k, v[Skv,Hkv,D] -> dst[2 * Skv*Hkv*D] = [K | V], the block a pass-KV ring sends.
template <class T>
void pack_kv(CView3<T> k, CView3<T> v, View1<T> dst) {
  using CV1 = Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem>;
  const size_t n = k.span();
  Kokkos::deep_copy(View1<T>(dst.data(), n), CV1(k.data(), n));
  Kokkos::deep_copy(View1<T>(dst.data() + n, n), CV1(v.data(), n));
}

// dst += src, elementwise over the whole span.
template <class T>
void add_into(View1<T> dst, Kokkos::View<const T*, Kokkos::LayoutRight, kernels::Mem> src) {
  Kokkos::parallel_for(
      "cp::add_into", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, int64_t(dst.extent(0))),
      KOKKOS_LAMBDA(const int64_t i) { dst(i) += src(i); });
}

template <class T>
View1<T> flat(const View3<T>& v) {
  return View1<T>(v.data(), v.span());
}

}  // namespace minicp::cp
