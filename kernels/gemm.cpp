// BLAS bindings behind kernels::gemm. Row-major calls become column-major ones with the
// operands swapped (C^T = op(B)^T op(A)^T). The Fortran interface works with any BLAS.
// bf16: cuBLAS's cublasGemmEx (fp32 compute) in a CUDA build; on the host oneDNN's matmul when
// built with it and it has a kernel for this CPU, else the operands widened to fp32 and SGEMM.
#include "kernels/gemm.hpp"

#include "kernels/convert.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

#if defined(MINICP_ENABLE_CUDA) && defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#define MINICP_GEMM_CUBLAS 1
#endif
// oneDNN's CPU engine runs the bf16 GEMMs of a host build (ONEDNN_VERBOSE=1 prints each
// primitive it creates and runs, with the kernel chosen).
#if defined(MINICP_HAVE_ONEDNN) && !defined(MINICP_GEMM_CUBLAS)
#define MINICP_GEMM_ONEDNN 1
#endif
#ifdef MINICP_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc,
            std::size_t, std::size_t);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc, std::size_t, std::size_t);
}

namespace minicp::kernels {
namespace {

void blas_colmajor(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                   float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc, 1, 1);
}
void blas_colmajor(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                   int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc, 1, 1);
}

#ifdef MINICP_GEMM_CUBLAS
cublasHandle_t cublas_handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t x;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("gemm: cublasCreate failed");
    return x;
  }();
  return h;
}
cublasStatus_t cublas_colmajor(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  return cublasSgemm(cublas_handle(), ta, tb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}
cublasStatus_t cublas_colmajor(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, double alpha,
                               const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  return cublasDgemm(cublas_handle(), ta, tb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}
// bf16 x bf16 summed in fp32 (tensor cores); C in bf16 (rounded once) or fp32 (acc_out).
void cublas_bf16(Trans ta, Trans tb, float alpha, const bf16* A, int lda, const bf16* B, int ldb, float beta, void* C,
                 int ldc, int M, int N, int K, bool acc_out) {
  auto op = [](Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; };
  Kokkos::fence();
  const cublasStatus_t s =
      cublasGemmEx(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
                   acc_out ? CUDA_R_32F : CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  Kokkos::fence();
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("gemm: cublasGemmEx (bf16) failed, status " + std::to_string(int(s)));
}
#endif

struct GemmDims {
  int M, N, K;
};

// C[M,N] = op(A)[M,K] op(B)[K,N], or std::invalid_argument naming the three shapes.
template <class VA, class VB, class VC>
GemmDims gemm_dims(Trans ta, Trans tb, const VA& A, const VB& B, const VC& C) {
  const int M = static_cast<int>(C.extent(0)), N = static_cast<int>(C.extent(1));
  const int am = static_cast<int>(ta == Trans::N ? A.extent(0) : A.extent(1));
  const int K = static_cast<int>(ta == Trans::N ? A.extent(1) : A.extent(0));
  const int bk = static_cast<int>(tb == Trans::N ? B.extent(0) : B.extent(1));
  const int bn = static_cast<int>(tb == Trans::N ? B.extent(1) : B.extent(0));
  if (am != M || bn != N || bk != K) {
    throw std::invalid_argument("gemm: shapes do not match: op(A) is " + std::to_string(am) + "x" + std::to_string(K) +
                                ", op(B) is " + std::to_string(bk) + "x" + std::to_string(bn) + ", C is " +
                                std::to_string(M) + "x" + std::to_string(N));
  }
  return {M, N, K};
}
}  // namespace

template <class T>
void gemm(Trans ta, Trans tb, Scalar<acc_t<T>> alpha, CView2<T> A, CView2<T> B, Scalar<acc_t<T>> beta, View2<T> C) {
  const auto [M, N, K] = gemm_dims(ta, tb, A, B, C);
  if (M == 0 || N == 0) return;
  const int lda = std::max<int>(1, static_cast<int>(A.extent(1)));
  const int ldb = std::max<int>(1, static_cast<int>(B.extent(1)));
  const int ldc = std::max<int>(1, N);
#ifdef MINICP_GEMM_CUBLAS
  Kokkos::fence();
  auto op = [](Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; };
  if (cublas_colmajor(op(tb), op(ta), N, M, K, alpha, B.data(), ldb, A.data(), lda, beta, C.data(), ldc) !=
      CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("gemm: cuBLAS call failed");
  Kokkos::fence();
#else
  blas_colmajor(tb == Trans::T ? 'T' : 'N', ta == Trans::T ? 'T' : 'N', N, M, K, alpha, B.data(), ldb, A.data(), lda,
                beta, C.data(), ldc);
#endif
}

template <class T>
void gemm_acc(Trans ta, Trans tb, Scalar<acc_t<T>> alpha, CView2<T> A, CView2<T> B, Scalar<acc_t<T>> beta,
              View2<acc_t<T>> C) {
  gemm<T>(ta, tb, alpha, A, B, beta, C);
}

namespace {
View2<float> widen(CView2<bf16> x, const char* label) {
  View2<float> w(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), x.extent(0), x.extent(1));
  convert_view<float, bf16>(w, x);
  return w;
}

void convert_sgemm_acc(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<float> C) {
  gemm<float>(ta, tb, alpha, widen(A, "gemm_a32"), widen(B, "gemm_b32"), beta, C);
}

void convert_sgemm(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<bf16> C) {
  View2<float> c32 = beta != 0.0f
                         ? widen(C, "gemm_c32")
                         : View2<float>(Kokkos::view_alloc(std::string("gemm_c32"), Kokkos::WithoutInitializing),
                                        C.extent(0), C.extent(1));
  convert_sgemm_acc(ta, tb, alpha, A, B, beta, c32);
  convert_view<bf16, float>(C, c32);
}

#ifdef MINICP_GEMM_ONEDNN
// One bf16 matmul: C[M,N] (bf16 or fp32) = alpha * op(A) op(B) + beta * C. Row-major Views,
// a transpose is the operand's memory-descriptor strides: nothing is copied.
struct MatmulKey {
  int m, n, k;
  bool ta, tb, acc_out;
  uint32_t alpha, beta;  // bit patterns: both are baked into the primitive
  bool operator==(const MatmulKey& o) const {
    return m == o.m && n == o.n && k == o.k && ta == o.ta && tb == o.tb && acc_out == o.acc_out && alpha == o.alpha &&
           beta == o.beta;
  }
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& x) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t v :
         {uint64_t(x.m), uint64_t(x.n), uint64_t(x.k), uint64_t(x.ta) | uint64_t(x.tb) << 1 | uint64_t(x.acc_out) << 2,
          uint64_t(x.alpha) << 32 | x.beta})
      h = (h ^ v) * 1099511628211ull;
    return size_t(h);
  }
};

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A primitive and the kernel oneDNN chose for it; no primitive when oneDNN has no kernel for
// this CPU (it refuses bf16 below AVX-512) or only its reference loops: those shapes take
// convert+sgemm instead.
struct Matmul {
  std::optional<dnnl::matmul> prim;
  dnnl::memory::desc a, b, c;
  std::string impl;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

Matmul make_matmul(const MatmulKey& key, float alpha, float beta) {
  using dnnl::memory;
  const memory::dim M = key.m, N = key.n, K = key.k;
  // op(A)[m,k] of a row-major A: A[m*K + k], or A[k*M + m] when A is stored transposed.
  Matmul mm;
  mm.a = memory::desc({M, K}, memory::data_type::bf16, key.ta ? memory::dims{1, M} : memory::dims{K, 1});
  mm.b = memory::desc({K, N}, memory::data_type::bf16, key.tb ? memory::dims{1, K} : memory::dims{N, 1});
  mm.c = memory::desc({M, N}, key.acc_out ? memory::data_type::f32 : memory::data_type::bf16, memory::dims{N, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {  // dst = beta * dst + alpha * acc, summed in fp32 and rounded once
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, cpu_engine());
    mm.impl = pd.impl_info_str();
    if (mm.impl.rfind("ref", 0) == 0)
      mm.impl = "only its reference loops, " + mm.impl;
    else
      mm.prim = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
    mm.impl = "no bf16 matmul for this CPU";
  }
  return mm;
}

// Created once per key; unordered_map nodes stay put, so the reference outlives the lock.
const Matmul& cached_matmul(const MatmulKey& key, float alpha, float beta) {
  static std::mutex mu;
  static std::unordered_map<MatmulKey, Matmul, MatmulKeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_matmul(key, alpha, beta)).first;
  return it->second;
}

MatmulKey matmul_key(int M, int N, int K, Trans ta, Trans tb, float alpha, float beta, bool acc_out) {
  return {M, N, K, ta == Trans::T, tb == Trans::T, acc_out, float_bits(alpha), float_bits(beta)};
}

// Runs C = alpha op(A) op(B) + beta C on oneDNN; false (nothing done) when this shape has no
// oneDNN kernel here. oneDNN threads on the OpenMP runtime, Kokkos's pool.
bool onednn_gemm(Trans ta, Trans tb, float alpha, const bf16* A, const bf16* B, float beta, void* C, int M, int N,
                 int K, bool acc_out) {
  if (!kHostExec || K == 0) return false;
  const Matmul& mm = cached_matmul(matmul_key(M, N, K, ta, tb, alpha, beta, acc_out), alpha, beta);
  if (!mm.prim) return false;
  static thread_local dnnl::stream stream(cpu_engine());
  dnnl::engine& e = cpu_engine();
  mm.prim->execute(stream, {{DNNL_ARG_SRC, dnnl::memory(mm.a, e, const_cast<bf16*>(A))},
                            {DNNL_ARG_WEIGHTS, dnnl::memory(mm.b, e, const_cast<bf16*>(B))},
                            {DNNL_ARG_DST, dnnl::memory(mm.c, e, C)}});
  stream.wait();
  return true;
}
#endif

// C (bf16, or fp32 for gemm_acc) on oneDNN where it has a kernel, else by `fallback`.
template <class TC>
void gemm_bf16(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<TC> C,
               void (*fallback)(Trans, Trans, float, CView2<bf16>, CView2<bf16>, float, View2<TC>)) {
#ifdef MINICP_GEMM_CUBLAS
  const GemmDims d = gemm_dims(ta, tb, A, B, C);
  if (d.M == 0 || d.N == 0) return;
  cublas_bf16(ta, tb, alpha, A.data(), std::max<int>(1, int(A.extent(1))), B.data(), std::max<int>(1, int(B.extent(1))),
              beta, C.data(), std::max<int>(1, d.N), d.M, d.N, d.K, std::is_same<TC, float>::value);
  (void)fallback;
  return;
#endif
#ifdef MINICP_GEMM_ONEDNN
  const GemmDims d = gemm_dims(ta, tb, A, B, C);
  if (d.M == 0 || d.N == 0) return;
  if (onednn_gemm(ta, tb, alpha, A.data(), B.data(), beta, C.data(), d.M, d.N, d.K, std::is_same<TC, float>::value))
    return;
#endif
  fallback(ta, tb, alpha, A, B, beta, C);
}

}  // namespace

