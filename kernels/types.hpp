// View aliases, execution spaces and math shims shared by every kernel.
// Tensors are LayoutRight with the token index first ([S, H, D], [S, hidden]), so a CP
// layout slices rows and a BLAS call sees a row-major matrix with a leading dimension.
#pragma once
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/bf16.hpp"

namespace minicp::kernels {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using HostExec = Kokkos::DefaultHostExecutionSpace;

// True when the default execution space runs on the host (Serial, OpenMP, Threads).
constexpr bool kHostExec = std::is_same<Exec, HostExec>::value;
// Whether the host can read the tensors' memory (false on a device space: MPI then needs
// GPU-aware support or host staging, comm::staging_for).
constexpr bool kHostMemory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

// The CUDA stream the default execution space queues its kernels on (cudaStream_t), for a
// communicator that must order its transfers after them; nullptr off CUDA.
inline void* compute_stream() {
#ifdef KOKKOS_ENABLE_CUDA
  return static_cast<void*>(Exec().cuda_stream());
#else
  return nullptr;
#endif
}

template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

// Inputs are taken through these so that T is deduced from the outputs only and
// non-const Views convert implicitly.
template <class T>
struct NoDeduce {
  using type = T;
};
template <class T>
using CView1 = typename NoDeduce<Kokkos::View<const T*, Kokkos::LayoutRight, Mem>>::type;
template <class T>
using CView2 = typename NoDeduce<Kokkos::View<const T**, Kokkos::LayoutRight, Mem>>::type;
template <class T>
using CView3 = typename NoDeduce<Kokkos::View<const T***, Kokkos::LayoutRight, Mem>>::type;
template <class T>
using Scalar = typename NoDeduce<T>::type;

#if KOKKOS_VERSION >= 30600
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION T neg_inf() {
  return static_cast<T>(-INFINITY);
}

// f(i) for i in [0, n), elementwise. On the host the range is cut into chunks of kChunk
// with a vectorised loop inside each: the OpenMP backend's own loop around a per-index
// functor does not vectorise. On a device every index is its own work item.
template <class F>
void for_each_index(const char* label, int64_t n, const F& f) {
  constexpr int64_t kChunk = kHostExec ? 1024 : 1;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(0, (n + kChunk - 1) / kChunk),
      KOKKOS_LAMBDA(const int64_t c) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
#pragma omp simd
        for (int64_t i = c * kChunk; i < end; ++i) f(i);
      });
}

}  // namespace minicp::kernels
