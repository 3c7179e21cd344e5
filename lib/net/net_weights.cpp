// The Net's weights in and out: sharing trained layers with another net, reading a
// .caffemodel (new and V1 layer formats) and writing one.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lib/net/net_impl.h"
#include "lib/onnx/onnx_export.h"

namespace hn {

void Net::share_trained_layers_with(const Net& other) {
  for (NetLayer& nl : impl_->layers) {
    if (!nl.layer) continue;
    for (const NetLayer& source : other.impl_->layers) {
      if (source.param.name() != nl.param.name() || !source.layer) continue;
      if (!nl.parts.empty() || !source.parts.empty()) {
        HN_CHECK(!nl.parts.empty() && !source.parts.empty() &&
                     nl.output_cut.to_string() == source.output_cut.to_string(),
                 "sharing weights of layer '{}': it is cut by outputs {} here but {} in net '{}'",
                 nl.param.name(), nl.parts.empty() ? "nowhere" : nl.output_cut.to_string(),
                 source.parts.empty() ? "nowhere" : source.output_cut.to_string(), other.name());
        for (std::size_t k = 0; k < nl.parts.size(); ++k) {
          for (std::size_t p = 0; p < nl.parts[k].params.size(); ++p) {
            Tensor* old = nl.parts[k].params[p];
            Tensor* shared = source.parts[k].params[p];
            nl.parts[k].params[p] = shared;
            for (NetParam& np : impl_->learnable)
              if (np.tensor == old) np.tensor = shared;
          }
        }
        continue;
      }
      HN_CHECK(source.params.size() == nl.params.size(),
               "sharing weights of layer '{}': {} parameters here, {} in net '{}'", nl.param.name(),
               nl.params.size(), source.params.size(), other.name());
      for (std::size_t p = 0; p < nl.params.size(); ++p) {
        HN_CHECK(source.params[p]->shape() == nl.params[p]->shape(),
                 "sharing weights of layer '{}': parameter {} is {} here but {} in net '{}'",
                 nl.param.name(), p, nl.params[p]->shape().to_string(),
                 source.params[p]->shape().to_string(), other.name());
        Tensor* old = nl.params[p];
        nl.params[p] = source.params[p];
        for (NetParam& np : impl_->learnable)
          if (np.tensor == old) np.tensor = source.params[p];
      }
    }
  }
}

std::vector<std::string> Net::copy_trained_layers_from(const std::string& caffemodel_path) {
  pb::NetParameter model;
  detail::read_binary_proto(caffemodel_path, model);
  return copy_trained_layers_from(model, caffemodel_path);
}

std::vector<std::string> Net::copy_trained_layers_from(const pb::NetParameter& model,
                                                       const std::string& caffemodel_path) {
  return impl_->copy_weights(model, caffemodel_path);
}

std::vector<std::string> Net::Impl::copy_weights(const pb::NetParameter& model,
                                                 const std::string& caffemodel_path) {
  std::set<std::string> copied;
  std::vector<std::string> file_layers;  // the file's layers with weights
  auto copy_layer = [&](const std::string& layer_name,
                        const google::protobuf::RepeatedPtrField<pb::BlobProto>& file_blobs) {
    if (!file_blobs.empty()) file_layers.push_back(layer_name);
    for (NetLayer& nl : layers) {
      if (nl.param.name() != layer_name || !nl.layer) continue;
      if (file_blobs.empty()) continue;
      copied.insert(layer_name);
      const bool cut = !nl.parts.empty();
      const std::size_t params = cut ? nl.owns_param.size() : nl.params.size();
      HN_CHECK(file_blobs.size() == static_cast<int>(params),
               "{}: layer '{}' has {} parameter blobs in the file but {} in the net",
               caffemodel_path, layer_name, file_blobs.size(), params);
      for (int p = 0; p < file_blobs.size(); ++p) {
        const pb::BlobProto& blob = file_blobs[p];
        // A layer cut by outputs reads the whole parameter, then gives each part its rows.
        const Shape& shape = cut ? nl.layer->params()[static_cast<std::size_t>(p)].shape()
                                 : nl.params[static_cast<std::size_t>(p)]->shape();
        HN_CHECK(detail::blob_shape_matches(blob, shape),
                 "{}: layer '{}' parameter {} is {} in the file but {} in the net", caffemodel_path,
                 layer_name, p, detail::blob_shape(blob).to_string(), shape.to_string());
        const index_t count = shape.count();
        std::vector<float> whole(cut ? static_cast<std::size_t>(count) : 0);
        float* data = cut ? whole.data() : nl.params[static_cast<std::size_t>(p)]->host_data_mut();
        if (blob.double_data_size() > 0) {
          HN_CHECK(blob.double_data_size() == count,
                   "{}: layer '{}' parameter {} holds {} values, its shape needs {}",
                   caffemodel_path, layer_name, p, blob.double_data_size(), count);
          for (index_t i = 0; i < count; ++i)
            data[i] = static_cast<float>(blob.double_data(static_cast<int>(i)));
        } else {
          HN_CHECK(blob.data_size() == count,
                   "{}: layer '{}' parameter {} holds {} values, its shape needs {}",
                   caffemodel_path, layer_name, p, blob.data_size(), count);
          std::copy(blob.data().begin(), blob.data().end(), data);
        }
        if (!cut) continue;
        for (const NetParam& np : learnable) {
          if (np.layer == layer_name && np.index == p)
            whole_to_shard(np, whole.data(), np.tensor->host_data_mut());
        }
      }
    }
  };
  for (const pb::LayerParameter& layer : model.layer())
    copy_layer(layer.name(), layer.blobs());
  for (const pb::V1LayerParameter& layer : model.layers())
    copy_layer(layer.name(), layer.blobs());
  // The net's layers with weights of their own that the file left as they were.
  std::vector<std::string> missing, with_weights;
  for (const NetLayer& nl : layers) {
    bool owns = false;
    for (std::size_t p = 0; p < nl.owns_param.size(); ++p)
      owns = owns || nl.owns_param[p];
    if (!owns) continue;
    with_weights.push_back(nl.param.name());
    if (copied.count(nl.param.name()) == 0) missing.push_back(nl.param.name());
  }
  // A file of which nothing matches is the weights of another net: training or testing
  // would go on from the initial values without a word (Caffe's silence).
  const auto listed = [](const std::vector<std::string>& names) {
    constexpr std::size_t kShown = 8;
    std::string text;
    for (std::size_t i = 0; i < names.size() && i < kShown; ++i)
      text += (i > 0 ? ", " : "") + names[i];
    if (names.size() > kShown) text += fmt::format(", ... ({} in all)", names.size());
    return text.empty() ? std::string("none") : text;
  };
  HN_CHECK(copied.size() > 0 || with_weights.empty(),
           "{}: none of its {} layers with weights ({}) is a layer of net '{}' (its layers with "
           "weights: {}); is it the weights of another net?",
           caffemodel_path, file_layers.size(), listed(file_layers), name, listed(with_weights));
  return missing;
}

pb::NetParameter Net::model_param(bool write_diff, bool splits) const {
  pb::NetParameter model;
  model.set_name(impl_->name);
  const std::vector<WholeParam> wholes = whole_params(impl_->learnable);
  for (const NetLayer& nl : impl_->layers) {
    if (nl.kind == Kind::split && !splits) continue;
    pb::LayerParameter* layer = model.add_layer();
    *layer = nl.param;
    layer->clear_blobs();
    if (!nl.parts.empty() || nl.across_ranks) {
      // Cut by outputs: each parameter whole, from the parts' rows (and across ranks, the
      // other ranks' rows).
      for (const WholeParam& whole : wholes) {
        const NetParam& first = impl_->learnable[whole.first];
        if (first.layer != nl.param.name()) continue;
        pb::BlobProto* blob = layer->add_blobs();
        for (index_t d : whole.shape.dims())
          blob->mutable_shape()->add_dim(d);
        for (const bool diff : {false, true}) {
          if (diff && !write_diff) break;
          std::vector<const float*> values;
          for (std::size_t i = whole.first; i < whole.last; ++i) {
            Tensor& tensor = *impl_->learnable[i].tensor;
            values.push_back(diff ? tensor.host_diff() : tensor.host_data());
          }
          const std::vector<float> joined = whole_values(whole, values);
          (diff ? blob->mutable_diff() : blob->mutable_data())->Add(joined.begin(), joined.end());
        }
      }
      continue;
    }
    for (Tensor* param : nl.params) {
      pb::BlobProto* blob = layer->add_blobs();
      for (index_t d : param->shape().dims())
        blob->mutable_shape()->add_dim(d);
      const float* data = param->host_data();
      blob->mutable_data()->Add(data, data + param->count());
      if (write_diff) {
        const float* diff = param->host_diff();
        blob->mutable_diff()->Add(diff, diff + param->count());
      }
    }
  }
  return model;
}

void Net::save(const std::string& caffemodel_path, bool write_diff) const {
  const pb::NetParameter model = model_param(write_diff);
  if (impl_->rank != 0 && model_parallel_ranks() > 1) return;  // across ranks: rank 0 writes
  detail::write_binary_proto(caffemodel_path, model);
}

void Net::save_onnx(const std::string& onnx_path) const {
  const pb::NetParameter model = model_param(false, true);
  if (impl_->rank != 0 && model_parallel_ranks() > 1) return;  // across ranks: rank 0 writes
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const BlobVersion& blob : impl_->blobs)
    shapes[blob.name] =
        std::vector<std::int64_t>(blob.shape.dims().begin(), blob.shape.dims().end());
  detail::write_onnx_model(model, shapes, onnx_path, fmt::format("net '{}'", impl_->name));
}

}  // namespace hn
