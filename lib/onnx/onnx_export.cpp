// NetParameter (with weights) -> ONNX ModelProto, opset 13: one function per layer type (in
// one table, kLayers), each writing the nodes and initializers of its layer. A parameter a
// function does not map is an error naming the layer, never dropped.
#include "lib/onnx/onnx_export.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/files.h"
#include "lib/core/version.h"
#include "lib/onnx/onnx_pad.h"

#if HYBRIDNN_WITH_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace hn::detail {

namespace pb = hybridnn::proto;

#if !HYBRIDNN_WITH_ONNX

OnnxExport write_onnx_model(const pb::NetParameter&,
                            const std::map<std::string, std::vector<std::int64_t>>&,
                            const std::string& path, const std::string&) {
  fail(
      "{}: this build of hybridnn writes no ONNX files: it was built without libonnx-dev "
      "(scripts/setup.sh installs it; then rebuild)",
      path);
}

#else

namespace {

using Dims = std::vector<std::int64_t>;
using Shapes = std::map<std::string, Dims>;
constexpr std::int64_t kOpset = 13;

class Exporter;
using LayerWriter = void (*)(Exporter&);

class Exporter {
 public:
  Exporter(const pb::NetParameter& net, const Shapes& shapes, std::string origin)
      : net_(net), shapes_(shapes), origin_(std::move(origin)) {}

  OnnxExport run(onnx::ModelProto& model);

  // ---- what the layer writers use ----------------------------------------------------
  const pb::LayerParameter& layer() const { return net_.layer(index_); }
  template <class... Args>
  [[noreturn]] void fail_layer(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: layer '{}' ({}): {}", origin_, layer().name(), layer().type(),
         fmt::format(format, std::forward<Args>(args)...));
  }
  // The value holding bottom `i` now, and its blob's shape.
  std::string bottom(int i) const {
    if (i >= layer().bottom_size()) fail_layer("bottom {} is missing", i);
    auto found = current_.find(layer().bottom(i));
    if (found == current_.end())
      fail_layer("bottom '{}' is computed by no exported layer", layer().bottom(i));
    return found->second;
  }
  Dims shape(const std::string& blob) const {
    auto found = shapes_.find(blob);
    if (found == shapes_.end()) fail_layer("blob '{}' has no shape", blob);
    return found->second;
  }
  void bottoms(int count) const {
    if (layer().bottom_size() != count)
      fail_layer("{} bottoms; the export takes {}", layer().bottom_size(), count);
  }
  // A new value for top `i` (ONNX assigns each value once: an in-place top gets a new name).
  std::string top(int i) {
    if (i >= layer().top_size()) fail_layer("top {} is missing", i);
    const std::string& blob = layer().top(i);
    std::string name = blob;
    if (used_.count(name) > 0) name = layer().name();
    for (int n = 2; used_.count(name) > 0; ++n)
      name = fmt::format("{}_{}", layer().name(), n);
    used_.insert(name);
    current_[blob] = name;
    return name;
  }
  // Top `i` names the same value as `value` (Split, a folded layer).
  void alias_top(int i, const std::string& value) { current_[layer().top(i)] = value; }

