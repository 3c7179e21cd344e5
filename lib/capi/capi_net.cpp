// The C ABI's nets (hn_net_options_*, hn_net_*): made from a prototxt file or text, run,
// saved, and their layers, blobs and parameters named and reached.
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/core/text.h"
#include "lib/net/net.h"

// ---- nets -------------------------------------------------------------------------------

struct hn_net_options {
  hn::NetOptions options;
  std::string weights;
};

namespace {

// Copies weights into `net` from each .caffemodel of a comma-separated list, a missing
// file being HN_ERROR_NOT_FOUND.
void copy_weights(hn::Net& net, const std::string& paths, const char* what) {
  for (const std::string& path : hn::detail::split_commas(paths, hn::detail::EmptyItems::drop)) {
    check_file(path, what);
    net.copy_trained_layers_from(path);
  }
}

hn::Net& net_of(const hn_net* net, const char* what) {
  return *checked(net, what).box->net;
}

hn_status make_net(hn_runtime* runtime, hn_driver* driver, const std::string& origin,
                   const std::string* text, const hn_net_options* options, hn_net** out,
                   const char* what) {
  return guarded([&] {
    RuntimeBox& runtime_box = *checked(runtime, what).box;
    hn_driver& home = checked(driver, what);
    if (home.box != runtime->box) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("{}: driver {} belongs to another runtime", what, home.name));
    }
    const hn_net_options defaults;
    const hn_net_options& chosen = options != nullptr ? *options : defaults;
    std::unique_ptr<hn::Net> net;
    if (text != nullptr) {
      net = hn::Net::from_text(*text, origin, runtime_box.runtime, *home.driver, chosen.options);
    } else {
      check_file(origin, what);
      net = std::make_unique<hn::Net>(origin, runtime_box.runtime, *home.driver, chosen.options);
    }
    copy_weights(*net, chosen.weights, what);
    auto box = std::make_shared<NetBox>();
    box->keep = runtime->box;
    box->net = net.get();
    box->name = net->name();
    box->own = std::move(net);
    set_out(out, owned(new hn_net{std::move(box)}), what);
  });
}

const char* layer_text(const hn_net* net, int32_t index, const char* what,
                       const char* (*get)(hn::Net&, int)) {
  return value_or<const char*>(nullptr, [&] {
    hn::Net& n = net_of(net, what);
    if (index < 0 || index >= n.num_layers()) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: net '{}' has {} layers, not {}", what,
                                                  n.name(), n.num_layers(), index));
    }
    return get(n, index);
  });
}

}  // namespace

extern "C" {

hn_status hn_net_options_create(hn_net_options** out) {
  return guarded([&] { set_out(out, owned(new hn_net_options), "hn_net_options_create"); });
}

void hn_net_options_destroy(hn_net_options* options) {
  delete options;
}

hn_status hn_net_options_set(hn_net_options* options, const char* key, const char* value) {
  return guarded([&] {
    hn_net_options& o = checked(options, "hn_net_options_set");
    const std::string k = checked_text(key, "hn_net_options_set: key");
    const std::string v = checked_text(value, "hn_net_options_set: value");
    if (k == "weights") {  // the C ABI's own: loaded after the net is built
      o.weights = v;
      return;
    }
    if (!set_option_text(o.options, k, v)) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_net_options_set: unknown option '{}' (options: {}, weights)", k,
                       hn::option_keys(hn::kNetOption)));
    }
  });
}

hn_status hn_net_create(hn_runtime* runtime, hn_driver* driver, const char* prototxt_path,
                        const hn_net_options* options, hn_net** out) {
  if (prototxt_path == nullptr) {
    last_error = "hn_net_create: NULL path";
    return HN_ERROR_INVALID_ARGUMENT;
  }
  return make_net(runtime, driver, prototxt_path, nullptr, options, out, "hn_net_create");
}

hn_status hn_net_create_from_text(hn_runtime* runtime, hn_driver* driver, const char* prototxt_text,
                                  const char* origin, const hn_net_options* options, hn_net** out) {
  if (prototxt_text == nullptr) {
    last_error = "hn_net_create_from_text: NULL text";
    return HN_ERROR_INVALID_ARGUMENT;
  }
  const std::string text = prototxt_text;
  return make_net(runtime, driver, origin != nullptr ? origin : "<text>", &text, options, out,
                  "hn_net_create_from_text");
}

void hn_net_destroy(hn_net* net) {
  delete net;
}

const char* hn_net_name(const hn_net* net) {
  return net != nullptr ? net->box->name.c_str() : "";
}

hn_status hn_net_forward(hn_net* net, float* loss) {
  return guarded([&] {
    const float value = net_of(net, "hn_net_forward").forward();
    if (loss != nullptr) *loss = value;
  });
}

