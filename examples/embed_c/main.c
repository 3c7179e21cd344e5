/* Embedding hybridnn from C through its C ABI only (hybridnn_c.h): a 3x3 convolution run
 * as a kernel on this program's arrays, forward and backward, and a small net built from
 * prototxt text whose output is fed from and read into plain arrays; both checked against
 * plain loops. Exits non-zero on a mismatch or an error (printing hn_last_error()). */
#include <hybridnn/hybridnn_c.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    hn_status status_ = (call);                                                                   \
    if (status_ != HN_OK) {                                                                       \
      fprintf(stderr, "embed_c: %s: %s (%s)\n", #call, hn_last_error(), hn_status_name(status_)); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

enum { N = 2, C = 3, H = 5, W = 4, M = 4, K = 3 };

static float x[N * C * H * W], dx[N * C * H * W], y[N * M * H * W], dy[N * M * H * W];
static float weights[M * C * K * K], dweights[M * C * K * K], bias[M], dbias[M];

static int conv_kernel(hn_driver* cpu) {
  const int64_t in_dims[4] = {N, C, H, W}, out_dims[4] = {N, M, H, W};
  const int64_t w_dims[4] = {M, C, K, K}, b_dims[1] = {M};
  hn_tensor *input = NULL, *output = NULL, *w = NULL, *b = NULL;
  hn_layer* conv = NULL;
  int32_t outputs = 0, axes = 0, i;
  int64_t dims[HN_MAX_AXES];
  double worst = 0.0;
  int n, co, r, s, ci, kh, kw;

  for (i = 0; i < N * C * H * W; ++i)
    x[i] = 0.25f * (float)(i % 7 - 3);
  for (i = 0; i < M * C * K * K; ++i)
    weights[i] = 0.1f * (float)(i % 5 - 2);
  for (i = 0; i < M; ++i)
    bias[i] = 0.05f * (float)i;
  for (i = 0; i < N * M * H * W; ++i)
    dy[i] = 0.5f * (float)(i % 3 - 1);

  CHECK(hn_tensor_wrap(4, in_dims, x, dx, NULL, &input));
  CHECK(hn_tensor_wrap(4, out_dims, y, dy, NULL, &output));
  CHECK(hn_tensor_wrap(4, w_dims, weights, dweights, NULL, &w));
  CHECK(hn_tensor_wrap(1, b_dims, bias, dbias, NULL, &b));
  CHECK(
      hn_layer_create("name: \"conv\" type: \"Convolution\" "
                      "convolution_param { num_output: 4 kernel_size: 3 pad: 1 }",
                      &conv));
  CHECK(hn_layer_setup(conv, 1, &input, &outputs));
  CHECK(hn_layer_output_dims(conv, 0, &axes, dims));
  if (outputs != 1 || axes != 4 || dims[1] != M || dims[2] != H || dims[3] != W) {
    fprintf(stderr, "embed_c: unexpected output shape\n");
    return 1;
  }
  CHECK(hn_layer_set_param(conv, 0, w));
  CHECK(hn_layer_set_param(conv, 1, b));
  CHECK(hn_layer_forward(conv, cpu, &input, &output));
  CHECK(hn_layer_backward(conv, cpu, &input, &output, NULL));

  for (n = 0; n < N; ++n)
    for (co = 0; co < M; ++co)
      for (r = 0; r < H; ++r)
        for (s = 0; s < W; ++s) {
          double sum = bias[co];
          for (ci = 0; ci < C; ++ci)
            for (kh = 0; kh < K; ++kh)
              for (kw = 0; kw < K; ++kw) {
                const int ih = r - 1 + kh, iw = s - 1 + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                sum += (double)x[((n * C + ci) * H + ih) * W + iw] *
                       weights[((co * C + ci) * K + kh) * K + kw];
              }
          worst = fmax(worst, fabs(sum - y[((n * M + co) * H + r) * W + s]));
        }
  /* The bias gradient: the sum of dy over images and pixels, added to zero. */
  for (co = 0; co < M; ++co) {
    double sum = 0.0;
    for (n = 0; n < N; ++n)
      for (i = 0; i < H * W; ++i)
        sum += dy[(n * M + co) * H * W + i];
    worst = fmax(worst, fabs(sum - dbias[co]));
  }
  hn_layer_destroy(conv);
  hn_tensor_destroy(input);
  hn_tensor_destroy(output);
  hn_tensor_destroy(w);
  hn_tensor_destroy(b);
  if (worst > 1e-4) {
    fprintf(stderr, "embed_c: convolution differs from the loops by %g\n", worst);
    return 1;
  }
  printf("embed_c: convolution %dx%dx%dx%d -> %d channels as a kernel matches the loops\n", N, C, H,
         W, M);
  return 0;
}

static int small_net(hn_runtime* runtime, hn_driver* cpu) {
  static const char* text =
      "name: \"scale\"\n"
      "layer { name: \"data\" type: \"Input\" top: \"data\" "
      "input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: \"ip\" type: \"InnerProduct\" bottom: \"data\" top: \"ip\" "
      "inner_product_param { num_output: 2 weight_filler { type: \"constant\" value: 0.5 } "
      "bias_filler { type: \"constant\" value: 1 } } }\n"
      "layer { name: \"prob\" type: \"Softmax\" bottom: \"ip\" top: \"prob\" }\n";
  hn_net_options* options = NULL;
  hn_net* net = NULL;
  hn_tensor *data = NULL, *prob = NULL;
  float* values = NULL;
  const float input[6] = {1, 2, 3, -1, 0, 4};
  int i;
  CHECK(hn_net_options_create(&options));
  CHECK(hn_net_options_set(options, "phase", "test"));
  CHECK(hn_net_create_from_text(runtime, cpu, text, "embed_c", options, &net));
  CHECK(hn_net_blob(net, "data", &data));
  CHECK(hn_tensor_data(data, HN_OVERWRITE, &values));
  memcpy(values, input, sizeof input);
  CHECK(hn_net_forward(net, NULL));
  CHECK(hn_net_blob(net, hn_net_output_names(net), &prob));
  CHECK(hn_tensor_data(prob, HN_READ, &values));
  /* Both outputs of a row are equal (same weights), so the softmax is 0.5 everywhere. */
  for (i = 0; i < 4; ++i) {
    if (fabs(values[i] - 0.5) > 1e-6) {
      fprintf(stderr, "embed_c: prob[%d] = %g, expected 0.5\n", i, values[i]);
      return 1;
    }
  }
  hn_tensor_destroy(prob);
  hn_tensor_destroy(data);
  hn_net_destroy(net);
  hn_net_options_destroy(options);
  printf("embed_c: net '%s' from text: softmax of equal scores is 0.5\n", "scale");
  return 0;
}

int main(void) {
  hn_runtime* runtime = NULL;
  hn_driver* cpu = NULL;
  int failed;
  if (hn_abi_version() < HN_ABI_VERSION) {
    fprintf(stderr, "embed_c: libhybridnn %s has ABI %d, this program needs %d\n", hn_version(),
            (int)hn_abi_version(), HN_ABI_VERSION);
    return 1;
  }
  CHECK(hn_runtime_create(&runtime));
  CHECK(hn_runtime_add_driver(runtime, "cpu", NULL, &cpu));
  printf("embed_c: hybridnn %s (ABI %d) on %s\n", hn_version(), (int)hn_abi_version(),
         hn_driver_description(cpu));
  failed = conv_kernel(cpu) || small_net(runtime, cpu);
  hn_driver_destroy(cpu);
  hn_runtime_destroy(runtime);
  return failed;
}