  onnx::NodeProto& node(const char* op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& suffix = "") {
    onnx::NodeProto& n = *model_->mutable_graph()->add_node();
    n.set_op_type(op);
    n.set_name(layer().name() + suffix);
    for (const std::string& in : inputs)
      n.add_input(in);
    for (const std::string& out : outputs)
      n.add_output(out);
    return n;
  }
  // A value for a node's intermediate result.
  std::string temporary(const std::string& suffix) {
    std::string name = layer().name() + suffix;
    for (int n = 2; used_.count(name) > 0; ++n)
      name = fmt::format("{}{}_{}", layer().name(), suffix, n);
    used_.insert(name);
    return name;
  }
  static void attr(onnx::NodeProto& n, const char* name, std::int64_t value) {
    onnx::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(value);
  }
  static void attr(onnx::NodeProto& n, const char* name, float value) {
    onnx::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(onnx::AttributeProto::FLOAT);
    a.set_f(value);
  }
  static void attr(onnx::NodeProto& n, const char* name, const Dims& values) {
    onnx::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : values)
      a.add_ints(v);
  }
  static void attr(onnx::NodeProto& n, const char* name, const std::string& value) {
    onnx::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(onnx::AttributeProto::STRING);
    a.set_s(value);
  }
  // An initializer named LAYER/WHAT holding `values` in `dims`.
  std::string initializer(const std::string& what, const Dims& dims,
                          const std::vector<float>& values) {
    const std::string name = temporary("/" + what);
    onnx::TensorProto& t = *model_->mutable_graph()->add_initializer();
    t.set_name(name);
    t.set_data_type(onnx::TensorProto::FLOAT);
    for (std::int64_t d : dims)
      t.add_dims(d);
    t.set_raw_data(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return name;
  }
  std::string int64_initializer(const std::string& what, const Dims& values) {
    const std::string name = temporary("/" + what);
    onnx::TensorProto& t = *model_->mutable_graph()->add_initializer();
    t.set_name(name);
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(static_cast<std::int64_t>(values.size()));
    for (std::int64_t v : values)
      t.add_int64_data(v);
    return name;
  }
  // The layer's blob `i` (its values and shape).
  const pb::BlobProto& blob(int i, const char* what) const {
    if (i >= layer().blobs_size())
      fail_layer("has no {} (blob {}): export a Net's layers", what, i);
    return layer().blobs(i);
  }
  static Dims blob_dims(const pb::BlobProto& b) {
    if (b.has_shape()) return Dims(b.shape().dim().begin(), b.shape().dim().end());
    return {b.num(), b.channels(), b.height(), b.width()};
  }
  static std::vector<float> blob_values(const pb::BlobProto& b) {
    return std::vector<float>(b.data().begin(), b.data().end());
  }
  // The next layer, when it is a Scale that only this layer's top feeds (BatchNorm's fold).
  const pb::LayerParameter* scale_after() const;
  void skip_next() { skip_next_ = true; }
  void silence(const std::string& value) { silenced_.insert(value); }

 private:
  const pb::NetParameter& net_;
  const Shapes& shapes_;
  std::string origin_;
  onnx::ModelProto* model_ = nullptr;
  int index_ = 0;
  bool skip_next_ = false;
  std::map<std::string, std::string> current_;  // blob -> the value holding it now
  std::set<std::string> used_;                  // value and initializer names
  std::set<std::string> silenced_;              // values a Silence layer took
};

// ---- the layers --------------------------------------------------------------------------

// Caffe's one-or-per-dimension fields (pad: 3, pad_h: 9 ...) for 2 spatial dimensions.
Dims per_dim(const Dims& values, bool has_h, std::int64_t h, bool has_w, std::int64_t w,
             std::int64_t fallback) {
  if (has_h || has_w) return {has_h ? h : fallback, has_w ? w : fallback};
  if (values.empty()) return {fallback, fallback};
  if (values.size() == 1) return {values[0], values[0]};
  return {values[0], values[1]};
}
template <class Repeated>
Dims dims_of(const Repeated& values) {
  return Dims(values.begin(), values.end());
}

// Convolution: Conv; Deconvolution: ConvTranspose (the same weights' layout as Caffe's).
void write_convolution(Exporter& ex) {
  ex.bottoms(1);
  const bool transposed = ex.layer().type() == "Deconvolution";
  const pb::ConvolutionParameter& p = ex.layer().convolution_param();
  if (p.axis() != 1) ex.fail_layer("axis {}: the export reads channels at axis 1", p.axis());
  const pb::BlobProto& weights = ex.blob(0, "weights");
  const Dims w = Exporter::blob_dims(weights);
  if (w.size() != 4)
    ex.fail_layer("weights of {} dimensions: the export writes 2-D convolutions", w.size());
  const std::string x = ex.bottom(0);
  std::vector<std::string> inputs{x, ex.initializer("weight", w, Exporter::blob_values(weights))};
  if (p.bias_term()) {
    const pb::BlobProto& bias = ex.blob(1, "bias");
    inputs.push_back(ex.initializer("bias",
                                    {transposed ? static_cast<std::int64_t>(p.num_output()) : w[0]},
                                    Exporter::blob_values(bias)));
  }
  onnx::NodeProto& n = ex.node(transposed ? "ConvTranspose" : "Conv", inputs, {ex.top(0)});
  const Dims pad = per_dim(dims_of(p.pad()), p.has_pad_h(), p.pad_h(), p.has_pad_w(), p.pad_w(), 0);
  Exporter::attr(n, "kernel_shape", Dims{w[2], w[3]});
  Exporter::attr(n, "strides",
                 per_dim(dims_of(p.stride()), p.has_stride_h(), p.stride_h(), p.has_stride_w(),
                         p.stride_w(), 1));
  Exporter::attr(n, "pads", Dims{pad[0], pad[1], pad[0], pad[1]});
  Exporter::attr(n, "dilations", per_dim(dims_of(p.dilation()), false, 0, false, 0, 1));
  Exporter::attr(n, "group", static_cast<std::int64_t>(p.group()));
  if (transposed && p.output_pad_size() > 0)
    Exporter::attr(n, "output_padding", per_dim(dims_of(p.output_pad()), false, 0, false, 0, 0));
}