hn_status hn_net_backward(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_backward").backward(); });
}

hn_status hn_net_clear_param_diffs(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_clear_param_diffs").clear_param_diffs(); });
}

hn_status hn_net_copy_from(hn_net* net, const char* caffemodel_paths) {
  return guarded([&] {
    hn::Net& n = net_of(net, "hn_net_copy_from");
    copy_weights(n, checked_text(caffemodel_paths, "hn_net_copy_from"), "hn_net_copy_from");
  });
}

hn_status hn_net_save(hn_net* net, const char* caffemodel_path) {
  return guarded(
      [&] { net_of(net, "hn_net_save").save(checked_text(caffemodel_path, "hn_net_save")); });
}

hn_status hn_net_save_onnx(hn_net* net, const char* onnx_path) {
  return guarded([&] {
    net_of(net, "hn_net_save_onnx").save_onnx(checked_text(onnx_path, "hn_net_save_onnx"));
  });
}

int32_t hn_net_num_layers(const hn_net* net) {
  return net != nullptr ? net->box->net->num_layers() : 0;
}

const char* hn_net_layer_name(const hn_net* net, int32_t index) {
  return layer_text(net, index, "hn_net_layer_name",
                    [](hn::Net& n, int i) { return n.layer_name(i).c_str(); });
}

const char* hn_net_layer_type(const hn_net* net, int32_t index) {
  return layer_text(net, index, "hn_net_layer_type",
                    [](hn::Net& n, int i) { return n.layer_type(i); });
}

const char* hn_net_layer_split(hn_net* net, int32_t index) {
  return value_or<const char*>(nullptr, [&] {
    hn::Net& n = net_of(net, "hn_net_layer_split");
    if (index < 0 || index >= n.num_layers()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_net_layer_split: net '{}' has {} layers, not {}", n.name(),
                       n.num_layers(), index));
    }
    std::string text;
    for (const auto& [layer, split] : n.layer_splits()) {
      if (layer == n.layer_name(index)) text = split.to_string();
    }
    std::string& kept = net->box->layer_splits[index];
    kept = std::move(text);
    return kept.c_str();
  });
}

const char* hn_net_blob_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->blob_names = joined(net_of(net, "hn_net_blob_names").blob_names());
    return net->box->blob_names.c_str();
  });
}

const char* hn_net_input_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->input_names = joined(net_of(net, "hn_net_input_names").input_blob_names());
    return net->box->input_names.c_str();
  });
}

const char* hn_net_output_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->output_names = joined(net_of(net, "hn_net_output_names").output_blob_names());
    return net->box->output_names.c_str();
  });
}

hn_status hn_net_blob(hn_net* net, const char* name, hn_tensor** out) {
  return guarded([&] {
    hn::Net& n = net_of(net, "hn_net_blob");
    const std::string blob = checked_text(name, "hn_net_blob: name");
    if (!n.has_blob(blob)) {
      fail(HN_ERROR_NOT_FOUND, fmt::format("hn_net_blob: net '{}' has no blob '{}' (blobs: {})",
                                           n.name(), blob, joined(n.blob_names())));
    }
    const hn::BlobRef ref = n.blob(blob);
    hn_tensor* tensor = synced_tensor(net->box, ref.shape, ref.data, ref.diff, ref.layout);
    tensor->check_holds = [&n, blob](bool diff) { n.check_blob_holds(blob, diff); };
    set_out(out, owned(tensor), "hn_net_blob");
  });
}

int32_t hn_net_num_params(const hn_net* net) {
  return net != nullptr ? static_cast<int32_t>(net->box->net->learnable_params().size()) : 0;
}

}  // extern "C"

namespace {

const hn::NetParam& net_param(const hn_net* net, int32_t index, const char* what) {
  const std::vector<hn::NetParam>& params = net_of(net, what).learnable_params();
  if (index < 0 || index >= static_cast<int32_t>(params.size())) {
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: net '{}' has {} parameters, not {}", what,
                                                net->box->name, params.size(), index));
  }
  return params[static_cast<std::size_t>(index)];
}

}  // namespace

extern "C" {

const char* hn_net_param_name(const hn_net* net, int32_t index) {
  return value_or<const char*>(
      nullptr, [&] { return net_param(net, index, "hn_net_param_name").name.c_str(); });
}

hn_status hn_net_param(hn_net* net, int32_t index, hn_tensor** out) {
  return guarded([&] {
    const hn::NetParam& param = net_param(net, index, "hn_net_param");
    set_out(out, owned(tensor_of(net->box, *param.tensor)), "hn_net_param");
  });
}

hn_status hn_net_calibrate_splits(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_calibrate_splits").calibrate_splits(); });
}

}  // extern "C"
