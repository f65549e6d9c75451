// Register-blocked products of attention tiles: C[M,N] (+)= A(M,K) B[K,N], B and C row-major
// with N contiguous, A read one scalar at a time through a row stride and a column stride.
// With the two strides the same kernel takes a tile, its transpose, or a column block of a
// transposed tile, so the attention loops never pack an operand. Why not BLAS here: at the
// tile sizes of the attention loops (128 x 128 x 128) a BLAS call spends about a third of
// its time packing both operands, every call; this kernel packs nothing.
//
// The inner block is kMR rows x kNV vectors of C held in registers (6 x 4 zmm with
// AVX-512, 6 x 2 ymm otherwise); each k step loads kNV vectors of B and broadcasts kMR
// scalars of A. `c += a * b` becomes one FMA only where the file is compiled with
// -ffp-contract=fast (attention_tiled.cpp is); otherwise it is a multiply and an add.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

// The vector width, and with it the block shape and the packed layout, follows the ISA the
// including file is compiled for. Each width gets its own inline namespace, so two files
// compiled for different ISAs (the kernels with -march=native, a test without) never share a
// symbol: with one name, the linker could pair one file's packed layout with the other's
// kernel (seen at -O2, where these functions are not all inlined).
#if defined(__AVX512F__)
#define MINICP_TILE_ISA v512
#else
#define MINICP_TILE_ISA v256
#endif

namespace minicp::kernels::tile {
inline namespace MINICP_TILE_ISA {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#else
constexpr int kVecBytes = 32;
#endif
constexpr int kMR = 6;
constexpr int kNV = kVecBytes == 64 ? 4 : 2;

template <class T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
constexpr int kLanes = kVecBytes / int(sizeof(T));

template <class T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
inline void store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof(v));
}