void write_inner_product(Exporter& ex) {
  ex.bottoms(1);
  const pb::InnerProductParameter& p = ex.layer().inner_product_param();
  const Dims in = ex.shape(ex.layer().bottom(0));
  const std::int64_t axis =
      p.axis() < 0 ? p.axis() + static_cast<std::int64_t>(in.size()) : p.axis();
  if (axis != 1) ex.fail_layer("axis {}: the export writes inner products from axis 1", p.axis());
  std::string x = ex.bottom(0);
  if (in.size() != 2) {
    const std::string flat = ex.temporary("/flatten");
    Exporter::attr(ex.node("Flatten", {x}, {flat}, "/flatten"), "axis", std::int64_t{1});
    x = flat;
  }
  const pb::BlobProto& weights = ex.blob(0, "weights");
  std::vector<std::string> inputs{
      x, ex.initializer("weight", Exporter::blob_dims(weights), Exporter::blob_values(weights))};
  if (p.bias_term()) {
    const pb::BlobProto& bias = ex.blob(1, "bias");
    inputs.push_back(ex.initializer("bias", {static_cast<std::int64_t>(bias.data_size())},
                                    Exporter::blob_values(bias)));
  }
  onnx::NodeProto& n = ex.node("Gemm", inputs, {ex.top(0)});
  // Caffe's weights are [outputs, inputs] (transposed: [inputs, outputs]).
  Exporter::attr(n, "transB", std::int64_t{p.transpose() ? 0 : 1});
}

void write_pooling(Exporter& ex) {
  ex.bottoms(1);
  const pb::PoolingParameter& p = ex.layer().pooling_param();
  if (p.pool() == pb::PoolingParameter::STOCHASTIC)
    ex.fail_layer("pool: STOCHASTIC has no ONNX operator");
  const bool max = p.pool() == pb::PoolingParameter::MAX;
  const std::string x = ex.bottom(0);
  if (p.global_pooling()) {
    ex.node(max ? "GlobalMaxPool" : "GlobalAveragePool", {x}, {ex.top(0)});
    return;
  }
  const Dims in = ex.shape(ex.layer().bottom(0)), out = ex.shape(ex.layer().top(0));
  if (in.size() != 4 || out.size() != 4) ex.fail_layer("the export writes 2-D pooling (4-D blobs)");
  const Dims kernel = per_dim(p.has_kernel_size() ? Dims{p.kernel_size()} : Dims{},
                              p.has_kernel_h(), p.kernel_h(), p.has_kernel_w(), p.kernel_w(), 1);
  const Dims stride =
      per_dim(Dims{p.stride()}, p.has_stride_h(), p.stride_h(), p.has_stride_w(), p.stride_w(), 1);
  const Dims pad = per_dim(Dims{p.pad()}, p.has_pad_h(), p.pad_h(), p.has_pad_w(), p.pad_w(), 0);
  // Caffe rounds up by default (round_mode CEIL): ceil_mode where that gave another size
  // than rounding down. Caffe keeps a last window that starts past an unpadded input;
  // ONNX drops it: refuse there.
  bool ceil = false;
  for (int a = 0; a < 2; ++a) {
    const std::int64_t floor_out = (in[a + 2] + 2 * pad[a] - kernel[a]) / stride[a] + 1;
    if (out[a + 2] == floor_out) continue;
    ceil = true;
    if (pad[0] == 0 && pad[1] == 0 && (out[a + 2] - 1) * stride[a] >= in[a + 2])
      ex.fail_layer(
          "its last window starts past the input (stride {} > kernel {}): Caffe keeps it, "
          "ONNX's rounding drops it",
          stride[a], kernel[a]);
  }
  onnx::NodeProto& n = ex.node(max ? "MaxPool" : "AveragePool", {x}, {ex.top(0)});
  Exporter::attr(n, "kernel_shape", kernel);
  Exporter::attr(n, "strides", stride);
  Exporter::attr(n, "pads", Dims{pad[0], pad[1], pad[0], pad[1]});
  Exporter::attr(n, "ceil_mode", std::int64_t{ceil ? 1 : 0});
  // Caffe's averages divide by the window with its pads (clipped at the padded edge), or
  // without them (count_include_pad false).
  if (!max)
    Exporter::attr(n, "count_include_pad",
                   std::int64_t{ex.layer().pooling_param().count_include_pad() ? 1 : 0});
}

void write_relu(Exporter& ex) {
  ex.bottoms(1);
  const float slope = ex.layer().relu_param().negative_slope();
  const std::string x = ex.bottom(0);
  if (slope == 0.0f) {
    ex.node("Relu", {x}, {ex.top(0)});
    return;
  }
  Exporter::attr(ex.node("LeakyRelu", {x}, {ex.top(0)}), "alpha", slope);
}

