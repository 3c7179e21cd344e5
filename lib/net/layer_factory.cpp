// Caffe LayerParameter -> hybridnn layer. Each converter reads `has_*` where Caffe does, since
// our params structs cannot tell "unset" from "set to the default" for every field.
#include "lib/net/layer_factory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <string_view>
#include <utility>

#include "lib/core/check.h"
#include "lib/layers/accuracy_layer.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/batch_norm_layer.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/eltwise_layer.h"
#include "lib/layers/inner_product_layer.h"
#include "lib/layers/loss_layer.h"
#include "lib/layers/lrn_layer.h"
#include "lib/layers/pooling_layer.h"
#include "lib/layers/scale_layer.h"
#include "lib/layers/shape_layer.h"
#include "lib/layers/softmax_layer.h"

namespace hn::detail {
namespace {

namespace pb = hybridnn::proto;
using LayerPtr = std::unique_ptr<Layer>;

std::string who(const pb::LayerParameter& p) {
  return fmt::format("layer '{}' ({})", p.name(), p.type());
}

// uint32 fields that Caffe casts to int32 (concat_dim, slice_dim, top_k).
int to_int(const pb::LayerParameter& p, const char* field, std::uint32_t value) {
  HN_CHECK(value <= static_cast<std::uint32_t>(INT_MAX), "{}: {} {} does not fit an int32", who(p),
           field, value);
  return static_cast<int>(value);
}

template <class Repeated>
std::vector<index_t> to_indices(const Repeated& values) {
  return std::vector<index_t>(values.begin(), values.end());
}

// Outputs of a layer whose output count follows its tops; a LayerParameter without tops (built
// in code) gets the layer's own default.
int outputs_or(const pb::LayerParameter& p, int fallback) {
  return p.top_size() > 0 ? p.top_size() : fallback;
}

LossParams loss_params(const pb::LayerParameter& p) {
  const pb::LossParameter& l = p.loss_param();
  LossParams out;
  if (l.has_ignore_label()) out.ignore_label = l.ignore_label();
  if (l.has_normalize()) out.normalize = l.normalize();
  if (l.has_normalization()) {
    switch (l.normalization()) {
      case pb::LossParameter::FULL:
        out.normalization = LossNormalization::full;
        break;
      case pb::LossParameter::VALID:
        out.normalization = LossNormalization::valid;
        break;
      case pb::LossParameter::BATCH_SIZE:
        out.normalization = LossNormalization::batch_size;
        break;
      case pb::LossParameter::NONE:
        out.normalization = LossNormalization::none;
        break;
    }
  }
  return out;
}

// Scale's fillers run inside the layer, which knows constants only.
float constant_filler(const pb::LayerParameter& p, const char* field,
                      const pb::FillerParameter& filler) {
  HN_CHECK(filler.type() == "constant",
           "{}: {} type '{}' is not supported (Scale takes constant fillers only)", who(p), field,
           filler.type());
  return filler.value();
}

LayerPtr make_accuracy(const pb::LayerParameter& p) {
  const pb::AccuracyParameter& a = p.accuracy_param();
  AccuracyParams params;
  params.top_k = to_int(p, "top_k", a.top_k());
  params.axis = a.axis();
  if (a.has_ignore_label()) params.ignore_label = a.ignore_label();
  return std::make_unique<AccuracyLayer>(p.name(), params, outputs_or(p, 1));
}

LayerPtr make_batch_norm(const pb::LayerParameter& p) {
  const pb::BatchNormParameter& b = p.batch_norm_param();
  BatchNormParams params;
  if (b.has_use_global_stats()) params.use_global_stats = b.use_global_stats();
  params.moving_average_fraction = b.moving_average_fraction();
  params.eps = b.eps();
  return std::make_unique<BatchNormLayer>(p.name(), params);
}

LayerPtr make_concat(const pb::LayerParameter& p) {
  const pb::ConcatParameter& c = p.concat_param();
  HN_CHECK(!(c.has_axis() && c.has_concat_dim()),
           "{}: give either axis or concat_dim, not both (axis {}, concat_dim {})", who(p),
           c.axis(), c.concat_dim());
  ConcatParams params;
  params.axis = c.axis();
  if (c.has_concat_dim()) params.concat_dim = to_int(p, "concat_dim", c.concat_dim());
  return std::make_unique<ConcatLayer>(p.name(), params);
}

LayerPtr make_convolution(const pb::LayerParameter& p) {
  const pb::ConvolutionParameter& c = p.convolution_param();
  // Inputs are N x C x H x W: axis -3 is axis 1 (Caffe's CanonicalAxisIndex).
  HN_CHECK(c.axis() == 1 || c.axis() == -3,
           "{}: axis {} is not supported (channels must be axis 1 of the 4-D input)", who(p),
           c.axis());
  ConvolutionParams params;
  params.num_output = c.num_output();
  params.bias_term = c.bias_term();
  params.kernel_size = to_indices(c.kernel_size());
  params.stride = to_indices(c.stride());
  params.pad = to_indices(c.pad());
  params.dilation = to_indices(c.dilation());
  // As Caffe: either of an _h/_w pair selects that form, the other taking its proto default.
  if (c.has_kernel_h() || c.has_kernel_w()) {
    params.kernel_h = c.kernel_h();
    params.kernel_w = c.kernel_w();
  }
  if (c.has_stride_h() || c.has_stride_w()) {
    params.stride_h = c.stride_h();
    params.stride_w = c.stride_w();
  }
  if (c.has_pad_h() || c.has_pad_w()) {
    params.pad_h = c.pad_h();
    params.pad_w = c.pad_w();
  }
  params.group = c.group();
  return std::make_unique<ConvolutionLayer>(p.name(), std::move(params));
}

LayerPtr make_dropout(const pb::LayerParameter& p) {
  DropoutParams params;
  params.dropout_ratio = p.dropout_param().dropout_ratio();
  return std::make_unique<DropoutLayer>(p.name(), params);
}

LayerPtr make_eltwise(const pb::LayerParameter& p) {
  const pb::EltwiseParameter& e = p.eltwise_param();
  EltwiseParams params;
  switch (e.operation()) {
    case pb::EltwiseParameter::PROD:
      params.operation = EltwiseOp::prod;
      break;
    case pb::EltwiseParameter::SUM:
      params.operation = EltwiseOp::sum;
      break;
    case pb::EltwiseParameter::MAX:
      params.operation = EltwiseOp::max;
      break;
  }
  params.coeff.assign(e.coeff().begin(), e.coeff().end());
  params.stable_prod_grad = e.stable_prod_grad();
  return std::make_unique<EltwiseLayer>(p.name(), std::move(params));
}

LayerPtr make_euclidean_loss(const pb::LayerParameter& p) {
  return std::make_unique<EuclideanLossLayer>(p.name());
}

LayerPtr make_flatten(const pb::LayerParameter& p) {
  FlattenParams params;
  params.axis = p.flatten_param().axis();
  params.end_axis = p.flatten_param().end_axis();
  return std::make_unique<FlattenLayer>(p.name(), params);
}

LayerPtr make_inner_product(const pb::LayerParameter& p) {
  const pb::InnerProductParameter& ip = p.inner_product_param();
  InnerProductParams params;
  params.num_output = ip.num_output();
  params.bias_term = ip.bias_term();
  params.axis = ip.axis();
  params.transpose = ip.transpose();
  return std::make_unique<InnerProductLayer>(p.name(), params);
}

LayerPtr make_lrn(const pb::LayerParameter& p) {
  const pb::LRNParameter& l = p.lrn_param();
  LrnParams params;
  params.local_size = l.local_size();
  params.alpha = l.alpha();
  params.beta = l.beta();
  params.k = l.k();
  params.norm_region = l.norm_region() == pb::LRNParameter::WITHIN_CHANNEL
                           ? LrnRegion::within_channel
                           : LrnRegion::across_channels;
  return std::make_unique<LrnLayer>(p.name(), params);
}

LayerPtr make_pooling(const pb::LayerParameter& p) {
  const pb::PoolingParameter& q = p.pooling_param();
  // PoolingParams marks an unset _h/_w form by 0, so Caffe's presence rules are checked here.
  if (q.global_pooling()) {
    HN_CHECK(!(q.has_kernel_size() || q.has_kernel_h() || q.has_kernel_w()),
             "{}: with global_pooling, kernel_size, kernel_h and kernel_w must not be set", who(p));
  } else {
    HN_CHECK(q.has_kernel_size() != (q.has_kernel_h() && q.has_kernel_w()),
             "{}: kernel is kernel_size OR kernel_h and kernel_w; not both", who(p));
    HN_CHECK(q.has_kernel_size() || (q.has_kernel_h() && q.has_kernel_w()),
             "{}: kernel_size, or kernel_h and kernel_w, is required", who(p));
  }
  HN_CHECK((!q.has_pad() && q.has_pad_h() && q.has_pad_w()) || (!q.has_pad_h() && !q.has_pad_w()),
           "{}: pad is pad OR pad_h and pad_w", who(p));
  HN_CHECK((!q.has_stride() && q.has_stride_h() && q.has_stride_w()) ||
               (!q.has_stride_h() && !q.has_stride_w()),
           "{}: stride is stride OR stride_h and stride_w", who(p));

  PoolingParams params;
  switch (q.pool()) {
    case pb::PoolingParameter::MAX:
      params.pool = PoolMethod::max;
      break;
    case pb::PoolingParameter::AVE:
      params.pool = PoolMethod::ave;
      break;
    case pb::PoolingParameter::STOCHASTIC:
      fail("{}: pool STOCHASTIC is not supported (MAX and AVE are)", who(p));
  }
  params.global_pooling = q.global_pooling();
  params.ceil_mode = q.round_mode() == pb::PoolingParameter::CEIL;
  params.kernel_size = q.kernel_size();
  if (q.has_kernel_h()) params.kernel_h = q.kernel_h();
  if (q.has_kernel_w()) params.kernel_w = q.kernel_w();
  params.stride = q.stride();
  if (q.has_stride_h()) params.stride_h = q.stride_h();
  if (q.has_stride_w()) params.stride_w = q.stride_w();
  params.pad = q.pad();
  if (q.has_pad_h()) params.pad_h = q.pad_h();
  if (q.has_pad_w()) params.pad_w = q.pad_w();
  return std::make_unique<PoolingLayer>(p.name(), params);
}

LayerPtr make_relu(const pb::LayerParameter& p) {
  ReluParams params;
  params.negative_slope = p.relu_param().negative_slope();
  return std::make_unique<ReluLayer>(p.name(), params);
}

LayerPtr make_reshape(const pb::LayerParameter& p) {
  const pb::ReshapeParameter& r = p.reshape_param();
  // No shape: no dimensions, as in Caffe (axis and num_axes then remove axes).
  ReshapeParams params;
  params.shape = to_indices(r.shape().dim());
  params.axis = r.axis();
  params.num_axes = r.num_axes();
  return std::make_unique<ReshapeLayer>(p.name(), std::move(params));
}

LayerPtr make_scale(const pb::LayerParameter& p) {
  const pb::ScaleParameter& s = p.scale_param();
  ScaleParams params;
  params.axis = s.axis();
  params.num_axes = s.num_axes();
  params.bias_term = s.bias_term();
  // Without a filler Caffe starts the scale at 1 and the bias at 0: the structs' defaults.
  if (s.has_filler()) params.filler_value = constant_filler(p, "filler", s.filler());
  if (s.has_bias_filler()) {
    params.bias_filler_value = constant_filler(p, "bias_filler", s.bias_filler());
  }
  return std::make_unique<ScaleLayer>(p.name(), params);
}

LayerPtr make_sigmoid(const pb::LayerParameter& p) {
  return std::make_unique<SigmoidLayer>(p.name());
}

LayerPtr make_sigmoid_cross_entropy_loss(const pb::LayerParameter& p) {
  SigmoidCrossEntropyLossParams params;
  params.loss_param = loss_params(p);
  return std::make_unique<SigmoidCrossEntropyLossLayer>(p.name(), params);
}

LayerPtr make_slice(const pb::LayerParameter& p) {
  const pb::SliceParameter& s = p.slice_param();
  HN_CHECK(!(s.has_axis() && s.has_slice_dim()),
           "{}: give either axis or slice_dim, not both (axis {}, slice_dim {})", who(p), s.axis(),
           s.slice_dim());
  SliceParams params;
  params.axis = s.axis();
  if (s.has_slice_dim()) params.slice_dim = to_int(p, "slice_dim", s.slice_dim());
  params.slice_point = to_indices(s.slice_point());
  return std::make_unique<SliceLayer>(p.name(), std::move(params), p.top_size());
}

LayerPtr make_softmax(const pb::LayerParameter& p) {
  SoftmaxParams params;
  params.axis = p.softmax_param().axis();
  return std::make_unique<SoftmaxLayer>(p.name(), params);
}

LayerPtr make_softmax_with_loss(const pb::LayerParameter& p) {
  SoftmaxWithLossParams params;
  params.axis = p.softmax_param().axis();
  params.loss_param = loss_params(p);
  return std::make_unique<SoftmaxWithLossLayer>(p.name(), params, outputs_or(p, 1));
}

LayerPtr make_split(const pb::LayerParameter& p) {
  return std::make_unique<SplitLayer>(p.name(), p.top_size());
}

LayerPtr make_tanh(const pb::LayerParameter& p) {
  return std::make_unique<TanhLayer>(p.name());
}

struct Entry {
  std::string_view type;
  LayerPtr (*make)(const pb::LayerParameter&);
};

// Sorted by type, so known_layer_types() lists them in order.
constexpr std::array<Entry, 21> kLayers{{
    {"Accuracy", make_accuracy},
    {"BatchNorm", make_batch_norm},
    {"Concat", make_concat},
    {"Convolution", make_convolution},
    {"Dropout", make_dropout},
    {"Eltwise", make_eltwise},
    {"EuclideanLoss", make_euclidean_loss},
    {"Flatten", make_flatten},
    {"InnerProduct", make_inner_product},
    {"LRN", make_lrn},
    {"Pooling", make_pooling},
    {"ReLU", make_relu},
    {"Reshape", make_reshape},
    {"Scale", make_scale},
    {"Sigmoid", make_sigmoid},
    {"SigmoidCrossEntropyLoss", make_sigmoid_cross_entropy_loss},
    {"Slice", make_slice},
    {"Softmax", make_softmax},
    {"SoftmaxWithLoss", make_softmax_with_loss},
    {"Split", make_split},
    {"TanH", make_tanh},
}};

// Caffe's layers that take no bottoms and produce the net's inputs.
constexpr std::array<std::string_view, 7> kDataLayers{
    "Data", "DummyData", "HDF5Data", "ImageData", "Input", "MemoryData", "WindowData"};

}  // namespace

std::unique_ptr<Layer> make_layer(const hybridnn::proto::LayerParameter& param) {
  const std::string& type = param.type();
  for (const Entry& entry : kLayers) {
    if (entry.type == type) return entry.make(param);
  }
  HN_CHECK(!is_data_layer_type(type), "layer '{}': type '{}' is a data layer, handled by the Net",
           param.name(), type);
  fail("layer '{}': unknown layer type '{}'; known types: {}", param.name(), type,
       fmt::join(known_layer_types(), ", "));
}

std::vector<std::string> known_layer_types() {
  std::vector<std::string> types;
  types.reserve(kLayers.size());
  for (const Entry& entry : kLayers)
    types.emplace_back(entry.type);
  return types;
}

bool is_data_layer_type(const std::string& type) {
  return std::find(kDataLayers.begin(), kDataLayers.end(), type) != kDataLayers.end();
}

}  // namespace hn::detail
