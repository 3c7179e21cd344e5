// sgemm through oneDNN or OpenBLAS.
#include "lib/drivers/cpu/blas.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "lib/core/check.h"

#if HYBRIDNN_WITH_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#if HYBRIDNN_WITH_OPENBLAS
#include <cblas.h>
#endif

#ifndef HYBRIDNN_DEFAULT_BLAS
#define HYBRIDNN_DEFAULT_BLAS "onednn"
#endif

namespace hn::detail::cpu {

namespace {

std::vector<Blas> built() {
  std::vector<Blas> list;
#if HYBRIDNN_WITH_ONEDNN
  list.push_back(Blas::onednn);
#endif
#if HYBRIDNN_WITH_OPENBLAS
  list.push_back(Blas::openblas);
#endif
  // The build's default first; a default that was not built falls back to the first found.
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (std::strcmp(blas_name(list[i]), HYBRIDNN_DEFAULT_BLAS) == 0) {
      std::swap(list[0], list[i]);
    }
  }
  return list;
}

// k == 0 leaves only C = beta * C. oneDNN 2.6 returns without touching C then, so a NaN
// in C would survive beta == 0; done here for both libraries.
void scale_only(index_t m, index_t n, float beta, float* c, index_t ldc) {
  for (index_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, 0.0f);
    } else {
      for (index_t j = 0; j < n; ++j)
        row[j] *= beta;
    }
  }
}

#if HYBRIDNN_WITH_ONEDNN
// oneDNN 2.6's sgemm is slow on C = A * B^T when A has few rows and B^T many columns (an
// InnerProduct forward: a batch of rows against a wide weight matrix): it runs 1.5-2x
// faster as C^T = B * A^T. CaffeNet's fc6 (32 x 4096 x 9216) on 2 threads: 23 ms as asked,
// 14.5 ms swapped plus 0.1 ms to transpose the result back; fc7: 10.1 vs 5.2 ms; LeNet's
// ip1 (64 x 500 x 800) on one: 0.36 vs 0.32 ms.
constexpr index_t kWideRatio = 4;

bool swap_wide_nt(bool trans_a, bool trans_b, index_t m, index_t n) {
  return !trans_a && trans_b && m * kWideRatio <= n;
}

// C = alpha * A * B^T + beta * C computed as C^T in a scratch buffer, then transposed.
dnnl_status_t sgemm_nt_swapped(index_t m, index_t n, index_t k, float alpha, const float* a,
                               index_t lda, const float* b, index_t ldb, float beta, float* c,
                               index_t ldc) {
  thread_local std::vector<float> scratch;  // C^T, n x m
  scratch.resize(static_cast<std::size_t>(m * n));
  const dnnl_status_t status =
      dnnl_sgemm('N', 'T', n, m, k, alpha, b, ldb, a, lda, 0.0f, scratch.data(), m);
  if (status != dnnl_success) return status;
  // Tiles of 16 x 16 keep both sides within a few cache lines.
  constexpr index_t kTile = 16;
  for (index_t i0 = 0; i0 < m; i0 += kTile) {
    const index_t i1 = std::min(m, i0 + kTile);
    for (index_t j0 = 0; j0 < n; j0 += kTile) {
      const index_t j1 = std::min(n, j0 + kTile);
      for (index_t i = i0; i < i1; ++i) {
        float* row = c + i * ldc;
        const float* column = scratch.data() + i;
        if (beta == 0.0f) {  // C is not read
          for (index_t j = j0; j < j1; ++j)
            row[j] = column[j * m];
        } else {
          for (index_t j = j0; j < j1; ++j)
            row[j] = column[j * m] + beta * row[j];
        }
      }
    }
  }
  return dnnl_success;
}
#endif

}  // namespace

const char* blas_name(Blas blas) {
  return blas == Blas::onednn ? "onednn" : "openblas";
}

std::vector<std::string> blas_names() {
  std::vector<std::string> names;
  for (const Blas blas : built())
    names.emplace_back(blas_name(blas));
  return names;
}

Blas parse_blas(const std::string& name) {
  const std::vector<Blas> list = built();
  if (name.empty()) return list.front();
  for (const Blas blas : list) {
    if (name == blas_name(blas)) return blas;
  }
  fail("cpu driver: BLAS '{}' is not available in this build; available: {}", name,
       fmt::join(blas_names(), ", "));
}

void sgemm(Blas blas, int threads, bool trans_a, bool trans_b, index_t m, index_t n, index_t k,
           float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
           float* c, index_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_only(m, n, beta, c, ldc);
    return;
  }
  // With k > 0 both libraries overwrite C when beta == 0, NaN included (oneDNN 2.6 and
  // OpenBLAS 0.3.21, all transpose pairs; tests/test_driver_ops.cpp keeps checking it).
  switch (blas) {
    case Blas::onednn: {
#if HYBRIDNN_WITH_ONEDNN
      // oneDNN (Debian's build uses OpenMP) runs on the calling thread's OpenMP team size.
      omp_set_num_threads(threads);
      const dnnl_status_t status =
          swap_wide_nt(trans_a, trans_b, m, n)
              ? sgemm_nt_swapped(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
              : dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                           beta, c, ldc);
      HN_CHECK(status == dnnl_success,
               "gemm (onednn): dnnl_sgemm failed with status {} (m={} n={} k={})",
               static_cast<int>(status), m, n, k);
      return;
#else
      break;
#endif
    }
    case Blas::openblas: {
#if HYBRIDNN_WITH_OPENBLAS
      constexpr index_t kMaxBlasint = std::numeric_limits<blasint>::max();
      HN_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= kMaxBlasint,
               "gemm (openblas): sizes beyond this OpenBLAS's integer range (m={} n={} k={} "
               "lda={} ldb={} ldc={})",
               m, n, k, lda, ldb, ldc);
      // Process-wide: every OpenBLAS call in the process uses the last count set, so two
      // CPU drivers with different thread counts should not run OpenBLAS concurrently.
      openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                  static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                  static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                  static_cast<blasint>(ldc));
      return;
#else
      break;
#endif
    }
  }
  fail("gemm: BLAS {} is not built in", blas_name(blas));
}

}  // namespace hn::detail::cpu