void write_unary(Exporter& ex) {
  ex.bottoms(1);
  const std::string x = ex.bottom(0);
  ex.node(ex.layer().type() == "Sigmoid" ? "Sigmoid" : "Tanh", {x}, {ex.top(0)});
}

// Swish: x * Sigmoid(beta * x), as PyTorch exports SiLU (read back as one Swish where beta
// is 1).
void write_swish(Exporter& ex) {
  ex.bottoms(1);
  const float beta = ex.layer().swish_param().beta();
  const std::string x = ex.bottom(0);
  std::string scaled = x;
  if (beta != 1.0f) {
    scaled = ex.temporary("/scaled");
    ex.node("Mul", {x, ex.initializer("beta", {}, {beta})}, {scaled}, "/scaled");
  }
  const std::string gate = ex.temporary("/sigmoid");
  ex.node("Sigmoid", {scaled}, {gate}, "/sigmoid");
  ex.node("Mul", {x, gate}, {ex.top(0)});
}

void write_clip(Exporter& ex) {
  ex.bottoms(1);
  const pb::ClipParameter& p = ex.layer().clip_param();
  const std::string x = ex.bottom(0);
  const std::string low = ex.initializer("min", {}, {p.min()});
  const std::string high = ex.initializer("max", {}, {p.max()});
  ex.node("Clip", {x, low, high}, {ex.top(0)});
}

void write_softmax(Exporter& ex) {
  ex.bottoms(1);
  const std::string x = ex.bottom(0);
  // Opset 13's Softmax is over one axis, as Caffe's.
  const char* op = ex.layer().type() == "LogSoftmax" ? "LogSoftmax" : "Softmax";
  Exporter::attr(ex.node(op, {x}, {ex.top(0)}), "axis",
                 static_cast<std::int64_t>(ex.layer().softmax_param().axis()));
}

// Pad: ONNX's Pad, its pads as an input (opset 11 and later), the mode as an attribute.
void write_pad(Exporter& ex) {
  ex.bottoms(1);
  const pb::PadParameter& p = ex.layer().pad_param();
  const Dims in = ex.shape(ex.layer().bottom(0));
  const auto counts = detail::pad_counts(p, static_cast<std::int64_t>(in.size()));
  if (!counts)
    ex.fail_layer(
        "pad_param (axis {}, {} pad_before, {} pad_after) does not fit a bottom of {} axes",
        p.axis(), p.pad_before_size(), p.pad_after_size(), in.size());
  Dims pads = counts->first;
  pads.insert(pads.end(), counts->second.begin(), counts->second.end());
  const std::string x = ex.bottom(0);
  const std::string pads_name = ex.int64_initializer("pads", pads);
  const std::string value = ex.initializer("value", {}, {p.value()});
  onnx::NodeProto& n = ex.node("Pad", {x, pads_name, value}, {ex.top(0)});
  if (p.mode() != "constant") Exporter::attr(n, "mode", p.mode());
}

void write_lrn(Exporter& ex) {
  ex.bottoms(1);
  const pb::LRNParameter& p = ex.layer().lrn_param();
  if (p.norm_region() != pb::LRNParameter::ACROSS_CHANNELS)
    ex.fail_layer("norm_region: WITHIN_CHANNEL has no ONNX operator");
  const std::string x = ex.bottom(0);
  onnx::NodeProto& n = ex.node("LRN", {x}, {ex.top(0)});
  Exporter::attr(n, "size", static_cast<std::int64_t>(p.local_size()));
  Exporter::attr(n, "alpha", p.alpha());
  Exporter::attr(n, "beta", p.beta());
  Exporter::attr(n, "bias", p.k());
}

void write_dropout(Exporter& ex) {
  ex.bottoms(1);
  const std::string x = ex.bottom(0);
  const std::string ratio =
      ex.initializer("ratio", {}, {ex.layer().dropout_param().dropout_ratio()});
  ex.node("Dropout", {x, ratio}, {ex.top(0)});
}

void write_concat(Exporter& ex) {
  const pb::ConcatParameter& p = ex.layer().concat_param();
  std::vector<std::string> inputs;
  for (int i = 0; i < ex.layer().bottom_size(); ++i)
    inputs.push_back(ex.bottom(i));
  const std::int64_t axis = p.has_axis() || !p.has_concat_dim() ? p.axis() : p.concat_dim();
  Exporter::attr(ex.node("Concat", inputs, {ex.top(0)}), "axis", axis);
}

