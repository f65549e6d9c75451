// BLAS bindings behind kernels::gemm. Row-major calls become column-major ones with the
// operands swapped (C^T = op(B)^T op(A)^T). The Fortran interface works with any BLAS.
#include "kernels/gemm.hpp"

#include "kernels/convert.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#if defined(MINICP_ENABLE_CUDA) && defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#define MINICP_GEMM_CUBLAS 1
#endif

extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc, std::size_t, std::size_t);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc, std::size_t, std::size_t);
}

namespace minicp::kernels {
namespace {

void blas_colmajor(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc) {
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
#endif

}  // namespace

template <class T>
void gemm(Trans ta, Trans tb, Scalar<acc_t<T>> alpha, CView2<T> A, CView2<T> B, Scalar<acc_t<T>> beta, View2<T> C) {
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
}  // namespace

template <>
void gemm_acc<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<float> C) {
  gemm<float>(ta, tb, alpha, widen(A, "gemm_a32"), widen(B, "gemm_b32"), beta, C);
}

template <>
void gemm<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<bf16> C) {
  View2<float> c32 = beta != 0.0f ? widen(C, "gemm_c32")
                                  : View2<float>(Kokkos::view_alloc(std::string("gemm_c32"), Kokkos::WithoutInitializing),
                                                 C.extent(0), C.extent(1));
  gemm_acc<bf16>(ta, tb, alpha, A, B, beta, c32);
  convert_view<bf16, float>(C, c32);
}

std::string gemm_bf16_engine() { return "convert+sgemm"; }

const char* gemm_backend() {
#ifdef MINICP_GEMM_CUBLAS
  return "cublas";
#else
  return "blas";
#endif
}

#define MINICP_GEMM_INST(T)                                                                                  \
  template void gemm<T>(Trans, Trans, T, CView2<T>, CView2<T>, T, View2<T>);                                  \
  template void gemm_acc<T>(Trans, Trans, T, CView2<T>, CView2<T>, T, View2<T>);
MINICP_GEMM_INST(float)
MINICP_GEMM_INST(double)
#undef MINICP_GEMM_INST

}  // namespace minicp::kernels
