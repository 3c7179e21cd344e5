// The BLAS libraries behind the CPU driver's GEMM: which ones this build has, and one
// row-major sgemm entry point that sets the library's thread count and handles the
// corner cases the libraries disagree on.
#pragma once

#include <string>
#include <vector>

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

enum class Blas { onednn, openblas };

const char* blas_name(Blas blas);
// The BLAS libraries built in, the default (CMake option HYBRIDNN_BLAS) first.
std::vector<std::string> blas_names();
// "onednn", "openblas", or empty for the default; throws hn::Error listing the built
// ones for any other name or one not built.
Blas parse_blas(const std::string& name);

// C = alpha * op(A) * op(B) + beta * C, row-major, run on `threads` threads. C is not read
// when beta == 0.
void sgemm(Blas blas, int threads, bool trans_a, bool trans_b, index_t m, index_t n, index_t k,
           float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
           float* c, index_t ldc);

}  // namespace hn::detail::cpu