// Eltwise: SUM as Adds and PROD as Muls in bottom order (the order Caffe sums in), MAX as one
// Max.
void write_eltwise(Exporter& ex) {
  const pb::EltwiseParameter& p = ex.layer().eltwise_param();
  const int count = ex.layer().bottom_size();
  if (count < 2) ex.fail_layer("{} bottoms; Eltwise takes 2 or more", count);
  std::vector<std::string> inputs;
  for (int i = 0; i < count; ++i)
    inputs.push_back(ex.bottom(i));
  if (p.operation() == pb::EltwiseParameter::SUM && count == 2 && p.coeff_size() == 2 &&
      p.coeff(0) == 1.0f && p.coeff(1) == -1.0f) {
    ex.node("Sub", inputs, {ex.top(0)});
    return;
  }
  for (float c : p.coeff())
    if (c != 1.0f)
      ex.fail_layer("coeff {}: the export writes sums with coefficients 1 (or 1, -1: a Sub)", c);
  if (p.operation() == pb::EltwiseParameter::MAX) {
    ex.node("Max", inputs, {ex.top(0)});
    return;
  }
  const char* op = p.operation() == pb::EltwiseParameter::SUM ? "Add" : "Mul";
  std::string sum = inputs[0];
  for (int i = 1; i < count; ++i) {
    const std::string out = i + 1 == count ? ex.top(0) : ex.temporary(fmt::format("/{}", i));
    ex.node(op, {sum, inputs[static_cast<std::size_t>(i)]}, {out},
            i + 1 == count ? "" : fmt::format("/{}", i));
    sum = out;
  }
}

// Flatten and Reshape: ONNX's Flatten where it is the same (2-D from axis 1), else a Reshape
// to the top's shape with the batch copied (0) where it is the bottom's.
void write_reshape(Exporter& ex) {
  ex.bottoms(1);
  const Dims in = ex.shape(ex.layer().bottom(0));
  Dims out = ex.shape(ex.layer().top(0));
  const std::string x = ex.bottom(0);
  if (ex.layer().type() == "Flatten" && out.size() == 2 && ex.layer().flatten_param().axis() == 1) {
    Exporter::attr(ex.node("Flatten", {x}, {ex.top(0)}), "axis", std::int64_t{1});
    return;
  }
  if (!in.empty() && !out.empty() && in[0] == out[0]) out[0] = 0;
  const std::string shape = ex.int64_initializer("shape", out);
  ex.node("Reshape", {x, shape}, {ex.top(0)});
}

// BatchNorm: its stored statistics (divided by the scale factor, as Caffe does), with the
// Scale layer after it folded in when only that reads it, else a factor 1 and no shift.
void write_batch_norm(Exporter& ex) {
  ex.bottoms(1);
  const pb::BlobProto &mean = ex.blob(0, "mean"), &variance = ex.blob(1, "variance"),
                      &factor = ex.blob(2, "scale factor");
  const float stored = factor.data_size() > 0 ? factor.data(0) : 1.0f;
  const float scale = stored == 0.0f ? 0.0f : 1.0f / stored;
  std::vector<float> m = Exporter::blob_values(mean), v = Exporter::blob_values(variance);
  for (float& x : m)
    x *= scale;
  for (float& x : v)
    x *= scale;
  const std::int64_t channels = static_cast<std::int64_t>(m.size());
  std::vector<float> gamma(m.size(), 1.0f), beta(m.size(), 0.0f);
  const pb::LayerParameter* after = ex.scale_after();
  if (after != nullptr) {
    const pb::BlobProto& g = after->blobs(0);
    gamma.assign(g.data().begin(), g.data().end());
    if (after->scale_param().bias_term()) {
      const pb::BlobProto& b = after->blobs(1);
      beta.assign(b.data().begin(), b.data().end());
    }
  }
  const std::string x = ex.bottom(0);
  std::vector<std::string> inputs{
      x, ex.initializer("scale", {channels}, gamma), ex.initializer("bias", {channels}, beta),
      ex.initializer("mean", {channels}, m), ex.initializer("var", {channels}, v)};
  std::string out = ex.top(0);
  onnx::NodeProto& n = ex.node("BatchNormalization", inputs, {out});
  Exporter::attr(n, "epsilon", ex.layer().batch_norm_param().eps());
  if (after != nullptr) ex.skip_next();
}

