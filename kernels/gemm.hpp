// The one GEMM entry point: row-major C = alpha*op(A)*op(B) + beta*C on Views, handed to
// BLAS (OpenBLAS/any Fortran BLAS on the host, cuBLAS under MINICP_ENABLE_CUDA). Every
// large GEMM goes through it; only the attention tiles use their own kernel (tile_gemm.hpp).
#pragma once
#include "kernels/types.hpp"

namespace minicp::kernels {

enum class Trans { N, T };

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. Threads: the BLAS library's own.
// Call from outside any parallel region. Throws std::invalid_argument on shape mismatch.
template <class T>
void gemm(Trans ta, Trans tb, Scalar<T> alpha, CView2<T> A, CView2<T> B, Scalar<T> beta, View2<T> C);

// Number of useful FLOPs of one GEMM: 2*M*N*K.
inline double gemm_flops(double M, double N, double K) { return 2.0 * M * N * K; }

// Name of the BLAS backend compiled in ("blas" or "cublas").
const char* gemm_backend();

}  // namespace minicp::kernels
