// Embedding hybridnn: run a GEMM and a ReLU from the public API on buffers this program
// owns, and check the result against a plain loop. Exits non-zero on a mismatch.
#include <hybridnn/hybridnn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  try {
    hn::Runtime runtime;
    hn::Driver& cpu = runtime.add(hn::Device::parse("cpu"));
    const int m = 3, n = 4, k = 5;
    std::vector<float> a(m * k), b(k * n), c(m * n, 0.0f);
    for (int i = 0; i < m * k; ++i)
      a[i] = 0.5f * static_cast<float>(i % 7) - 1.0f;
    for (int i = 0; i < k * n; ++i)
      b[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;

    // The cpu driver computes on host memory, so the caller's vectors are used directly.
    cpu.gemm(hn::Transpose::no, hn::Transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
             c.data(), n);
    cpu.relu_forward(m * n, 0.0f, c.data(), c.data());

    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float expected = 0.0f;
        for (int p = 0; p < k; ++p)
          expected += a[i * k + p] * b[p * n + j];
        expected = expected > 0.0f ? expected : 0.0f;
        if (std::abs(expected - c[i * n + j]) > 1e-5f) {
          std::fprintf(stderr, "embed: c[%d][%d] = %g, expected %g\n", i, j, c[i * n + j],
                       expected);
          return 1;
        }
      }
    }
    std::printf("embed: hybridnn %s on %s: gemm+relu %dx%dx%d matches\n", hn::version(),
                cpu.description().c_str(), m, n, k);
  } catch (const hn::Error& error) {
    std::fprintf(stderr, "embed: %s\n", error.what());
    return 1;
  }
  return 0;
}