// Scale: by its blobs, a Mul and, with its bias, an Add, the blobs shaped to broadcast
// against the bottom (their axes from `axis`, then ones: ONNX aligns shapes on the right);
// by a second bottom (squeeze-and-excitation), a Reshape of it likewise and a Mul.
void write_scale(Exporter& ex) {
  const pb::ScaleParameter& p = ex.layer().scale_param();
  const Dims in = ex.shape(ex.layer().bottom(0));
  const std::int64_t rank = static_cast<std::int64_t>(in.size());
  const std::int64_t axis = p.axis() < 0 ? p.axis() + rank : p.axis();
  // The factor's axes: num_axes from `axis` (-1: to the end), or a second bottom's.
  const Dims factor =
      ex.layer().bottom_size() > 1
          ? ex.shape(ex.layer().bottom(1))
          : Dims(in.begin() + std::min(axis, rank),
                 p.num_axes() < 0 ? in.end() : in.begin() + std::min(rank, axis + p.num_axes()));
  if (axis < 0 || axis + static_cast<std::int64_t>(factor.size()) > rank)
    ex.fail_layer("axis {} with a factor of {} axes against a bottom of {}", p.axis(),
                  factor.size(), rank);
  Dims dims = factor;
  dims.resize(static_cast<std::size_t>(rank - axis), 1);
  const std::string x = ex.bottom(0);
  std::string gamma;
  if (ex.layer().bottom_size() > 1) {
    if (p.bias_term()) ex.fail_layer("a bias with a scale by a second bottom");
    // [1] * axis + its shape + ones, each of its dimensions copied (0) where it lines up
    // with the bottom's from axis 0 (the batch stays free).
    Dims shape(static_cast<std::size_t>(axis), 1);
    for (std::size_t d = 0; d < dims.size(); ++d)
      shape.push_back(axis == 0 && d < factor.size() ? 0 : dims[d]);
    const std::string factor_value = ex.bottom(1);
    gamma = ex.temporary("/factor");
    ex.node("Reshape", {factor_value, ex.int64_initializer("factor_shape", shape)}, {gamma},
            "/factor");
  } else {
    gamma = ex.initializer("scale", p.num_axes() == 0 ? Dims{} : dims,
                           Exporter::blob_values(ex.blob(0, "scale")));
  }
  if (!p.bias_term()) {
    ex.node("Mul", {x, gamma}, {ex.top(0)});
    return;
  }
  const std::string product = ex.temporary("/mul");
  ex.node("Mul", {x, gamma}, {product}, "/mul");
  const std::string beta = ex.initializer("bias", p.num_axes() == 0 ? Dims{} : dims,
                                          Exporter::blob_values(ex.blob(1, "bias")));
  ex.node("Add", {product, beta}, {ex.top(0)});
}

// Permute: Transpose, the order completed as the layer does (the axes left out follow).
void write_permute(Exporter& ex) {
  ex.bottoms(1);
  const Dims in = ex.shape(ex.layer().bottom(0));
  Dims perm;
  std::vector<bool> used(in.size(), false);
  for (std::uint32_t axis : ex.layer().permute_param().order()) {
    if (axis >= in.size() || used[axis]) ex.fail_layer("order is not a permutation");
    used[axis] = true;
    perm.push_back(axis);
  }
  for (std::size_t axis = 0; axis < in.size(); ++axis)
    if (!used[axis]) perm.push_back(static_cast<std::int64_t>(axis));
  const std::string x = ex.bottom(0);
  Exporter::attr(ex.node("Transpose", {x}, {ex.top(0)}), "perm", perm);
}

// ShuffleChannel: the bottoms joined by a Concat along the channels (more than one), then
// PyTorch's channel_shuffle: Reshape [N, g, C/g, ...], Transpose (1 2), Reshape [N, C, ...]
// (the batch copied: 0), then a Split along the channels into the tops (more than one),
// which the importer reads back as one ShuffleChannel.
void write_shuffle_channel(Exporter& ex) {
  Dims out = ex.shape(ex.layer().top(0));
  Dims sizes;  // each top's channels
  for (const std::string& top : ex.layer().top()) {
    const Dims piece = ex.shape(top);
    if (piece.size() != out.size() || piece.size() < 2)
      ex.fail_layer("tops of {} and {} axes", out.size(), piece.size());
    sizes.push_back(piece[1]);
  }
  if (out.size() >= 2) out[1] = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  const std::int64_t group = ex.layer().shuffle_channel_param().group();
  if (out.size() < 2 || group < 1 || out[1] % group != 0)
    ex.fail_layer("group {} for an output of {} axes", group, out.size());
  std::string x = ex.bottom(0);
  if (ex.layer().bottom_size() > 1) {
    std::vector<std::string> parts;
    for (int i = 0; i < ex.layer().bottom_size(); ++i)
      parts.push_back(ex.bottom(i));
    x = ex.temporary("/concat");
    Exporter::attr(ex.node("Concat", parts, {x}, "/concat"), "axis", std::int64_t{1});
  }
  Dims split = {0, group, out[1] / group}, back = {0, out[1]}, perm = {0, 2, 1};
  for (std::size_t a = 2; a < out.size(); ++a) {
    split.push_back(out[a]);
    back.push_back(out[a]);
    perm.push_back(static_cast<std::int64_t>(a + 1));
  }
  const std::string grouped = ex.temporary("/groups"), swapped = ex.temporary("/transpose");
  ex.node("Reshape", {x, ex.int64_initializer("groups_shape", split)}, {grouped}, "/groups");
  Exporter::attr(ex.node("Transpose", {grouped}, {swapped}, "/transpose"), "perm", perm);
  if (ex.layer().top_size() == 1) {
    ex.node("Reshape", {swapped, ex.int64_initializer("shape", back)}, {ex.top(0)});
    return;
  }
  const std::string shuffled = ex.temporary("/shuffled");
  ex.node("Reshape", {swapped, ex.int64_initializer("shape", back)}, {shuffled}, "/shuffled");
  std::vector<std::string> outputs;
  for (int t = 0; t < ex.layer().top_size(); ++t)
    outputs.push_back(ex.top(t));
  Exporter::attr(ex.node("Split", {shuffled, ex.int64_initializer("split", sizes)}, outputs),
                 "axis", std::int64_t{1});
}