// One MR x NV-vector block of C over the whole K.
template <class T, int MR, int NV>
inline void block(int K, const T* A, std::ptrdiff_t ars, std::ptrdiff_t aks, const T* B, std::ptrdiff_t ldb, T* C,
                  std::ptrdiff_t ldc, bool accumulate) {
  constexpr int L = kLanes<T>;
  Vec<T> c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = accumulate ? load(C + r * ldc + v * L) : Vec<T>{};
  for (int k = 0; k < K; ++k) {
    Vec<T> b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = load(B + k * ldb + v * L);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const Vec<T> a = A[r * ars + k * aks] - Vec<T>{};
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(C + r * ldc + v * L, c[r][v]);
}

// All rows of one column panel of NV vectors: full kMR blocks, then one smaller block.
template <class T, int NV>
inline void panel(int M, int K, const T* A, std::ptrdiff_t ars, std::ptrdiff_t aks, const T* B, std::ptrdiff_t ldb,
                  T* C, std::ptrdiff_t ldc, bool accumulate) {
  static_assert(kMR == 6, "the remainder switch below lists the block heights 1..5");
  int m = 0;
  for (; m + kMR <= M; m += kMR) block<T, kMR, NV>(K, A + m * ars, ars, aks, B, ldb, C + m * ldc, ldc, accumulate);
  const T* Am = A + m * ars;
  T* Cm = C + m * ldc;
  switch (M - m) {
    case 5: block<T, 5, NV>(K, Am, ars, aks, B, ldb, Cm, ldc, accumulate); break;
    case 4: block<T, 4, NV>(K, Am, ars, aks, B, ldb, Cm, ldc, accumulate); break;
    case 3: block<T, 3, NV>(K, Am, ars, aks, B, ldb, Cm, ldc, accumulate); break;
    case 2: block<T, 2, NV>(K, Am, ars, aks, B, ldb, Cm, ldc, accumulate); break;
    case 1: block<T, 1, NV>(K, Am, ars, aks, B, ldb, Cm, ldc, accumulate); break;
    default: break;
  }
}

// Packed B: panels of kNB columns, each K rows x kNB contiguous, zero past column N. Rows of
// B at a power-of-two stride (a head's slice of q, k, v) all fall into the same few L1 sets,
// so an unpacked panel would be re-read from L2 by every block (measured on one core: 120
// against 175 GFLOP/s). An operand used by many products is packed once by the caller.
template <class T>
constexpr int kNB = kNV* kLanes<T>;
template <class T>
constexpr int padded(int n) {
  return (n + kNB<T> - 1) / kNB<T> * kNB<T>;
}
template <class T>
std::size_t packed_size(int K, int N) {
  return std::size_t(K) * padded<T>(N);
}

// Bp <- alpha * B[K, N] (row stride ldb), packed.
template <class T>
void pack(int K, int N, const T* B, std::ptrdiff_t ldb, T* Bp, T alpha = T(1)) {
  constexpr int NB = kNB<T>;
  for (int n = 0; n < N; n += NB) {
    const int w = std::min(NB, N - n);
    T* P = Bp + std::size_t(n) * K;
    for (int k = 0; k < K; ++k) {
      for (int c = 0; c < w; ++c) P[k * NB + c] = alpha * B[k * ldb + n + c];
      for (int c = w; c < NB; ++c) P[k * NB + c] = T(0);
    }
  }
}

// Bp <- alpha * X^T packed, for X [N, K] (row stride ldx): B[k, n] = X[n, k].
template <class T>
void pack_transposed(int K, int N, const T* X, std::ptrdiff_t ldx, T* Bp, T alpha = T(1)) {
  constexpr int NB = kNB<T>;
  for (int n = 0; n < N; n += NB) {
    const int w = std::min(NB, N - n);
    T* P = Bp + std::size_t(n) * K;
    for (int c = 0; c < w; ++c)
      for (int k = 0; k < K; ++k) P[k * NB + c] = alpha * X[(n + c) * ldx + k];
    for (int k = 0; k < K; ++k)
      for (int c = w; c < NB; ++c) P[k * NB + c] = T(0);
  }
}

// C[m,n] = (accumulate ? C[m,n] : 0) + sum_k A[m*ars + k*aks] * B[k,n], m < M, n < N, with
// B given packed. Any M, N, K >= 0; in the last panel, columns past its whole vectors take a
// scalar loop.
template <class T>
void gemm_packed(int M, int N, int K, const T* A, std::ptrdiff_t ars, std::ptrdiff_t aks, const T* Bp, T* C,
                 std::ptrdiff_t ldc, bool accumulate) {
  constexpr int L = kLanes<T>, NB = kNB<T>;
  int n = 0;
  for (; n + NB <= N; n += NB) panel<T, kNV>(M, K, A, ars, aks, Bp + std::size_t(n) * K, NB, C + n, ldc, accumulate);
  const T* P = Bp + std::size_t(n) * K;
  int c = 0;
  for (; n + c + L <= N; c += L) panel<T, 1>(M, K, A, ars, aks, P + c, NB, C + n + c, ldc, accumulate);
  for (; n + c < N; ++c)
    for (int m = 0; m < M; ++m) {
      T s = accumulate ? C[m * ldc + n + c] : T(0);
      for (int k = 0; k < K; ++k) s += A[m * ars + k * aks] * P[k * NB + c];
      C[m * ldc + n + c] = s;
    }
}

// The same with B [K, N] (row stride ldb) as it lies: packed into a per-thread buffer first.
template <class T>
void gemm(int M, int N, int K, const T* A, std::ptrdiff_t ars, std::ptrdiff_t aks, const T* B, std::ptrdiff_t ldb, T* C,
          std::ptrdiff_t ldc, bool accumulate) {
  thread_local std::vector<T> packed;
  if (packed.size() < packed_size<T>(K, N)) packed.resize(packed_size<T>(K, N));
  pack(K, N, B, ldb, packed.data());
  gemm_packed(M, N, K, A, ars, aks, packed.data(), C, ldc, accumulate);
}

}  // namespace MINICP_TILE_ISA
}  // namespace minicp::kernels::tile
#undef MINICP_TILE_ISA
