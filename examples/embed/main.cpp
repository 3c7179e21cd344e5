// Embedding hybridnn from C++ through its header-only API (hybridnn.hpp over the C ABI):
// an InnerProduct layer (one GEMM) and an in-place ReLU run as kernels on arrays this
// program owns, checked against a plain loop. Exits non-zero on a mismatch.
#include <hybridnn/hybridnn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  try {
    hn::Runtime runtime;
    hn::Driver cpu = runtime.add("cpu");
    const int m = 3, n = 4, k = 5;  // a batch of m rows of k features -> n outputs
    std::vector<float> x(m * k), weights(n * k), bias(n, 0.0f), y(m * n);
    for (int i = 0; i < m * k; ++i)
      x[i] = 0.5f * static_cast<float>(i % 7) - 1.0f;
    for (int i = 0; i < n * k; ++i)
      weights[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;

    // The program's arrays, used in place by the layers (no copies).
    hn::Tensor input = hn::Tensor::wrap({m, k}, x.data());
    hn::Tensor output = hn::Tensor::wrap({m, n}, y.data());
    hn::Tensor w = hn::Tensor::wrap({n, k}, weights.data());
    hn::Tensor b = hn::Tensor::wrap({n}, bias.data());
    hn::Layer ip(R"(name: "ip" type: "InnerProduct" inner_product_param { num_output: 4 })");
    hn::Layer relu(R"(name: "relu" type: "ReLU")");
    ip.setup({&input});
    ip.set_param(0, w);
    ip.set_param(1, b);
    relu.setup({&output});
    ip.forward(cpu, {&input}, {&output});
    relu.forward(cpu, {&output}, {&output});

    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float expected = 0.0f;
        for (int p = 0; p < k; ++p)
          expected += x[i * k + p] * weights[j * k + p];
        expected = expected > 0.0f ? expected : 0.0f;
        if (std::abs(expected - y[i * n + j]) > 1e-5f) {
          std::fprintf(stderr, "embed: y[%d][%d] = %g, expected %g\n", i, j, y[i * n + j],
                       expected);
          return 1;
        }
      }
    }
    std::printf("embed: hybridnn %s on %s: InnerProduct+ReLU %dx%dx%d matches\n",
                hn::version().c_str(), cpu.description().c_str(), m, n, k);
  } catch (const hn::Error& error) {
    std::fprintf(stderr, "embed: %s\n", error.what());
    return 1;
  }
  return 0;
}