// Slice: Split, the sizes from the tops' shapes.
void write_slice(Exporter& ex) {
  ex.bottoms(1);
  const Dims in = ex.shape(ex.layer().bottom(0));
  const pb::SliceParameter& p = ex.layer().slice_param();
  std::int64_t axis = p.has_slice_dim() ? p.slice_dim() : p.axis();
  if (axis < 0) axis += static_cast<std::int64_t>(in.size());
  Dims sizes;
  for (const std::string& top : ex.layer().top())
    sizes.push_back(ex.shape(top).at(static_cast<std::size_t>(axis)));
  const std::string x = ex.bottom(0);
  const std::string split = ex.int64_initializer("split", sizes);
  std::vector<std::string> outputs;
  for (int t = 0; t < ex.layer().top_size(); ++t)
    outputs.push_back(ex.top(t));
  Exporter::attr(ex.node("Split", {x, split}, outputs), "axis", axis);
}

// Silence: no node; the values it takes are no outputs of the graph.
void write_silence(Exporter& ex) {
  for (int i = 0; i < ex.layer().bottom_size(); ++i)
    ex.silence(ex.bottom(i));
}

void write_split(Exporter& ex) {
  ex.bottoms(1);
  const std::string x = ex.bottom(0);
  for (int i = 0; i < ex.layer().top_size(); ++i)
    ex.alias_top(i, x);
}

struct LayerEntry {
  const char* type;
  LayerWriter write;  // nullptr: left out (losses, accuracies)
};

constexpr LayerEntry kLayers[] = {
    {"Convolution", write_convolution},
    {"Deconvolution", write_convolution},
    {"InnerProduct", write_inner_product},
    {"Pooling", write_pooling},
    {"ReLU", write_relu},
    {"Sigmoid", write_unary},
    {"TanH", write_unary},
    {"Clip", write_clip},
    {"Swish", write_swish},
    {"Softmax", write_softmax},
    {"LogSoftmax", write_softmax},
    {"Pad", write_pad},
    {"LRN", write_lrn},
    {"Dropout", write_dropout},
    {"Concat", write_concat},
    {"Eltwise", write_eltwise},
    {"Flatten", write_reshape},
    {"Reshape", write_reshape},
    {"BatchNorm", write_batch_norm},
    {"Scale", write_scale},
    {"Split", write_split},
    {"Permute", write_permute},
    {"ShuffleChannel", write_shuffle_channel},
    {"Slice", write_slice},
    {"Silence", write_silence},
    {"SoftmaxWithLoss", nullptr},
    {"EuclideanLoss", nullptr},
    {"SigmoidCrossEntropyLoss", nullptr},
    {"Accuracy", nullptr},
};

const pb::LayerParameter* Exporter::scale_after() const {
  const int next = index_ + 1;
  if (next >= net_.layer_size() || layer().top_size() != 1) return nullptr;
  const pb::LayerParameter& scale = net_.layer(next);
  const std::string& blob = layer().top(0);
  if (scale.type() != "Scale" || scale.bottom_size() != 1 || scale.bottom(0) != blob ||
      scale.scale_param().axis() != 1 || scale.scale_param().num_axes() != 1 ||
      scale.blobs_size() < (scale.scale_param().bias_term() ? 2 : 1))
    return nullptr;
  // Nothing else may read the BatchNorm's own output: after the Scale, the blob must hold
  // the Scale's (in place), or no later layer read it.
  if (scale.top(0) == blob) return &scale;
  for (int l = next + 1; l < net_.layer_size(); ++l) {
    const pb::LayerParameter& later = net_.layer(l);
    if (std::find(later.bottom().begin(), later.bottom().end(), blob) != later.bottom().end())
      return nullptr;
    if (std::find(later.top().begin(), later.top().end(), blob) != later.top().end()) break;
  }
  return &scale;
}

