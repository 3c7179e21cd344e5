// A layer used as a library kernel from C++20 through the header-only API: a grouped 3x3
// Convolution forward and backward on std::vectors this program owns (its input, output,
// weights and all their gradients, wrapped without copies), checked against plain loops;
// then the same batch cut between the cpu and reference drivers (the hybrid split), merged
// exactly. Exits non-zero on a mismatch.
#include <hybridnn/hybridnn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <vector>

namespace {

float value_at(int i, int period, float scale) {
  return scale * static_cast<float>(i % period - period / 2);
}

double max_error(std::span<const float> got, std::span<const double> want) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
  return worst;
}

}  // namespace

int main() {
  try {
    // 4 images of 4 x 9 x 8 -> 6 x 9 x 8, 3x3 kernels, padding 1, two groups.
    constexpr int n = 4, c = 4, h = 9, w = 8, m = 6, k = 3, pad = 1, groups = 2;
    constexpr int cg = c / groups, mg = m / groups;
    hn::Runtime runtime;
    hn::Driver cpu = runtime.add("cpu");
    runtime.add("reference");

    std::vector<float> x(n * c * h * w), dx(x.size()), y(n * m * h * w), dy(y.size());
    std::vector<float> weights(m * cg * k * k), dweights(weights.size(), 0.0f);
    std::vector<float> bias(m), dbias(m, 0.0f);
    // (Index loops rather than std::views::iota: clang 14 cannot compile libstdc++ 12's.)
    for (int i = 0; i < static_cast<int>(x.size()); ++i)
      x[i] = value_at(i, 7, 0.25f);
    for (int i = 0; i < static_cast<int>(weights.size()); ++i)
      weights[i] = value_at(i, 5, 0.1f);
    for (int i = 0; i < m; ++i)
      bias[i] = 0.05f * static_cast<float>(i);
    for (int i = 0; i < static_cast<int>(dy.size()); ++i)
      dy[i] = value_at(i, 3, 0.5f);

    hn::Tensor input = hn::Tensor::wrap({n, c, h, w}, x.data(), dx.data());
    hn::Tensor output = hn::Tensor::wrap({n, m, h, w}, y.data(), dy.data());
    hn::Tensor weight_tensor = hn::Tensor::wrap({m, cg, k, k}, weights.data(), dweights.data());
    hn::Tensor bias_tensor = hn::Tensor::wrap({m}, bias.data(), dbias.data());
    hn::Layer conv(R"(name: "conv" type: "Convolution"
                      convolution_param { num_output: 6 kernel_size: 3 pad: 1 group: 2 })");
    const auto out_dims = conv.setup({&input});
    conv.set_param(0, weight_tensor);
    conv.set_param(1, bias_tensor);
    conv.forward(cpu, {&input}, {&output});
    conv.backward(cpu, {&input}, {&output});  // dx overwritten, dweights and dbias added to

    // The definition, in double.
    std::vector<double> y_ref(y.size()), dx_ref(x.size()), dw_ref(weights.size()), db_ref(m);
    for (int in = 0; in < n; ++in)
      for (int co = 0; co < m; ++co)
        for (int r = 0; r < h; ++r)
          for (int s = 0; s < w; ++s) {
            const int yi = ((in * m + co) * h + r) * w + s;
            double sum = bias[co];
            db_ref[co] += dy[yi];
            for (int ci = 0; ci < cg; ++ci)
              for (int kh = 0; kh < k; ++kh)
                for (int kw = 0; kw < k; ++kw) {
                  const int ih = r - pad + kh, iw = s - pad + kw;
                  if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                  const int xi = ((in * c + co / mg * cg + ci) * h + ih) * w + iw;
                  const int wi = ((co * cg + ci) * k + kh) * k + kw;
                  sum += static_cast<double>(x[xi]) * weights[wi];
                  dx_ref[xi] += static_cast<double>(dy[yi]) * weights[wi];
                  dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
                }
            y_ref[yi] = sum;
          }
    const double forward_error = max_error(y, y_ref);
    const double backward_error =
        std::max({max_error(dx, dx_ref), max_error(dweights, dw_ref), max_error(dbias, db_ref)});

    // Half the images on each driver: the same outputs.
    conv.set_split(runtime, "cpu:0.5,reference:0.5");
    std::fill(y.begin(), y.end(), -1.0f);
    conv.forward(cpu, {&input}, {&output});
    const double split_error = max_error(y, y_ref);

    const bool ok = out_dims.at(0) == std::vector<int64_t>{n, m, h, w} && forward_error < 1e-5 &&
                    backward_error < 1e-5 && split_error < 1e-5;
    std::printf(
        "embed_hpp: hybridnn %s, conv %dx%dx%dx%d -> %d channels on %s: forward error %.1e, "
        "backward %.1e, split cpu+reference %.1e: %s\n",
        hn::version().c_str(), n, c, h, w, m, cpu.name().c_str(), forward_error, backward_error,
        split_error, ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const hn::Error& e) {
    std::fprintf(stderr, "embed_hpp: %s\n", e.what());
    return 1;
  }
}
