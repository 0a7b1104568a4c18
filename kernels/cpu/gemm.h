// Row-major GEMM through OpenBLAS for the CPU kernels: C = alpha·op(A)·op(B) + beta·C,
// with op(A) (M,K), op(B) (K,N), C (M,N). float → cblas_sgemm, double → cblas_dgemm.
// Called outside an OpenMP parallel region it uses all OpenMP threads; inside one (OpenBLAS's
// OpenMP build) it runs on the calling thread.
#pragma once

#include <cblas.h>

namespace berth::cpu {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace berth::cpu