template <>
void gemm_acc<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<float> C) {
  gemm_bf16<float>(ta, tb, alpha, A, B, beta, C, convert_sgemm_acc);
}

template <>
void gemm<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<bf16> C) {
  gemm_bf16<bf16>(ta, tb, alpha, A, B, beta, C, convert_sgemm);
}

std::string onednn_version() {
#ifdef MINICP_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#else
  return "";
#endif
}

std::string gemm_bf16_engine(int64_t m, int64_t n, int64_t k) {
#if defined(MINICP_GEMM_CUBLAS)
  (void)m, (void)n, (void)k;
  return "cublas " + std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR) +
         " cublasGemmEx bf16 x bf16, fp32 compute";
#elif defined(MINICP_GEMM_ONEDNN)
  const Matmul& mm =
      cached_matmul(matmul_key(int(m), int(n), int(k), Trans::N, Trans::N, 1.0f, 0.0f, false), 1.0f, 0.0f);
  const std::string od = "onednn " + onednn_version();
  if (kHostExec && mm.prim) return od + " " + mm.impl;
  return "convert+sgemm (" + od + ": " + (kHostExec ? mm.impl : std::string("host memory only")) + ")";
#else
  (void)m, (void)n, (void)k;
  return "convert+sgemm";
#endif
}

const char* gemm_backend() {
#ifdef MINICP_GEMM_CUBLAS
  return "cublas";
#else
  return "blas";
#endif
}

#define MINICP_GEMM_INST(T)                                                  \
  template void gemm<T>(Trans, Trans, T, CView2<T>, CView2<T>, T, View2<T>); \
  template void gemm_acc<T>(Trans, Trans, T, CView2<T>, CView2<T>, T, View2<T>);
MINICP_GEMM_INST(float)
MINICP_GEMM_INST(double)
#undef MINICP_GEMM_INST

}  // namespace minicp::kernels