OnnxExport Exporter::run(onnx::ModelProto& model) {
  model_ = &model;
  model.set_ir_version(7);  // opset 13's
  model.set_producer_name("hybridnn");
  model.set_producer_version(version());
  onnx::OperatorSetIdProto& set = *model.add_opset_import();
  set.set_domain("");
  set.set_version(kOpset);
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name(net_.name().empty() ? "hybridnn" : net_.name());
  OnnxExport result;
  std::vector<std::string> inputs;  // in order
  for (index_ = 0; index_ < net_.layer_size(); ++index_) {
    if (skip_next_) {
      // The Scale folded into the BatchNorm before it: its top is the BatchNorm's value.
      skip_next_ = false;
      current_[layer().top(0)] = current_.at(net_.layer(index_ - 1).top(0));
      continue;
    }
    const pb::LayerParameter& l = layer();
    if (l.bottom_size() == 0) {
      // Input and the data layers: each top an input.
      for (const std::string& blob : l.top()) {
        if (used_.count(blob) > 0) fail_layer("top '{}' is produced twice", blob);
        used_.insert(blob);
        current_[blob] = blob;
        inputs.push_back(blob);
      }
      continue;
    }
    const LayerEntry* entry = nullptr;
    for (const LayerEntry& e : kLayers)
      if (l.type() == e.type) entry = &e;
    if (entry == nullptr)
      fail_layer("has no ONNX equivalent in the export (docs/onnx.md lists the layers it writes)");
    if (entry->write == nullptr) {
      result.left_out.push_back(l.name());
      continue;
    }
    entry->write(*this);
  }
  // Inputs some node reads, outputs no node reads, in order.
  std::set<std::string> read, written;
  for (const onnx::NodeProto& n : graph.node()) {
    read.insert(n.input().begin(), n.input().end());
    written.insert(n.output().begin(), n.output().end());
  }
  // The batch: the first input's first dimension, symbolic ("N") wherever it shows first.
  std::int64_t batch = -1;
  for (const std::string& blob : inputs) {
    auto found = shapes_.find(blob);
    if (read.count(blob) > 0 && found != shapes_.end() && !found->second.empty()) {
      batch = found->second[0];
      break;
    }
  }
  const auto add_value = [&](onnx::ValueInfoProto& info, const std::string& name,
                             const std::string& blob) {
    info.set_name(name);
    onnx::TypeProto::Tensor& tensor = *info.mutable_type()->mutable_tensor_type();
    tensor.set_elem_type(onnx::TensorProto::FLOAT);
    auto found = shapes_.find(blob);
    if (found == shapes_.end()) return;
    onnx::TensorShapeProto& shape = *tensor.mutable_shape();
    for (std::size_t d = 0; d < found->second.size(); ++d) {
      if (d == 0 && found->second[0] == batch)
        shape.add_dim()->set_dim_param("N");
      else
        shape.add_dim()->set_dim_value(found->second[d]);
    }
  };
  for (const std::string& blob : inputs) {
    if (read.count(blob) == 0) continue;
    add_value(*graph.add_input(), blob, blob);
    result.inputs.push_back(blob);
  }
  if (result.inputs.empty()) fail("{}: no exported layer reads an input of the net", origin_);
  // Outputs: each blob's last value, where no node reads it (the blob names it ends under).
  std::set<std::string> done;
  for (const onnx::NodeProto& n : graph.node()) {
    for (const std::string& value : n.output()) {
      if (read.count(value) > 0 || done.count(value) > 0 || silenced_.count(value) > 0) continue;
      std::string blob = value;
      for (const auto& [name, holder] : current_)
        if (holder == value) blob = name;
      add_value(*graph.add_output(), value, blob);
      done.insert(value);
      result.outputs.push_back(value);
    }
  }
  if (result.outputs.empty()) fail("{}: the net has no layer to export", origin_);
  return result;
}

}  // namespace

OnnxExport write_onnx_model(const pb::NetParameter& net, const Shapes& shapes,
                            const std::string& path, const std::string& origin) {
  onnx::ModelProto model;
  const OnnxExport result = Exporter(net, shapes, origin).run(model);
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& failure) {
    fail("{}: the ONNX model written for {} fails ONNX's checker: {}", path, origin,
         failure.what());
  }
  std::string bytes;
  if (model.ByteSizeLong() > static_cast<std::size_t>(INT32_MAX) ||
      !model.SerializeToString(&bytes))
    fail("{}: the ONNX model of {} is over protobuf's 2 GiB: not written", path, origin);
  replace_file(path, bytes, "the ONNX export");
  return result;
}

#endif

}  // namespace hn::detail
