// The one GEMM entry point: row-major C = alpha*op(A)*op(B) + beta*C on Views, handed to
// BLAS (OpenBLAS/any Fortran BLAS on the host, cuBLAS under MINICP_ENABLE_CUDA); bf16 to
// oneDNN's matmul where built with it (MINICP_ONEDNN), its primitives cached per shape. Every
// large GEMM goes through it; only the attention tiles use their own kernel (tile_gemm.hpp).
#pragma once
#include <string>

#include "kernels/types.hpp"

namespace minicp::kernels {

enum class Trans { N, T };

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, accumulated in acc_t<T> (bf16
// operands: fp32) and rounded once into C. Threads: the library's own. Call from outside any
// parallel region. Throws std::invalid_argument on shape mismatch.
template <class T>
void gemm(Trans ta, Trans tb, Scalar<acc_t<T>> alpha, CView2<T> A, CView2<T> B, Scalar<acc_t<T>> beta, View2<T> C);

// The same with C in the accumulator type: weight gradients of bf16 operands summed in fp32.
// For fp32 and fp64 it is gemm itself.
template <class T>
void gemm_acc(Trans ta, Trans tb, Scalar<acc_t<T>> alpha, CView2<T> A, CView2<T> B, Scalar<acc_t<T>> beta,
              View2<acc_t<T>> C);

template <>
void gemm<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<bf16> C);
template <>
void gemm_acc<bf16>(Trans ta, Trans tb, float alpha, CView2<bf16> A, CView2<bf16> B, float beta, View2<float> C);

// Number of useful FLOPs of one GEMM: 2*M*N*K.
inline double gemm_flops(double M, double N, double K) { return 2.0 * M * N * K; }

// Name of the BLAS backend compiled in ("blas" or "cublas").
const char* gemm_backend();
// What runs a bf16 GEMM of C[m,n] = A[m,k] B[k,n] (the layer's shapes may differ in kernel):
// "onednn 2.6.3 brg:avx512_core_bf16" (oneDNN's version and the kernel of its matmul, bf16
// x bf16 summed in fp32), or "convert+sgemm" (operands widened to fp32, the fp32 GEMM), with
// the reason in brackets when oneDNN is built in but has no kernel for this CPU.
std::string gemm_bf16_engine(int64_t m = 2048, int64_t n = 2048, int64_t k = 2048);
// The oneDNN library's version ("2.6.3"); "" when built without it.
std::string onednn_version();

}  // namespace minicp::kernels
