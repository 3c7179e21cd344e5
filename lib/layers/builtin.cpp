// The built-in layer types: one line each below (its entry is made in the layer's own
// file, lib/layers/NAME.cpp, with the converter from Caffe's LayerParameter and the type's
// traits). A new layer is its files plus its line here.
#include <vector>

#include "lib/layers/registry.h"

namespace hn {

LayerType accuracy_layer_type();
LayerType batch_norm_layer_type();
LayerType clip_layer_type();
LayerType concat_layer_type();
LayerType convolution_layer_type();
LayerType deconvolution_layer_type();
LayerType dropout_layer_type();
LayerType eltwise_layer_type();
LayerType euclidean_loss_layer_type();
LayerType flatten_layer_type();
LayerType inner_product_layer_type();
LayerType lrn_layer_type();
LayerType pad_layer_type();
LayerType permute_layer_type();
LayerType pooling_layer_type();
LayerType relu_layer_type();
LayerType reshape_layer_type();
LayerType scale_layer_type();
LayerType sigmoid_layer_type();
LayerType sigmoid_cross_entropy_loss_layer_type();
LayerType shuffle_channel_layer_type();
LayerType silence_layer_type();
LayerType swish_layer_type();
LayerType slice_layer_type();
LayerType softmax_layer_type();
LayerType log_softmax_layer_type();
LayerType softmax_with_loss_layer_type();
LayerType split_layer_type();
LayerType tanh_layer_type();

namespace detail {

std::vector<LayerType> builtin_layer_types() {
  return {
      accuracy_layer_type(),
      batch_norm_layer_type(),
      clip_layer_type(),
      concat_layer_type(),
      convolution_layer_type(),
      deconvolution_layer_type(),
      dropout_layer_type(),
      eltwise_layer_type(),
      euclidean_loss_layer_type(),
      flatten_layer_type(),
      inner_product_layer_type(),
      lrn_layer_type(),
      pad_layer_type(),
      permute_layer_type(),
      pooling_layer_type(),
      relu_layer_type(),
      reshape_layer_type(),
      scale_layer_type(),
      sigmoid_layer_type(),
      sigmoid_cross_entropy_loss_layer_type(),
      shuffle_channel_layer_type(),
      silence_layer_type(),
      slice_layer_type(),
      softmax_layer_type(),
      softmax_with_loss_layer_type(),
      log_softmax_layer_type(),
      split_layer_type(),
      swish_layer_type(),
      tanh_layer_type(),
  };
}

}  // namespace detail
}  // namespace hn
