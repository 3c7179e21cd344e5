// The public factory functions of the layer classes (lib/layers/*.h).
#include <memory>
#include <string>
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

namespace hn {

std::unique_ptr<Layer> make_accuracy_layer(std::string name, AccuracyParams params,
                                           int num_outputs) {
  return std::make_unique<AccuracyLayer>(std::move(name), std::move(params), num_outputs);
}

std::unique_ptr<Layer> make_relu_layer(std::string name, ReluParams params) {
  return std::make_unique<ReluLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_sigmoid_layer(std::string name) {
  return std::make_unique<SigmoidLayer>(std::move(name));
}

std::unique_ptr<Layer> make_tanh_layer(std::string name) {
  return std::make_unique<TanhLayer>(std::move(name));
}

std::unique_ptr<Layer> make_clip_layer(std::string name, ClipParams params) {
  return std::make_unique<ClipLayer>(std::move(name), params);
}

std::unique_ptr<Layer> make_dropout_layer(std::string name, DropoutParams params) {
  return std::make_unique<DropoutLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_batch_norm_layer(std::string name, BatchNormParams params) {
  return std::make_unique<BatchNormLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_convolution_layer(std::string name, ConvolutionParams params) {
  return std::make_unique<ConvolutionLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_eltwise_layer(std::string name, EltwiseParams params) {
  return std::make_unique<EltwiseLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_inner_product_layer(std::string name, InnerProductParams params) {
  return std::make_unique<InnerProductLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_softmax_with_loss_layer(std::string name, SoftmaxWithLossParams params,
                                                    int num_outputs) {
  return std::make_unique<SoftmaxWithLossLayer>(std::move(name), std::move(params), num_outputs);
}

std::unique_ptr<Layer> make_euclidean_loss_layer(std::string name) {
  return std::make_unique<EuclideanLossLayer>(std::move(name));
}

std::unique_ptr<Layer> make_sigmoid_cross_entropy_loss_layer(std::string name,
                                                             SigmoidCrossEntropyLossParams params) {
  return std::make_unique<SigmoidCrossEntropyLossLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_lrn_layer(std::string name, LrnParams params) {
  return std::make_unique<LrnLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_pooling_layer(std::string name, PoolingParams params) {
  return std::make_unique<PoolingLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_scale_layer(std::string name, const ScaleParams& params) {
  return std::make_unique<ScaleLayer>(std::move(name), params);
}

std::unique_ptr<Layer> make_concat_layer(std::string name, ConcatParams params) {
  return std::make_unique<ConcatLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_slice_layer(std::string name, SliceParams params, int num_outputs) {
  return std::make_unique<SliceLayer>(std::move(name), std::move(params), num_outputs);
}

std::unique_ptr<Layer> make_split_layer(std::string name, int num_outputs) {
  return std::make_unique<SplitLayer>(std::move(name), num_outputs);
}

std::unique_ptr<Layer> make_permute_layer(std::string name, PermuteParams params) {
  return std::make_unique<PermuteLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_shuffle_channel_layer(std::string name, ShuffleChannelParams params,
                                                  int num_outputs) {
  return std::make_unique<ShuffleChannelLayer>(std::move(name), std::move(params), num_outputs);
}

std::unique_ptr<Layer> make_swish_layer(std::string name, SwishParams params) {
  return std::make_unique<SwishLayer>(std::move(name), params);
}

std::unique_ptr<Layer> make_pad_layer(std::string name, PadParams params) {
  return std::make_unique<PadLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_silence_layer(std::string name) {
  return std::make_unique<SilenceLayer>(std::move(name));
}

std::unique_ptr<Layer> make_flatten_layer(std::string name, FlattenParams params) {
  return std::make_unique<FlattenLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_reshape_layer(std::string name, ReshapeParams params) {
  return std::make_unique<ReshapeLayer>(std::move(name), std::move(params));
}

std::unique_ptr<Layer> make_softmax_layer(std::string name, SoftmaxParams params) {
  return std::make_unique<SoftmaxLayer>(std::move(name), std::move(params));
}

Lowering convolution_lowering(const Layer& layer, const Driver& driver) {
  const auto* convolution = dynamic_cast<const ConvolutionLayer*>(&layer);
  HN_CHECK(convolution != nullptr, "convolution_lowering: layer '{}' is a {}, not a Convolution",
           layer.name(), layer.type());
  return convolution->lowering_for(driver);
}

}  // namespace hn
