// A layer used as a library kernel: a Convolution forward and backward on std::vectors this
// program owns, on the cpu driver, by filling a LayerSlice with Pointers directly; then the
// same layer through run_forward on Tensors. Both are checked against plain loops. Exits
// non-zero on a mismatch.
#include <hybridnn/hybridnn.h>
#include <hybridnn/layers/convolution.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

namespace {

// Caller-owned memory as a Pointer on the cpu driver (it computes on host memory).
hn::Pointer host_pointer(hn::Driver& driver, std::vector<float>& values) {
  return hn::Pointer{driver.device(), values.data(), values.size() * sizeof(float)};
}

float value_at(int i, int period, float scale) {
  return scale * static_cast<float>(i % period - period / 2);
}

double max_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
  }
  return worst;
}

}  // namespace

int main() {
  try {
    // A 3x3 convolution with padding 1 and two groups: 4 images of 4 x 9 x 8 -> 6 x 9 x 8.
    const int n = 4, c = 4, h = 9, w = 8, m = 6, k = 3, pad = 1, groups = 2;
    hn::ConvolutionParams params;
    params.num_output = m;
    params.kernel_size = {k};
    params.pad = {pad};
    params.group = groups;
    const std::unique_ptr<hn::Driver> cpu = hn::make_driver(hn::Device::parse("cpu"));
    const std::unique_ptr<hn::Layer> conv = hn::make_convolution_layer("conv", params);
    const hn::Shape in_shape{n, c, h, w};
    const hn::Shape out_shape = conv->setup({in_shape}).at(0);  // 4 x 6 x 9 x 8
    const int oh = static_cast<int>(out_shape[2]), ow = static_cast<int>(out_shape[3]);
    const int cg = c / groups, mg = m / groups;

    std::vector<float> x(in_shape.count()), weights(m * cg * k * k), bias(m);
    std::vector<float> y(out_shape.count()), dy(out_shape.count());
    std::vector<float> dx(x.size()), dweights(weights.size(), 0.0f), dbias(m, 0.0f);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = value_at(static_cast<int>(i), 7, 0.25f);
    for (std::size_t i = 0; i < weights.size(); ++i)
      weights[i] = value_at(static_cast<int>(i), 5, 0.1f);
    for (int i = 0; i < m; ++i)
      bias[i] = 0.05f * static_cast<float>(i);
    for (std::size_t i = 0; i < dy.size(); ++i)
      dy[i] = value_at(static_cast<int>(i), 3, 0.5f);
    // The layer's scratch; a slice of `rows` images needs workspace_bytes(driver, rows).
    std::vector<float> workspace(conv->workspace_bytes(*cpu, n) / sizeof(float) + 1);

    // One call over the whole batch: rows [0, n). Operands point at the first row of the
    // slice; parameter gradients are accumulated into, input gradients overwritten.
    hn::LayerSlice slice;
    slice.driver = cpu.get();
    slice.begin = 0;
    slice.end = n;
    slice.inputs = {{in_shape, host_pointer(*cpu, x), host_pointer(*cpu, dx)}};
    slice.outputs = {{out_shape, host_pointer(*cpu, y), host_pointer(*cpu, dy)}};
    slice.params = {
        {conv->params()[0].shape(), host_pointer(*cpu, weights), host_pointer(*cpu, dweights)},
        {conv->params()[1].shape(), host_pointer(*cpu, bias), host_pointer(*cpu, dbias)}};
    slice.propagate_down = {true};
    slice.workspace = host_pointer(*cpu, workspace);
    conv->forward(slice);
    conv->backward(slice);

    // The definition, in double.
    std::vector<double> y_ref(y.size()), dx_ref(x.size()), dw_ref(weights.size()), db_ref(m);
    for (int in = 0; in < n; ++in)
      for (int co = 0; co < m; ++co)
        for (int r = 0; r < oh; ++r)
          for (int s = 0; s < ow; ++s) {
            const int yi = ((in * m + co) * oh + r) * ow + s;
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

    // The same forward through run_forward on Tensors (what a Net does for each layer).
    hn::Tensor input(in_shape), output(out_shape);
    std::copy(x.begin(), x.end(), input.host_data_mut());
    std::copy(weights.begin(), weights.end(), conv->params()[0].host_data_mut());
    std::copy(bias.begin(), bias.end(), conv->params()[1].host_data_mut());
    hn::run_forward(*conv, *cpu, {&input}, {&output});
    const float* y_tensor = output.host_data();

    const double forward_error = max_error(y, y_ref);
    const double tensor_error = max_error(std::vector<float>(y_tensor, y_tensor + y.size()), y_ref);
    const double backward_error =
        std::max({max_error(dx, dx_ref), max_error(dweights, dw_ref), max_error(dbias, db_ref)});
    const bool ok = forward_error < 1e-5 && tensor_error < 1e-5 && backward_error < 1e-5;
    std::printf(
        "layer_as_kernel: conv %s -> %s (lowering %s) on %s: forward error %.1e, via Tensors "
        "%.1e, backward error %.1e: %s\n",
        in_shape.to_string().c_str(), out_shape.to_string().c_str(),
        hn::lowering_name(hn::convolution_lowering(*conv, *cpu)), cpu->description().c_str(),
        forward_error, tensor_error, backward_error, ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const hn::Error& e) {
    std::fprintf(stderr, "layer_as_kernel: %s\n", e.what());
    return 1;
  }
}
