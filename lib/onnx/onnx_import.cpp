// ONNX ModelProto -> NetParameter: one converter per operator, in one table (kOperators);
// each reads the attributes it understands, and an attribute it does not read is an error,
// so that nothing the model asks for is silently dropped.
#include "lib/onnx/onnx_import.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/files.h"
#include "lib/core/memory.h"
#include "lib/onnx/onnx_convert.h"
#include "lib/onnx/onnx_pad.h"
#include "lib/proto/prototxt.h"

#if HYBRIDNN_WITH_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace hn::detail {

namespace pb = hybridnn::proto;

bool is_onnx_path(const std::string& path) {
  constexpr std::string_view kExtension = ".onnx";
  if (path.size() < kExtension.size()) return false;
  for (std::size_t i = 0; i < kExtension.size(); ++i) {
    const char c = path[path.size() - kExtension.size() + i];
    if (std::tolower(static_cast<unsigned char>(c)) != kExtension[i]) return false;
  }
  return true;
}

#if !HYBRIDNN_WITH_ONNX

bool onnx_supported() {
  return false;
}

OnnxModel read_onnx_model(const std::string& path) {
  fail(
      "{}: this build of hybridnn reads no ONNX files: it was built without libonnx-dev "
      "(scripts/setup.sh installs it; then rebuild)",
      path);
}

#else

bool onnx_supported() {
  return true;
}

namespace {

constexpr std::int64_t kMinOpset = 7, kMaxOpset = 17;
// Bounds far above any real model's, so that every size computed from them fits.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;        // a graph input's dimension
constexpr std::int64_t kMaxAttribute = std::int64_t{1} << 20;  // a kernel, stride, pad, ...
using Dims = std::vector<std::int64_t>;  // -1: not known (a symbolic dimension)

// "[2, ?, 3]" (? unknown); past 8 dimensions, "..., (N dimensions)".
std::string dims_text(const Dims& dims) {
  constexpr std::size_t kShown = 8;
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size() && i < kShown; ++i)
    text += (i > 0 ? ", " : "") + (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  if (dims.size() > kShown) text += fmt::format(", ... ({} dimensions)", dims.size());
  return text + "]";
}

// A constant value: an initializer or a Constant node's tensor, read once.
// An integer tensor folded at import: its shape and values (row-major).
struct Ints {
  Dims dims;
  std::vector<std::int64_t> values;
};
// The symbolic batch in a folded shape.
constexpr std::int64_t kBatch = std::numeric_limits<std::int64_t>::min();

struct Constant {
  const onnx::TensorProto* tensor = nullptr;
  Dims dims;
  bool from_node = false;  // a Constant node's value (not an initializer: never trained)
};

class Importer;
using Converter = void (*)(Importer&);

// One node being converted: what errors name, and which attributes the converter read.
struct NodeState {
  const onnx::NodeProto* proto = nullptr;
  int index = 0;
  std::string name;  // the layer name
  std::set<std::string> read;
};

class Importer {
 public:
  Importer(std::string path, onnx::ModelProto& model) : path_(std::move(path)), model_(model) {}

  OnnxModel run();

  // ---- what converters use -----------------------------------------------------------
  const onnx::NodeProto& node() const { return *node_.proto; }
  // "FILE: node 'NAME' (#INDEX, OPTYPE)".
  std::string where() const {
    return fmt::format("{}: node '{}' (#{}, {})", path_, node_.proto->name(), node_.index,
                       node_.proto->op_type());
  }
  template <class... Args>
  [[noreturn]] void fail_node(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}", where(), fmt::format(format, std::forward<Args>(args)...));
  }
  std::int64_t opset() const { return opset_; }

  // Attributes: each read marks it as understood.
  const onnx::AttributeProto* attribute(const std::string& name) {
    node_.read.insert(name);
    for (const onnx::AttributeProto& a : node().attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  std::int64_t attr_int(const std::string& name, std::int64_t fallback) {
    const onnx::AttributeProto* a = attribute(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INT) fail_node("attribute '{}' is not an int", name);
    return a->i();
  }
  float attr_float(const std::string& name, float fallback) {
    const onnx::AttributeProto* a = attribute(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::FLOAT) fail_node("attribute '{}' is not a float", name);
    return a->f();
  }
  std::string attr_string(const std::string& name, const std::string& fallback) {
    const onnx::AttributeProto* a = attribute(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::STRING)
      fail_node("attribute '{}' is not a string", name);
    return a->s();
  }
  Dims attr_ints(const std::string& name, const Dims& fallback) {
    const onnx::AttributeProto* a = attribute(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INTS) fail_node("attribute '{}' is not ints", name);
    return Dims(a->ints().begin(), a->ints().end());
  }
  // Ignores an attribute that changes nothing here (a Dropout's seed in inference).
  void ignore(const std::string& name) { node_.read.insert(name); }

  // Inputs and outputs: names after Identity and Dropout, constants and shapes.
  int inputs() const {
    int count = node().input_size();
    while (count > 0 && node().input(count - 1).empty())
      --count;
    return count;
  }
  bool has_input(int i) const { return i < node().input_size() && !node().input(i).empty(); }
  std::string input(int i) const {
    if (!has_input(i)) fail_node("input {} is missing", i);
    return resolve(node().input(i));
  }
  // The blob of an activation input (not a constant).
  std::string activation(int i) const {
    const std::string name = input(i);
    if (constant(name) != nullptr)
      fail_node("input {} ('{}') is a constant, where the importer needs a computed value", i,
                name);
    if (known_.count(name) == 0)
      fail_node("input {} ('{}') is computed by no earlier node", i, name);
    return name;
  }
  const Constant* constant(const std::string& name) const {
    auto found = constants_.find(resolve(name));
    return found == constants_.end() ? nullptr : &found->second;
  }
  // Input i, which must be a constant (weights, shapes).
  const Constant& constant_input(int i, const char* what) const {
    const Constant* c = constant(input(i));
    if (c == nullptr)
      fail_node("input {} ('{}', the {}) must be a constant (an initializer), not computed", i,
                input(i), what);
    return *c;
  }
  // The dims shape inference gave `name` (empty when it gave none).
  Dims dims_of(const std::string& name) const {
    auto found = dims_.find(resolve(name));
    return found == dims_.end() ? Dims{} : found->second;
  }
  std::vector<float> floats(const Constant& c, const char* what) const;
  Dims ints(const Constant& c, const char* what) const;
  // Shape arithmetic folded at import (Shape, Gather, Unsqueeze, Concat, ... of shapes, as
  // PyTorch writes before a Reshape or a Slice): the integer tensor a value holds, kBatch
  // standing for the graph's symbolic batch; null for a value that is not one.
  const Ints* int_value(const std::string& name);
  // Input i as integers: a folded value or an int64/int32 constant.
  Dims int_input(int i, const char* what) {
    const Ints* v = int_value(input(i));
    if (v == nullptr)
      fail_node("input {} ('{}', the {}) must be a constant or shape arithmetic, not computed", i,
                input(i), what);
    return v->values;
  }
  // Folds the node when it computes integers from shapes and constants only; false when it
  // computes on activations (a converter's work).
  bool fold_integers();
  template <class T, class S, class Field>
  std::vector<T> stored(const onnx::TensorProto& t, const Field& typed, const char* what) const;

  std::string output(int i) const {
    if (i >= node().output_size() || node().output(i).empty()) fail_node("output {} is missing", i);
    return node().output(i);
  }
  // Outputs past `used` must be unused (a MaxPool's indices, a Dropout's mask).
  void only_outputs(int used) const {
    for (int i = used; i < node().output_size(); ++i) {
      if (!node().output(i).empty() && consumed_.count(node().output(i)) > 0)
        fail_node("output {} ('{}') is used, and the importer does not compute it", i,
                  node().output(i));
    }
  }
  void alias(const std::string& name, const std::string& to) { aliases_[name] = to; }
  // Whether a node or the graph's outputs read `name`.
  bool read_later(const std::string& name) const { return consumed_.count(name) > 0; }
  // A blob name for a value between a node's layers: `base`, or with a suffix where the
  // graph or an earlier layer already names a value so.
  std::string fresh_value(const std::string& base) {
    std::string name = base;
    for (int n = 2; graph_values_.count(name) > 0 || known_.count(name) > 0; ++n)
      name = fmt::format("{}_{}", base, n);
    graph_values_.insert(name);
    return name;
  }
  // The blob for output 0 of a node that may compute in place on input 0: input 0's blob
  // where this node is its only reader (through Identity and Dropout too), it is computed by
  // a layer and neither it nor output 0 is a graph output; else output 0. In place, output
  // 0 names that blob from then on. In-place chains are what the Net fuses (BatchNorm ->
  // Scale -> ReLU: one pass over the blob instead of three) and plans in less memory.
  std::string in_place_output() {
    const std::string output0 = output(0);
    std::string at = node().input(0);
    bool sole = outputs_.count(output0) == 0;
    for (int hops = 0; sole && hops < 1000; ++hops) {
      auto count = readers_.find(at);
      sole = count != readers_.end() && count->second == 1 && outputs_.count(at) == 0 &&
             graph_inputs_.count(at) == 0;
      auto next = aliases_.find(at);
      if (next == aliases_.end()) break;
      at = next->second;
    }
    if (!sole || known_.count(at) == 0 || constants_.count(at) > 0) return output0;
    // Only over the output of a layer whose backward does not read it (a Sigmoid's, a
    // Softmax's or an LRN's gradient does): the types of Caffe's own in-place chains.
    static const std::set<std::string> kOverwritable = {
        "Convolution", "InnerProduct", "Eltwise", "Concat", "Pooling", "BatchNorm", "Scale"};
    for (int l = net_.layer_size(); l-- > 0;) {
      const pb::LayerParameter& producer = net_.layer(l);
      if (std::find(producer.top().begin(), producer.top().end(), at) == producer.top().end())
        continue;
      if (kOverwritable.count(producer.type()) == 0) return output0;
      break;
    }
    alias(output0, at);
    return at;
  }
  // Mul(x, Sigmoid(x)) in either order, as PyTorch exports SiLU, where the Sigmoid's layer
  // is the last one written and this Mul is its output's only reader: that layer becomes a
  // Swish writing output 0 (no Split of x, no separate product). False where it does not
  // apply.
  bool fuse_swish() {
    if (net_.layer_size() == 0 || node().input_size() != 2) return false;
    const pb::LayerParameter& last = net_.layer(net_.layer_size() - 1);
    if (last.type() != "Sigmoid" || last.bottom_size() != 1 || last.top_size() != 1) return false;
    for (int s = 0; s < 2; ++s) {
      const std::string& sig = node().input(s);
      const std::string& other = node().input(1 - s);
      if (resolve(sig) != last.top(0) || resolve(other) != last.bottom(0)) continue;
      auto count = readers_.find(sig);
      if (count == readers_.end() || count->second != 1 || outputs_.count(sig) > 0) return false;
      const std::string x = last.bottom(0);
      net_.mutable_layer()->RemoveLast();
      infer_dims(add_layer("Swish", {x}, {output(0)}));
      return true;
    }
    return false;
  }
  // Whether `name` is a value whose values only one node input reads (a Shape node reads
  // its shape only), not a graph output, nor the target of an alias (an Identity's reader
  // would read it too).
  bool sole_reader(const std::string& name) const {
    auto count = value_readers_.find(name);
    if (count == value_readers_.end() || count->second != 1 || outputs_.count(name) > 0)
      return false;
    return std::none_of(aliases_.begin(), aliases_.end(),
                        [&](const auto& alias) { return alias.second == name; });
  }
  // The channel shuffle as PyTorch exports it (ShuffleNet's channel_shuffle): Reshape
  // [N, C, ...] -> [N, g, C/g, ...], Transpose (1 2), and this node's Reshape back to
  // [N, C, ...] (`shape` its target, 0 copying the batch), the first two the last layers
  // written, each read only by the next: they become one ShuffleChannel layer, which also
  // takes over a Concat along the channels just before them that only they read (a
  // ShuffleNet v2 unit's). One pass instead of four copies. False where it does not apply.
  bool fuse_shuffle(const Dims& shape) {
    const int n = net_.layer_size();
    if (n < 2) return false;
    const pb::LayerParameter& permute = net_.layer(n - 1);
    const pb::LayerParameter& split = net_.layer(n - 2);
    const std::string x = resolve(node().input(0));
    if (permute.type() != "Permute" || permute.top_size() != 1 || permute.top(0) != x ||
        !sole_reader(x) || split.type() != "Reshape" || split.top_size() != 1 ||
        permute.bottom(0) != split.top(0) || !sole_reader(split.top(0)))
      return false;
    const Dims in = dims_of(split.bottom(0)), mid = dims_of(split.top(0));
    const std::size_t rank = in.size();
    // The batch copied (0) or the input's own (a model exported with a fixed batch).
    const auto keeps_batch = [&](std::int64_t d) { return d == 0 || (in[0] > 0 && d == in[0]); };
    if (rank < 2 || mid.size() != rank + 1 || shape.size() != rank || !keeps_batch(shape[0]) ||
        permute.permute_param().order_size() != static_cast<int>(rank + 1))
      return false;
    const pb::ReshapeParameter& first = split.reshape_param();
    if (first.axis() != 0 || first.num_axes() != -1 || first.shape().dim_size() < 1 ||
        !keeps_batch(first.shape().dim(0)))
      return false;
    for (std::size_t a = 0; a <= rank; ++a) {
      const std::uint32_t want = a == 1 ? 2 : a == 2 ? 1 : static_cast<std::uint32_t>(a);
      if (permute.permute_param().order(static_cast<int>(a)) != want) return false;
    }
    // Every dimension past the batch known and kept (one of them may be the -1 that takes
    // what is left); the channels cut in two.
    const auto inferred = std::count(shape.begin() + 1, shape.end(), std::int64_t{-1});
    for (std::size_t a = 1; a < rank; ++a)
      if (in[a] < 0 || (shape[a] != in[a] && !(shape[a] == -1 && inferred == 1)) ||
          (a >= 2 && mid[a + 1] != in[a]))
        return false;
    std::int64_t channels = 0;
    if (mid[1] <= 0 || mid[2] <= 0 || __builtin_mul_overflow(mid[1], mid[2], &channels) ||
        channels != in[1])
      return false;
    const std::int64_t group = mid[1];
    std::vector<std::string> bottoms = {split.bottom(0)};
    int first_fused = n - 2;
    if (n >= 3) {
      const pb::LayerParameter& concat = net_.layer(n - 3);
      if (concat.type() == "Concat" && concat.top_size() == 1 && concat.top(0) == split.bottom(0) &&
          concat.concat_param().axis() == 1 && !concat.concat_param().has_concat_dim() &&
          sole_reader(concat.top(0))) {
        bottoms.assign(concat.bottom().begin(), concat.bottom().end());
        first_fused = n - 3;
      }
    }
    while (net_.layer_size() > first_fused)
      net_.mutable_layer()->RemoveLast();
    pb::LayerParameter& layer = add_layer("ShuffleChannel", bottoms, {output(0)});
    layer.mutable_shuffle_channel_param()->set_group(static_cast<std::uint32_t>(group));
    infer_dims(layer);
    return true;
  }
  // A slice [begin, end) of `x` along `axis` that lies in a piece an earlier Slice layer of
  // x along that axis cut and left unused (its Silence layer's): that layer cuts it out for
  // this node's output instead (PyTorch exports x.chunk(2, 1) as two Slice nodes: one
  // layer, no Split of x and no Silence). False where no such piece exists.
  bool join_slice(const std::string& x, std::int64_t axis, std::int64_t begin, std::int64_t end) {
    const Dims d = dims_of(x);
    if (axis < 0 || static_cast<std::size_t>(axis) >= d.size()) return false;
    const std::int64_t size = d[static_cast<std::size_t>(axis)];
    for (int l = net_.layer_size(); l-- > 0;) {
      pb::LayerParameter& slice = *net_.mutable_layer(l);
      if (slice.type() != "Slice" || slice.bottom_size() != 1 || slice.bottom(0) != x ||
          slice.slice_param().axis() != axis || slice.slice_param().has_slice_dim() ||
          slice.slice_param().slice_point_size() + 1 != slice.top_size())
        continue;
      std::int64_t from = 0;
      for (int t = 0; t < slice.top_size(); ++t) {
        const std::int64_t to =
            t < slice.slice_param().slice_point_size() ? slice.slice_param().slice_point(t) : size;
        const int silence = silence_of(slice.top(t));
        if (silence < 0 || begin < from || end > to) {
          from = to;
          continue;
        }
        // Piece t becomes [from, begin) unused, [begin, end) this node's, [end, to) unused.
        std::vector<std::string> tops(slice.top().begin(), slice.top().end());
        std::vector<std::int64_t> points(slice.slice_param().slice_point().begin(),
                                         slice.slice_param().slice_point().end());
        std::vector<std::string> pieces, unused;
        std::vector<std::int64_t> cuts;
        if (begin > from) {
          unused.push_back(fresh_value(fmt::format("{}/piece_{}_{}", x, from, begin)));
          pieces.push_back(unused.back());
          cuts.push_back(begin);
        }
        pieces.push_back(output(0));
        if (end < to) {
          cuts.push_back(end);
          unused.push_back(fresh_value(fmt::format("{}/piece_{}_{}", x, end, to)));
          pieces.push_back(unused.back());
        }
        const std::string old = tops[static_cast<std::size_t>(t)];
        tops.erase(tops.begin() + t);
        tops.insert(tops.begin() + t, pieces.begin(), pieces.end());
        points.insert(points.begin() + t, cuts.begin(), cuts.end());
        slice.clear_top();
        for (const std::string& top : tops)
          slice.add_top(top);
        slice.mutable_slice_param()->clear_slice_point();
        for (std::int64_t p : points)
          slice.mutable_slice_param()->add_slice_point(static_cast<std::uint32_t>(p));
        known_.insert(output(0));
        for (const std::string& u : unused)
          known_.insert(u);
        infer_dims(slice);
        // The Silence layer: without the piece now read, with the new unused ones.
        pb::LayerParameter& quiet = *net_.mutable_layer(silence);
        std::vector<std::string> bottoms;
        for (const std::string& b : quiet.bottom())
          if (b != old) bottoms.push_back(b);
        bottoms.insert(bottoms.end(), unused.begin(), unused.end());
        if (bottoms.empty()) {
          net_.mutable_layer()->DeleteSubrange(silence, 1);
        } else {
          quiet.clear_bottom();
          for (const std::string& b : bottoms)
            quiet.add_bottom(b);
        }
        return true;
      }
    }
    return false;
  }
  // A Slice along the channels of a ShuffleChannel layer's only output that nothing else
  // reads (the next ShuffleNet v2 unit's chunk in two) becomes that layer's cut: its tops
  // and slice points move to the ShuffleChannel, which writes the pieces in its one pass.
  void fold_shuffle_slices() {
    std::set<std::string> kept;  // graph outputs
    for (const onnx::ValueInfoProto& out : model_.graph().output())
      kept.insert(resolve(out.name()));
    std::map<std::string, int> readers;
    for (const pb::LayerParameter& layer : net_.layer())
      for (const std::string& b : layer.bottom())
        ++readers[b];
    std::map<std::string, int> shuffles;  // the sole top of each ShuffleChannel -> its index
    for (int l = 0; l < net_.layer_size(); ++l) {
      const pb::LayerParameter& layer = net_.layer(l);
      if (layer.type() == "ShuffleChannel" && layer.top_size() == 1) {
        shuffles[layer.top(0)] = l;
        continue;
      }
      if (layer.type() != "Slice" || layer.bottom_size() != 1 ||
          layer.slice_param().has_slice_dim() || layer.slice_param().axis() != 1)
        continue;
      const std::string& x = layer.bottom(0);
      const auto producer = shuffles.find(x);
      if (producer == shuffles.end() || readers[x] != 1 || kept.count(x) > 0) continue;
      pb::LayerParameter& shuffle = *net_.mutable_layer(producer->second);
      shuffle.clear_top();
      for (const std::string& top : layer.top())
        shuffle.add_top(top);
      for (std::uint32_t point : layer.slice_param().slice_point())
        shuffle.mutable_shuffle_channel_param()->add_slice_point(point);
      shuffles.erase(producer);
      net_.mutable_layer()->DeleteSubrange(l--, 1);
    }
  }
  // The index of the Silence layer that alone reads `blob` (an unused piece), or -1.
  int silence_of(const std::string& blob) const {
    int found = -1;
    for (int l = 0; l < net_.layer_size(); ++l) {
      const pb::LayerParameter& layer = net_.layer(l);
      if (std::find(layer.bottom().begin(), layer.bottom().end(), blob) == layer.bottom().end())
        continue;
      if (layer.type() != "Silence" || found >= 0) return -1;
      found = l;
    }
    return found;
  }
  void set_constant(const std::string& name, const onnx::TensorProto& tensor,
                    bool from_node = false) {
    constants_[name] =
        Constant{&tensor, Dims(tensor.dims().begin(), tensor.dims().end()), from_node};
  }

  // A new layer of `type` from this node (`suffix` tells apart the layers of one node).
  pb::LayerParameter& add_layer(const char* type, const std::vector<std::string>& bottoms,
                                const std::vector<std::string>& tops, const char* suffix = "") {
    pb::LayerParameter& layer = *net_.add_layer();
    // Unique: a node's extra layers ("NODE/flatten") may meet another node's name.
    std::string name = node_.name + suffix;
    for (int n = 2; !layer_names_.insert(name).second; ++n)
      name = fmt::format("{}{}_{}", node_.name, suffix, n);
    layer.set_name(name);
    layer.set_type(type);
    for (const std::string& b : bottoms)
      layer.add_bottom(b);
    for (const std::string& t : tops) {
      layer.add_top(t);
      known_.insert(t);
    }
    return layer;
  }
  // Appends a blob of `dims` holding `values` to `layer`.
  static void add_blob(pb::LayerParameter& layer, const Dims& dims,
                       const std::vector<float>& values) {
    pb::BlobProto& blob = *layer.add_blobs();
    blob.mutable_shape();  // present even with no dimensions: a scalar, not Caffe's legacy 4-D
    for (std::int64_t d : dims)
      blob.mutable_shape()->add_dim(d);
    blob.mutable_data()->Resize(static_cast<int>(values.size()), 0.0f);
    std::copy(values.begin(), values.end(), blob.mutable_data()->mutable_data());
  }

 private:
  std::string resolve(const std::string& name) const {
    std::string at = name;
    for (int hops = 0; hops < 1000; ++hops) {
      auto found = aliases_.find(at);
      if (found == aliases_.end()) return at;
      at = found->second;
    }
    fail("{}: value '{}' is an alias of itself", path_, name);
  }
  std::string external_bytes(const onnx::TensorProto& tensor, std::size_t bytes) const;
  std::string raw_bytes(const onnx::TensorProto& tensor, std::size_t element_bytes,
                        const char* what) const;
  std::size_t element_count(const onnx::TensorProto& tensor, const char* what) const;
  void add_inputs();
  void read_dims();
  void infer_dims(const pb::LayerParameter& layer);

  std::string path_;
  onnx::ModelProto& model_;
  std::int64_t opset_ = 0;
  NodeState node_;
  pb::NetParameter net_;
  std::map<std::string, Constant> constants_;
  std::map<std::string, std::string> aliases_;
  std::map<std::string, Dims> dims_;
  std::set<std::string> known_;               // values computed so far (blobs)
  std::set<std::string> consumed_;            // values some node reads
  std::map<std::string, int> readers_;        // how many node inputs name each value
  std::map<std::string, int> value_readers_;  // of them, those not of Shape nodes
  std::set<std::string> outputs_;             // the graph's outputs
  std::set<std::string> graph_inputs_;        // the graph's inputs that are not initializers
  std::set<std::string> layer_names_;         // of the layers made so far
  std::set<std::string> graph_values_;        // every value the graph names
  std::map<std::string, Ints> ints_;          // folded integer values (int_value)
};

// ---- constants ---------------------------------------------------------------------------

std::size_t Importer::element_count(const onnx::TensorProto& tensor, const char* what) const {
  std::size_t count = 1;
  for (std::int64_t d : tensor.dims()) {
    if (d < 0 || (d > 0 && count > std::numeric_limits<std::size_t>::max() / 8 /
                                       static_cast<std::size_t>(d)))
      fail_node("the {} ('{}') has a bad shape {}", what, tensor.name(),
                dims_text(Dims(tensor.dims().begin(), tensor.dims().end())));
    count *= static_cast<std::size_t>(d);
  }
  check_host_bytes(count * sizeof(float),
                   [&] { return fmt::format("{}: the {} ('{}')", where(), what, tensor.name()); });
  return count;
}

std::string Importer::external_bytes(const onnx::TensorProto& tensor, std::size_t bytes) const {
  std::string location;
  std::uint64_t offset = 0, length = 0;
  bool has_length = false;
  for (const onnx::StringStringEntryProto& entry : tensor.external_data()) {
    if (entry.key() == "location") {
      location = entry.value();
    } else if (entry.key() == "offset" || entry.key() == "length") {
      char* end = nullptr;
      const unsigned long long value = std::strtoull(entry.value().c_str(), &end, 10);
      if (entry.value().empty() || entry.value()[0] == '-' || end == nullptr || *end != '\0')
        fail_node("tensor '{}': external data {} '{}' is not a number", tensor.name(), entry.key(),
                  entry.value());
      if (entry.key() == "offset") {
        offset = value;
      } else {
        length = value;
        has_length = true;
      }
    }
  }
  // The file must lie in the model's folder (no absolute paths, no "..").
  const std::filesystem::path relative(location);
  bool inside = !location.empty() && relative.is_relative();
  for (const auto& part : relative)
    inside = inside && part != "..";
  if (!inside)
    fail_node("tensor '{}': external data location '{}' is not a file beside the model",
              tensor.name(), location);
  const std::filesystem::path file = std::filesystem::path(path_).parent_path() / relative;
  std::ifstream in = open_input_file(file.string(), "reading external data");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  if (has_length && length != bytes)
    fail_node("tensor '{}': external data length {} is not the {} bytes of its shape",
              tensor.name(), length, bytes);
  if (offset > size || size - offset < bytes)
    fail_node("tensor '{}': external data [{}, {}) is outside '{}' ({} bytes)", tensor.name(),
              offset, offset + bytes, file.string(), size);
  std::string data(bytes, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (!in)
    fail_node("tensor '{}': cannot read {} bytes of '{}'", tensor.name(), bytes, file.string());
  return data;
}

// The tensor's values as stored bytes (raw_data or external data), or empty when they are
// in the typed fields.
std::string Importer::raw_bytes(const onnx::TensorProto& tensor, std::size_t element_bytes,
                                const char* what) const {
  const std::size_t bytes = element_count(tensor, what) * element_bytes;
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) return external_bytes(tensor, bytes);
  if (!tensor.has_raw_data()) return {};
  if (tensor.raw_data().size() != bytes)
    fail_node("the {} ('{}') holds {} bytes, its shape {} needs {}", what, tensor.name(),
              tensor.raw_data().size(), dims_text(Dims(tensor.dims().begin(), tensor.dims().end())),
              bytes);
  return tensor.raw_data();
}

// The tensor's values stored as S (raw_data, external data, or the typed field `typed`), each
// converted to T.
template <class T, class S, class Field>
std::vector<T> Importer::stored(const onnx::TensorProto& t, const Field& typed,
                                const char* what) const {
  const std::size_t count = element_count(t, what);
  const std::string raw = raw_bytes(t, sizeof(S), what);
  if (raw.empty() && static_cast<std::size_t>(typed.size()) != count)
    fail_node("the {} ('{}') holds {} values, its shape needs {}", what, t.name(), typed.size(),
              count);
  std::vector<T> values(count);
  if (raw.empty()) {
    for (std::size_t i = 0; i < count; ++i)
      values[i] = static_cast<T>(typed[static_cast<int>(i)]);
    return values;
  }
  for (std::size_t i = 0; i < count; ++i) {
    S v;
    std::memcpy(&v, raw.data() + i * sizeof(S), sizeof(S));
    values[i] = static_cast<T>(v);
  }
  return values;
}

std::vector<float> Importer::floats(const Constant& c, const char* what) const {
  const onnx::TensorProto& t = *c.tensor;
  if (t.data_type() == onnx::TensorProto::FLOAT)
    return stored<float, float>(t, t.float_data(), what);
  if (t.data_type() == onnx::TensorProto::DOUBLE)
    return stored<float, double>(t, t.double_data(), what);
  fail_node("the {} ('{}') is of ONNX data type {}; the importer reads float and double", what,
            t.name(), t.data_type());
}

Dims Importer::ints(const Constant& c, const char* what) const {
  const onnx::TensorProto& t = *c.tensor;
  if (t.data_type() == onnx::TensorProto::INT64)
    return stored<std::int64_t, std::int64_t>(t, t.int64_data(), what);
  if (t.data_type() == onnx::TensorProto::INT32)
    return stored<std::int64_t, std::int32_t>(t, t.int32_data(), what);
  fail_node("the {} ('{}') is of ONNX data type {}; the importer reads int64 and int32 here", what,
            t.name(), t.data_type());
}

const Ints* Importer::int_value(const std::string& name) {
  const std::string at = resolve(name);
  auto found = ints_.find(at);
  if (found != ints_.end()) return &found->second;
  const Constant* c = constant(at);
  if (c == nullptr || (c->tensor->data_type() != onnx::TensorProto::INT64 &&
                       c->tensor->data_type() != onnx::TensorProto::INT32))
    return nullptr;
  Ints v{c->dims, ints(*c, "integer constant")};
  return &(ints_[at] = std::move(v));
}

namespace {

// The product of dimensions, -1 when one is unknown or it overflows (defined below).
std::int64_t product(Dims::const_iterator begin, Dims::const_iterator end);

}  // namespace

bool Importer::fold_integers() {
  const std::string& op = node().op_type();
  static const std::set<std::string> kFoldable = {"Shape",  "Gather", "Unsqueeze", "Squeeze",
                                                  "Concat", "Cast",   "Mul",       "Div",
                                                  "Add",    "Sub",    "Slice",     "Identity"};
  if (kFoldable.count(op) == 0 || node().output_size() != 1) return false;
  Ints out;
  if (op == "Shape") {
    const std::string x = activation(0);
    const Dims d = dims_of(x);
    if (d.empty()) fail_node("the shape of '{}' is not known", x);
    std::int64_t rank = static_cast<std::int64_t>(d.size());
    std::int64_t start = attr_int("start", 0), end = attr_int("end", rank);
    start = std::clamp(start < 0 ? start + rank : start, std::int64_t{0}, rank);
    end = std::clamp(end < 0 ? end + rank : end, std::int64_t{0}, rank);
    for (std::int64_t i = start; i < end; ++i) {
      const std::int64_t v = d[static_cast<std::size_t>(i)];
      if (v < 0 && i != 0)
        fail_node("dimension {} of '{}' is not known ({}): only the batch may be symbolic", i, x,
                  dims_text(d));
      out.values.push_back(v < 0 ? kBatch : v);
    }
    out.dims = {static_cast<std::int64_t>(out.values.size())};
    ints_[output(0)] = std::move(out);
    return true;
  }
  // The others fold when every input is an integer value.
  std::vector<const Ints*> in;
  for (int i = 0; i < inputs(); ++i) {
    if (!has_input(i)) {
      in.push_back(nullptr);
      continue;
    }
    const Ints* v = int_value(input(i));
    if (v == nullptr) return false;
    in.push_back(v);
  }
  if (in.empty() || in[0] == nullptr) return false;
  const Ints& a = *in[0];
  const auto no_batch = [&](const Ints& v) {
    for (std::int64_t x : v.values)
      if (x == kBatch)
        fail_node("arithmetic on the symbolic batch dimension: export with a fixed batch");
  };
  if (op == "Identity") {
    out = a;
  } else if (op == "Cast") {
    const std::int64_t to = attr_int("to", 0);
    if (to != onnx::TensorProto::INT64 && to != onnx::TensorProto::INT32)
      fail_node("a Cast of shape arithmetic to ONNX data type {}: the importer folds integers", to);
    out = a;
  } else if (op == "Gather") {
    if (inputs() != 2) fail_node("Gather takes 2 inputs");
    if (attr_int("axis", 0) != 0 || a.dims.size() != 1)
      fail_node("a Gather of shape arithmetic off axis 0 of a vector");
    const std::int64_t n = static_cast<std::int64_t>(a.values.size());
    out.dims = in[1]->dims;
    for (std::int64_t index : in[1]->values) {
      if (index < 0) index += n;
      if (index < 0 || index >= n) fail_node("index {} out of a shape of {} values", index, n);
      out.values.push_back(a.values[static_cast<std::size_t>(index)]);
    }
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    Dims axes = opset() >= 13 ? (in.size() > 1 && in[1] != nullptr ? in[1]->values : Dims{})
                              : attr_ints("axes", {});
    out.values = a.values;
    Dims dims = a.dims;
    if (op == "Unsqueeze") {
      const std::int64_t rank = static_cast<std::int64_t>(dims.size() + axes.size());
      for (std::int64_t& axis : axes)
        if (axis < 0) axis += rank;
      std::sort(axes.begin(), axes.end());
      for (std::int64_t axis : axes) {
        if (axis < 0 || axis > static_cast<std::int64_t>(dims.size()))
          fail_node("axis {} out of range", axis);
        dims.insert(dims.begin() + axis, 1);
      }
    } else {
      Dims kept;
      for (std::size_t i = 0; i < dims.size(); ++i) {
        const bool listed =
            axes.empty() ? dims[i] == 1
                         : std::count(axes.begin(), axes.end(), static_cast<std::int64_t>(i)) +
                                   std::count(axes.begin(), axes.end(),
                                              static_cast<std::int64_t>(i) -
                                                  static_cast<std::int64_t>(dims.size())) >
                               0;
        if (!listed) kept.push_back(dims[i]);
      }
      dims = kept;
    }
    out.dims = dims;
  } else if (op == "Concat") {
    if (attr_int("axis", 0) != 0 && attr_int("axis", 0) != -1)
      fail_node("a Concat of shape arithmetic along axis {}", attr_int("axis", 0));
    for (const Ints* v : in) {
      if (v == nullptr || v->dims.size() != 1) fail_node("a Concat of shapes that are not vectors");
      out.values.insert(out.values.end(), v->values.begin(), v->values.end());
    }
    out.dims = {static_cast<std::int64_t>(out.values.size())};
  } else if (op == "Slice") {
    if (a.dims.size() != 1) fail_node("a Slice of shape arithmetic that is not a vector");
    if (inputs() < 3) fail_node("a Slice without starts and ends inputs");
    const std::int64_t n = static_cast<std::int64_t>(a.values.size());
    std::int64_t start = in[1]->values.at(0), end = in[2]->values.at(0);
    if (inputs() > 4 && in[4] != nullptr && in[4]->values.at(0) != 1)
      fail_node("a Slice of shape arithmetic with a step");
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp(start, std::int64_t{0}, n);
    end = std::clamp(end, std::int64_t{0}, n);
    for (std::int64_t i = start; i < end; ++i)
      out.values.push_back(a.values[static_cast<std::size_t>(i)]);
    out.dims = {static_cast<std::int64_t>(out.values.size())};
  } else {  // Mul, Div, Add, Sub: one of them a scalar, or both of one shape
    if (inputs() != 2) fail_node("{} takes 2 inputs", op);
    const Ints& b = *in[1];
    no_batch(a);
    no_batch(b);
    const std::int64_t na = product(a.dims.begin(), a.dims.end());
    const std::int64_t nb = product(b.dims.begin(), b.dims.end());
    if (na != static_cast<std::int64_t>(a.values.size()) ||
        nb != static_cast<std::int64_t>(b.values.size()))
      fail_node("shape arithmetic on values whose shapes {} and {} do not hold {} and {} values",
                dims_text(a.dims), dims_text(b.dims), a.values.size(), b.values.size());
    if (na < 1 || nb < 1 || (na != nb && na != 1 && nb != 1))
      fail_node("shape arithmetic on values of shapes {} and {}", dims_text(a.dims),
                dims_text(b.dims));
    out.dims = na >= nb ? a.dims : b.dims;
    const std::int64_t n = std::max(na, nb);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t x = a.values[static_cast<std::size_t>(na == 1 ? 0 : i)];
      const std::int64_t y = b.values[static_cast<std::size_t>(nb == 1 ? 0 : i)];
      if (op == "Div" && y == 0) fail_node("a division by 0 in shape arithmetic");
      std::int64_t value = 0;
      bool overflow = false;
      if (op == "Mul") {
        overflow = __builtin_mul_overflow(x, y, &value);
      } else if (op == "Add") {
        overflow = __builtin_add_overflow(x, y, &value);
      } else if (op == "Sub") {
        overflow = __builtin_sub_overflow(x, y, &value);
      } else {
        overflow = x == std::numeric_limits<std::int64_t>::min() && y == -1;
        if (!overflow) value = x / y;
      }
      if (overflow) fail_node("shape arithmetic {} {} {} overflows 64 bits", x, op, y);
      out.values.push_back(value);
    }
  }
  ints_[output(0)] = std::move(out);
  return true;
}

// ---- helpers of the converters -------------------------------------------------------------

// A 2-D spatial attribute of `size` values (kernel, stride, dilation), or the fallback.
Dims spatial(Importer& im, const char* name, std::int64_t fallback) {
  Dims values = im.attr_ints(name, Dims(2, fallback));
  if (values.size() != 2)
    im.fail_node("attribute '{}' has {} values; the importer reads 2-D {} (2 values)", name,
                 values.size(), im.node().op_type());
  for (std::int64_t v : values)
    if (v < 1 || v > kMaxAttribute)
      im.fail_node("attribute '{}' is {}: every value must lie in [1, {}]", name, dims_text(values),
                   kMaxAttribute);
  return values;
}

// The pads {begin_h, begin_w, end_h, end_w} from `pads` and `auto_pad`, for input `in`
// ({h, w}, -1 unknown).
Dims node_pads(Importer& im, const Dims& kernel, const Dims& stride, const Dims& dilation,
               const Dims& in) {
  const std::string auto_pad = im.attr_string("auto_pad", "NOTSET");
  Dims pads = im.attr_ints("pads", Dims(4, 0));
  if (auto_pad == "VALID") {
    pads = Dims(4, 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (int axis = 0; axis < 2; ++axis) {
      if (in.size() != 2 || in[static_cast<std::size_t>(axis)] < 0)
        im.fail_node("auto_pad {} needs the input's height and width, which are not known",
                     auto_pad);
      const std::int64_t size = in[static_cast<std::size_t>(axis)];
      const std::int64_t s = stride[static_cast<std::size_t>(axis)];
      const std::int64_t out = (size + s - 1) / s;
      const std::int64_t extent =
          (kernel[static_cast<std::size_t>(axis)] - 1) * dilation[static_cast<std::size_t>(axis)] +
          1;
      const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * s + extent - size);
      const std::int64_t small = total / 2, large = total - small;
      pads[static_cast<std::size_t>(axis)] = auto_pad == "SAME_UPPER" ? small : large;
      pads[static_cast<std::size_t>(axis) + 2] = auto_pad == "SAME_UPPER" ? large : small;
    }
  } else if (auto_pad != "NOTSET") {
    im.fail_node("attribute 'auto_pad' is '{}' (NOTSET, VALID, SAME_UPPER or SAME_LOWER)",
                 auto_pad);
  }
  if (pads.size() != 4) im.fail_node("attribute 'pads' has {} values; 2-D needs 4", pads.size());
  for (std::int64_t p : pads)
    if (p < 0 || p > kMaxAttribute)
      im.fail_node("attribute 'pads' {}: every pad must lie in [0, {}]", dims_text(pads),
                   kMaxAttribute);
  return pads;
}

bool symmetric(const Dims& pads) {
  return pads[0] == pads[2] && pads[1] == pads[3];
}

// Pads that differ between the two sides of an axis: a Pad layer (filled with `fill`) in
// front of the node's layer adds the difference, and the layer pads the smaller side on
// both. Returns the layer's input and its pads {h, w}.
std::pair<std::string, Dims> pad_in_front(Importer& im, const std::string& x, const Dims& pads,
                                          float fill) {
  const std::int64_t h = std::min(pads[0], pads[2]), w = std::min(pads[1], pads[3]);
  if (symmetric(pads)) return {x, Dims{h, w}};
  const std::string padded = im.fresh_value(im.output(0) + "/pad");
  pb::PadParameter& p = *im.add_layer("Pad", {x}, {padded}, "/pad").mutable_pad_param();
  p.set_axis(2);
  p.add_pad_before(static_cast<std::uint32_t>(pads[0] - h));
  p.add_pad_before(static_cast<std::uint32_t>(pads[1] - w));
  p.add_pad_after(static_cast<std::uint32_t>(pads[2] - h));
  p.add_pad_after(static_cast<std::uint32_t>(pads[3] - w));
  p.set_value(fill);
  return {padded, Dims{h, w}};
}

Dims spatial_dims(const Dims& dims) {
  if (dims.size() != 4) return {};
  return {dims[2], dims[3]};
}

// ---- the converters ----------------------------------------------------------------------

// A Conv's or ConvTranspose's weights (input 1): an initializer of 4 dimensions in range,
// its kernel the attribute's when that is given.
const Constant& conv_weights(Importer& im) {
  const Constant& w = im.constant_input(1, "weights");
  if (w.dims.size() != 4)
    im.fail_node("weights of shape {}: the importer reads 2-D convolutions (4-D weights)",
                 dims_text(w.dims));
  for (std::size_t i = 0; i < 4; ++i)
    if (w.dims[i] < 1 || w.dims[i] > (i < 2 ? kMaxDim : kMaxAttribute))
      im.fail_node("weights of shape {}: a dimension out of range", dims_text(w.dims));
  const Dims kernel = im.attr_ints("kernel_shape", {w.dims[2], w.dims[3]});
  if (kernel != Dims{w.dims[2], w.dims[3]})
    im.fail_node("attribute 'kernel_shape' {} is not the weights' {}", dims_text(kernel),
                 dims_text(w.dims));
  return w;
}

// The layer's convolution_param from the node (`pads`: {h, w}, the same on both sides) and
// its blobs: the weights as they are, the bias (input 2) of `outputs` values when given.
void write_conv_layer(Importer& im, pb::LayerParameter& layer, const Constant& w,
                      std::int64_t outputs, const Dims& stride, const Dims& dilation,
                      const Dims& pads, std::int64_t group) {
  pb::ConvolutionParameter& p = *layer.mutable_convolution_param();
  p.set_num_output(static_cast<std::uint32_t>(outputs));
  p.set_kernel_h(static_cast<std::uint32_t>(w.dims[2]));
  p.set_kernel_w(static_cast<std::uint32_t>(w.dims[3]));
  p.set_stride_h(static_cast<std::uint32_t>(stride[0]));
  p.set_stride_w(static_cast<std::uint32_t>(stride[1]));
  p.set_pad_h(static_cast<std::uint32_t>(pads[0]));
  p.set_pad_w(static_cast<std::uint32_t>(pads[1]));
  if (dilation != Dims{1, 1}) {
    p.add_dilation(static_cast<std::uint32_t>(dilation[0]));
    p.add_dilation(static_cast<std::uint32_t>(dilation[1]));
  }
  p.set_group(static_cast<std::uint32_t>(group));
  Importer::add_blob(layer, w.dims, im.floats(w, "weights"));
  p.set_bias_term(im.has_input(2));
  if (im.has_input(2)) {
    const Constant& b = im.constant_input(2, "bias");
    if (b.dims != Dims{outputs})
      im.fail_node("bias of shape {} for {} outputs", dims_text(b.dims), outputs);
    Importer::add_blob(layer, b.dims, im.floats(b, "bias"));
  }
}

void convert_conv(Importer& im) {
  const std::string x = im.activation(0);
  const Constant& w = conv_weights(im);
  const Dims stride = spatial(im, "strides", 1);
  const Dims dilation = spatial(im, "dilations", 1);
  const Dims pads =
      node_pads(im, {w.dims[2], w.dims[3]}, stride, dilation, spatial_dims(im.dims_of(x)));
  const std::int64_t group = im.attr_int("group", 1);
  if (group < 1 || w.dims[0] % group != 0)
    im.fail_node("attribute 'group' is {}, which does not divide the {} outputs", group, w.dims[0]);
  // Zeros on the side that pads more (auto_pad SAME with a stride, TensorFlow's exports).
  const auto [input, symmetric_pads] = pad_in_front(im, x, pads, 0.0f);
  pb::LayerParameter& layer = im.add_layer("Convolution", {input}, {im.output(0)});
  write_conv_layer(im, layer, w, w.dims[0], stride, dilation, symmetric_pads, group);
}

// ConvTranspose: a Deconvolution (weights [C][num_output / group][kh][kw] as ONNX's).
void convert_conv_transpose(Importer& im) {
  const std::string x = im.activation(0);
  const Constant& w = conv_weights(im);
  const Dims stride = spatial(im, "strides", 1);
  const Dims dilation = spatial(im, "dilations", 1);
  const std::string auto_pad = im.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID")
    im.fail_node("attribute 'auto_pad' is '{}': the importer reads NOTSET and VALID", auto_pad);
  Dims pads = auto_pad == "VALID" ? Dims(4, 0) : im.attr_ints("pads", Dims(4, 0));
  Dims extra = im.attr_ints("output_padding", Dims{0, 0});
  if (extra.size() != 2 || extra[0] < 0 || extra[1] < 0 || extra[0] > kMaxAttribute ||
      extra[1] > kMaxAttribute)
    im.fail_node("attribute 'output_padding' {}: 2 values in [0, {}]", dims_text(extra),
                 kMaxAttribute);
  if (const onnx::AttributeProto* shape = im.attribute("output_shape")) {
    // ONNX's rule: the pads come from the output's size (those given are ignored), the
    // larger half at the start under NOTSET. A Deconvolution pads both sides alike and
    // adds rows at the end (output_pad): pad = the start's, output_pad = start - end +
    // output_padding, which crops the same rows.
    Dims out(shape->ints().begin(), shape->ints().end());
    if (out.size() == 4) out.erase(out.begin(), out.begin() + 2);  // [N, C, H, W] given
    const Dims in = im.dims_of(x);
    if (auto_pad != "NOTSET" || out.size() != 2 || in.size() != 4 || in[2] < 0 || in[3] < 0 ||
        in[2] > kMaxDim || in[3] > kMaxDim)
      im.fail_node(
          "attribute 'output_shape' {} (auto_pad {}, input {}): the importer reads 2 spatial "
          "sizes of a 4-D input of known size, auto_pad NOTSET",
          dims_text(out), auto_pad, dims_text(in));
    for (std::size_t a = 0; a < 2; ++a) {
      const std::int64_t kernel = w.dims[2 + a];
      const std::int64_t full =
          stride[a] * (in[2 + a] - 1) + extra[a] + (kernel - 1) * dilation[a] + 1;
      const std::int64_t total = full - out[a];
      if (out[a] < 1 || total < 0)
        im.fail_node(
            "attribute 'output_shape' {}: axis {} of size {} needs negative pads (the "
            "transposed convolution gives {})",
            dims_text(out), a, out[a], full);
      const std::int64_t start = total - total / 2, end = total / 2;
      pads[a] = pads[a + 2] = start;
      extra[a] += start - end;
    }
  }
  if (pads.size() != 4 || !symmetric(pads))
    im.fail_node(
        "attribute 'pads' {}: the importer reads 4 pads, equal on the two sides of each axis",
        dims_text(pads));
  for (std::int64_t p : pads)
    if (p < 0 || p > kMaxAttribute)
      im.fail_node("attribute 'pads' {}: every pad must lie in [0, {}]", dims_text(pads),
                   kMaxAttribute);
  const std::int64_t group = im.attr_int("group", 1);
  if (group < 1 || w.dims[0] % group != 0)
    im.fail_node("attribute 'group' is {}, which does not divide the {} input channels", group,
                 w.dims[0]);
  pb::LayerParameter& layer = im.add_layer("Deconvolution", {x}, {im.output(0)});
  write_conv_layer(im, layer, w, w.dims[1] * group, stride, dilation, Dims{pads[0], pads[1]},
                   group);
  if (extra != Dims{0, 0}) {
    layer.mutable_convolution_param()->add_output_pad(static_cast<std::uint32_t>(extra[0]));
    layer.mutable_convolution_param()->add_output_pad(static_cast<std::uint32_t>(extra[1]));
  }
}

// Gemm (Y = alpha * A * B' + beta * C) and 2-D MatMul by a constant: InnerProduct.
void convert_gemm(Importer& im) {
  const bool matmul = im.node().op_type() == "MatMul";
  const std::string a = im.activation(0);
  const Constant& b = im.constant_input(1, "weights");
  const float alpha = matmul ? 1.0f : im.attr_float("alpha", 1.0f);
  const float beta = matmul ? 1.0f : im.attr_float("beta", 1.0f);
  if (!matmul && im.attr_int("transA", 0) != 0)
    im.fail_node("attribute 'transA' is 1: the importer reads Gemm with the input untransposed");
  const bool trans_b = !matmul && im.attr_int("transB", 0) != 0;
  const Dims a_dims = im.dims_of(a);
  if (!a_dims.empty() && a_dims.size() != 2)
    im.fail_node("input of shape {}: the importer reads a 2-D input (Flatten first)",
                 dims_text(a_dims));
  if (b.dims.size() != 2 || b.dims[0] < 1 || b.dims[1] < 1 || b.dims[0] > kMaxDim ||
      b.dims[1] > kMaxDim)
    im.fail_node("weights of shape {}: 2-D weights are needed", dims_text(b.dims));
  const std::int64_t outputs = trans_b ? b.dims[0] : b.dims[1];
  const std::int64_t depth = trans_b ? b.dims[1] : b.dims[0];
  std::vector<float> values = im.floats(b, "weights");
  std::vector<float> weights(values.size());
  for (std::int64_t o = 0; o < outputs; ++o) {
    for (std::int64_t i = 0; i < depth; ++i) {
      const float v = trans_b ? values[static_cast<std::size_t>(o * depth + i)]
                              : values[static_cast<std::size_t>(i * outputs + o)];
      weights[static_cast<std::size_t>(o * depth + i)] = alpha * v;
    }
  }
  pb::LayerParameter& layer = im.add_layer("InnerProduct", {a}, {im.output(0)});
  pb::InnerProductParameter& p = *layer.mutable_inner_product_param();
  p.set_num_output(static_cast<std::uint32_t>(outputs));
  Importer::add_blob(layer, {outputs, depth}, weights);
  const bool bias = !matmul && im.has_input(2);
  p.set_bias_term(bias);
  if (bias) {
    const Constant& c = im.constant_input(2, "bias");
    std::size_t count = 1;
    for (std::int64_t d : c.dims)
      count *= static_cast<std::size_t>(d);
    if (count != static_cast<std::size_t>(outputs) || c.dims.empty() || c.dims.back() != outputs)
      im.fail_node("bias of shape {}: the importer reads a bias of one value per output ({})",
                   dims_text(c.dims), outputs);
    std::vector<float> bias_values = im.floats(c, "bias");
    for (float& v : bias_values)
      v *= beta;
    Importer::add_blob(layer, {outputs}, bias_values);
  }
}

void convert_relu(Importer& im) {
  const std::string x = im.activation(0);
  pb::LayerParameter& layer = im.add_layer("ReLU", {x}, {im.in_place_output()});
  if (im.node().op_type() == "LeakyRelu")
    layer.mutable_relu_param()->set_negative_slope(im.attr_float("alpha", 0.01f));
}

// Clip: bounds as attributes before opset 11, as optional constant inputs from it.
void convert_clip(Importer& im) {
  float low = std::numeric_limits<float>::lowest(), high = std::numeric_limits<float>::max();
  if (im.opset() < 11) {
    low = im.attr_float("min", low);
    high = im.attr_float("max", high);
  } else {
    const auto bound = [&](int i, const char* what, float fallback) {
      if (!im.has_input(i)) return fallback;
      const std::vector<float> values = im.floats(im.constant_input(i, what), what);
      if (values.size() != 1) im.fail_node("the {} holds {} values, not one", what, values.size());
      return values[0];
    };
    low = bound(1, "min", low);
    high = bound(2, "max", high);
  }
  if (!(low <= high)) im.fail_node("min {} is above max {}", low, high);
  // In place where it can be (the Net then runs it inside the convolution before it): its
  // gradient is then read from its output, PyTorch's ReLU6 gradient (clip.cpp).
  pb::LayerParameter& layer = im.add_layer("Clip", {im.activation(0)}, {im.in_place_output()});
  layer.mutable_clip_param()->set_min(low);
  layer.mutable_clip_param()->set_max(high);
}

void convert_unary(Importer& im) {
  const std::string& op = im.node().op_type();
  im.add_layer(op == "Sigmoid" ? "Sigmoid" : "TanH", {im.activation(0)}, {im.output(0)});
}

void convert_pool(Importer& im) {
  const std::string& op = im.node().op_type();
  const std::string x = im.activation(0);
  const bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  const bool max = op == "MaxPool" || op == "GlobalMaxPool";
  const Dims in = im.dims_of(x);
  if (!in.empty() && in.size() != 4)
    im.fail_node("input of shape {}: the importer reads 2-D pooling (4-D inputs)", dims_text(in));
  im.only_outputs(1);
  const auto pooling = [&](const std::string& input) -> pb::PoolingParameter& {
    pb::LayerParameter& layer = im.add_layer("Pooling", {input}, {im.output(0)});
    pb::PoolingParameter& p = *layer.mutable_pooling_param();
    p.set_pool(max ? pb::PoolingParameter::MAX : pb::PoolingParameter::AVE);
    return p;
  };
  if (global) {
    pooling(x).set_global_pooling(true);
    return;
  }
  if (im.attribute("kernel_shape") == nullptr) im.fail_node("attribute 'kernel_shape' is missing");
  const Dims kernel = spatial(im, "kernel_shape", 1);
  const Dims stride = spatial(im, "strides", 1);
  const Dims dilation = spatial(im, "dilations", 1);
  if (dilation != Dims{1, 1})
    im.fail_node("attribute 'dilations' is {}: the importer reads undilated pooling",
                 dims_text(dilation));
  if (im.attr_int("storage_order", 0) != 0)
    im.fail_node("attribute 'storage_order' is 1 (column-major indices)");
  const Dims pads = node_pads(im, kernel, stride, dilation, spatial_dims(in));
  const bool ceil = im.attr_int("ceil_mode", 0) != 0;
  // Unequal sides: in floor mode a Pad in front, for MaxPool of the lowest float (no window
  // lies wholly in the padding while pads are below the kernel), for AveragePool with
  // count_include_pad 1 of zeros (every window then divides by the kernel's cells, padded
  // or not, as ONNX's does); count_include_pad 0 and ceil mode's last windows would count
  // the padding differently.
  const bool include_pad = !max && im.attr_int("count_include_pad", 0) != 0;
  const bool max_padded = max && pads[0] < kernel[0] && pads[2] < kernel[0] &&
                          pads[1] < kernel[1] && pads[3] < kernel[1];
  if (!symmetric(pads) && (ceil || !(max ? max_padded : include_pad)))
    im.fail_node(
        "attribute 'pads' {} pads the two sides of an axis differently; the importer reads that "
        "with ceil_mode 0 only, for MaxPool with pads below the kernel and for AveragePool with "
        "count_include_pad 1",
        dims_text(pads));
  const auto [input, symmetric_pads] =
      pad_in_front(im, x, pads, max ? std::numeric_limits<float>::lowest() : 0.0f);
  const std::int64_t pad_h = symmetric_pads[0], pad_w = symmetric_pads[1];
  pb::PoolingParameter& p = pooling(input);
  // Without pads the two divisors agree; with them, Caffe's (the window clipped to the
  // padded input) is count_include_pad 1's as ONNX Runtime computes it.
  if (!max && !include_pad && (pad_h > 0 || pad_w > 0)) p.set_count_include_pad(false);
  p.set_kernel_h(static_cast<std::uint32_t>(kernel[0]));
  p.set_kernel_w(static_cast<std::uint32_t>(kernel[1]));
  p.set_stride_h(static_cast<std::uint32_t>(stride[0]));
  p.set_stride_w(static_cast<std::uint32_t>(stride[1]));
  p.set_pad_h(static_cast<std::uint32_t>(pad_h));
  p.set_pad_w(static_cast<std::uint32_t>(pad_w));
  p.set_round_mode(ceil ? pb::PoolingParameter::CEIL : pb::PoolingParameter::FLOOR);
  if (!ceil) return;
  // Caffe drops a last window that starts in the padding only when some pad is non-zero;
  // ONNX Runtime and PyTorch always do: where that differs, refuse.
  const std::int64_t both[2] = {pad_h, pad_w};
  for (int axis = 0; axis < 2 && in.size() == 4; ++axis) {
    const std::int64_t size = in[static_cast<std::size_t>(axis) + 2];
    if (size < 0) continue;
    const std::int64_t k = kernel[static_cast<std::size_t>(axis)];
    const std::int64_t s = stride[static_cast<std::size_t>(axis)];
    const std::int64_t pad = both[axis];
    const std::int64_t out = (size + 2 * pad - k + s - 1) / s + 1;
    if ((out - 1) * s >= size + pad && pad_h == 0 && pad_w == 0)
      im.fail_node(
          "attribute 'ceil_mode' is 1 with a last window past the input (stride {} > "
          "kernel {}): Caffe's rounding keeps it, ONNX's drops it",
          s, k);
  }
}

// Mul, Add, Sub and Div by a constant: one value per channel (shape [C, 1, ..., 1] or
// [1, C, 1, ..., 1] against an input of [N, C, ...]) or one for all (every dimension 1), as a
// Scale layer holding the constant: Mul by it, Div by its reciprocal (x * (1 / c), which may
// differ from x / c in the last bit), Add it as the bias (the factor 1, frozen), Sub it
// negated, and c - x as the factor -1 (frozen) and c. A constant from an initializer is
// learnable, as PyTorch's parameters are; a Constant node's is frozen (lr_mult 0). Returns
// false where neither input is a constant.
bool convert_by_constant(Importer& im) {
  const std::string& op = im.node().op_type();
  if (im.inputs() != 2) im.fail_node("{} inputs; {} takes 2", im.inputs(), op);
  const Constant* first = im.constant(im.input(0));
  const Constant* second = im.constant(im.input(1));
  if (first == nullptr && second == nullptr) return false;
  if (first != nullptr && second != nullptr)
    im.fail_node("both inputs are constants: fold them before export");
  const bool constant_first = first != nullptr;
  const Constant& c = constant_first ? *first : *second;
  if (constant_first && op == "Div")
    im.fail_node("a constant divided by a computed value: the importer does not compute that");
  const std::string x = im.activation(constant_first ? 1 : 0);
  const Dims dx = im.dims_of(x);
  if (dx.empty()) im.fail_node("the input's shape is not known");
  if (c.dims.size() > dx.size())
    im.fail_node("a constant of shape {} against an input of shape {}", dims_text(c.dims),
                 dims_text(dx));
  Dims padded(dx.size() - c.dims.size(), 1);
  padded.insert(padded.end(), c.dims.begin(), c.dims.end());
  bool all_ones = true, per_channel = dx.size() >= 2 && padded[1] == dx[1];
  for (std::size_t i = 0; i < padded.size(); ++i) {
    all_ones = all_ones && padded[i] == 1;
    if (i != 1) per_channel = per_channel && padded[i] == 1;
  }
  if (!all_ones && !per_channel)
    im.fail_node(
        "a constant of shape {} against an input of shape {}: the importer reads one value "
        "per channel ([C, 1, ..., 1]) or one for all",
        dims_text(c.dims), dims_text(dx));
  std::vector<float> values = im.floats(c, "constant");
  const Dims blob_dims = all_ones ? Dims{} : Dims{dx[1]};
  pb::LayerParameter& layer = im.add_layer("Scale", {x}, {im.output(0)});
  pb::ScaleParameter& p = *layer.mutable_scale_param();
  p.set_axis(1);
  p.set_num_axes(all_ones ? 0 : 1);
  const auto param = [&](bool frozen) {
    pb::ParamSpec& spec = *layer.add_param();
    if (!frozen) return;
    spec.set_lr_mult(0.0f);
    spec.set_decay_mult(0.0f);
  };
  if (op == "Mul" || op == "Div") {
    if (op == "Div")
      for (float& v : values)
        v = 1.0f / v;
    param(c.from_node);
    Importer::add_blob(layer, blob_dims, values);
    return true;
  }
  // Add and Sub: a bias, with the factor 1 (or -1 for c - x) frozen.
  const bool negate_x = op == "Sub" && constant_first;
  if (op == "Sub" && !constant_first)
    for (float& v : values)
      v = -v;
  p.set_bias_term(true);
  param(true);
  param(c.from_node);
  Importer::add_blob(layer, blob_dims, std::vector<float>(values.size(), negate_x ? -1.0f : 1.0f));
  Importer::add_blob(layer, blob_dims, values);
  return true;
}

// Sub of two computed values of one shape: an Eltwise sum with the coefficients 1 and -1.
void convert_sub(Importer& im) {
  if (convert_by_constant(im)) return;
  const std::string a = im.activation(0), b = im.activation(1);
  const Dims da = im.dims_of(a), db = im.dims_of(b);
  if (!da.empty() && !db.empty() && da != db)
    im.fail_node("inputs of shapes {} and {}: the importer subtracts inputs of one shape",
                 dims_text(da), dims_text(db));
  pb::LayerParameter& layer = im.add_layer("Eltwise", {a, b}, {im.output(0)});
  layer.mutable_eltwise_param()->set_operation(pb::EltwiseParameter::SUM);
  layer.mutable_eltwise_param()->add_coeff(1.0f);
  layer.mutable_eltwise_param()->add_coeff(-1.0f);
}

// Max of computed values of one shape: an Eltwise MAX.
void convert_max(Importer& im) {
  if (im.inputs() < 2)
    im.fail_node("{} input(s); the importer reads Max of 2 or more", im.inputs());
  std::vector<std::string> inputs;
  for (int i = 0; i < im.inputs(); ++i) {
    inputs.push_back(im.activation(i));
    const Dims d0 = im.dims_of(inputs[0]), di = im.dims_of(inputs.back());
    if (!d0.empty() && !di.empty() && d0 != di)
      im.fail_node("inputs of shapes {} and {}: the importer takes the maximum of one shape",
                   dims_text(d0), dims_text(di));
  }
  pb::LayerParameter& layer = im.add_layer("Eltwise", inputs, {im.output(0)});
  layer.mutable_eltwise_param()->set_operation(pb::EltwiseParameter::MAX);
}

void convert_div(Importer& im) {
  if (!convert_by_constant(im))
    im.fail_node("a division by a computed value: the importer divides by constants only");
}

void convert_add(Importer& im) {
  if (convert_by_constant(im)) return;
  if (im.inputs() != 2) im.fail_node("{} inputs; Add takes 2", im.inputs());
  const std::string a = im.activation(0), b = im.activation(1);
  const Dims da = im.dims_of(a), db = im.dims_of(b);
  if (!da.empty() && !db.empty() && da != db)
    im.fail_node(
        "inputs of shapes {} and {}: the importer adds inputs of one shape (no "
        "broadcasting yet)",
        dims_text(da), dims_text(db));
  pb::LayerParameter& layer = im.add_layer("Eltwise", {a, b}, {im.output(0)});
  layer.mutable_eltwise_param()->set_operation(pb::EltwiseParameter::SUM);
}

// Mul: of one shape, Eltwise PROD; an [N, C, 1, 1] (or [N, C]) factor of an [N, C, ...]
// input (squeeze-and-excitation), a Scale by its second bottom flattened to [N, C].
void convert_mul(Importer& im) {
  if (convert_by_constant(im)) return;
  if (im.inputs() != 2) im.fail_node("{} inputs; Mul takes 2", im.inputs());
  if (im.fuse_swish()) return;
  std::string a = im.activation(0), b = im.activation(1);
  Dims da = im.dims_of(a), db = im.dims_of(b);
  if (da.empty() || db.empty()) im.fail_node("the inputs' shapes are not known");
  if (da == db) {
    pb::LayerParameter& layer = im.add_layer("Eltwise", {a, b}, {im.output(0)});
    layer.mutable_eltwise_param()->set_operation(pb::EltwiseParameter::PROD);
    return;
  }
  if (da.size() < db.size() || (da.size() == db.size() && db.size() > 2 && db[2] != 1)) {
    std::swap(a, b);
    std::swap(da, db);
  }
  // b must be [N, C] or [N, C, 1, ..., 1] against a of [N, C, ...].
  bool channels = db.size() >= 2 && da.size() >= 2 && db[0] == da[0] && db[1] == da[1];
  for (std::size_t i = 2; i < db.size(); ++i)
    channels = channels && db[i] == 1;
  if (!channels)
    im.fail_node(
        "inputs of shapes {} and {}: the importer multiplies inputs of one shape, or "
        "an input by per-channel factors ([N, C, 1, 1])",
        dims_text(da), dims_text(db));
  std::string factor = b;
  if (db.size() > 2) {
    factor = im.fresh_value(im.output(0) + "/factor");
    im.add_layer("Flatten", {b}, {factor}, "/flatten");
  }
  pb::LayerParameter& scale = im.add_layer("Scale", {a, factor}, {im.output(0)});
  scale.mutable_scale_param()->set_axis(0);
}

// HardSigmoid: y = max(0, min(1, alpha * x + beta)) as a Scale by the constants (frozen:
// lr_mult 0) and a Clip; HardSwish: x * HardSigmoid(x) with alpha 1/6, beta 1/2.
void convert_hard_sigmoid(Importer& im) {
  const bool swish = im.node().op_type() == "HardSwish";
  const float alpha = swish ? 1.0f / 6.0f : im.attr_float("alpha", 0.2f);
  const float beta = swish ? 0.5f : im.attr_float("beta", 0.5f);
  const std::string x = im.activation(0);
  const std::string affine = im.fresh_value(im.output(0) + "/affine");
  pb::LayerParameter& scale = im.add_layer("Scale", {x}, {affine}, "/affine");
  scale.mutable_scale_param()->set_num_axes(0);
  scale.mutable_scale_param()->set_bias_term(true);
  for (int i = 0; i < 2; ++i) {
    pb::ParamSpec& spec = *scale.add_param();
    spec.set_lr_mult(0.0f);
    spec.set_decay_mult(0.0f);
  }
  Importer::add_blob(scale, {}, {alpha});
  Importer::add_blob(scale, {}, {beta});
  const std::string clipped = swish ? im.fresh_value(im.output(0) + "/hard_sigmoid") : im.output(0);
  pb::LayerParameter& clip =
      im.add_layer("Clip", {affine}, {clipped}, swish ? "/hard_sigmoid" : "");
  clip.mutable_clip_param()->set_min(0.0f);
  clip.mutable_clip_param()->set_max(1.0f);
  if (!swish) return;
  pb::LayerParameter& product = im.add_layer("Eltwise", {x, clipped}, {im.output(0)});
  product.mutable_eltwise_param()->set_operation(pb::EltwiseParameter::PROD);
}

void convert_concat(Importer& im) {
  std::vector<std::string> bottoms;
  for (int i = 0; i < im.inputs(); ++i)
    bottoms.push_back(im.activation(i));
  std::int64_t axis = im.attr_int("axis", 1);
  const Dims d = im.dims_of(bottoms.front());
  if (axis < 0) {
    if (d.empty()) im.fail_node("attribute 'axis' is {} and the input's rank is not known", axis);
    axis += static_cast<std::int64_t>(d.size());
  }
  if (axis < 0 || (!d.empty() && axis >= static_cast<std::int64_t>(d.size())) || axis > 32)
    im.fail_node("attribute 'axis' is out of range for an input of shape {}", dims_text(d));
  pb::LayerParameter& layer = im.add_layer("Concat", bottoms, {im.output(0)});
  layer.mutable_concat_param()->set_axis(static_cast<std::int32_t>(axis));
}

void convert_flatten(Importer& im) {
  const std::string x = im.activation(0);
  std::int64_t axis = im.attr_int("axis", 1);
  const Dims d = im.dims_of(x);
  if (axis < 0 && !d.empty()) axis += static_cast<std::int64_t>(d.size());
  if (axis != 1)
    im.fail_node("attribute 'axis' is {}: the importer flattens from axis 1 (the batch stays)",
                 axis);
  im.add_layer("Flatten", {x}, {im.output(0)});
}

void convert_reshape(Importer& im) {
  const std::string x = im.activation(0);
  Dims shape = im.int_input(1, "shape");
  // The symbolic batch (from the input's Shape) copies the input's first dimension.
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != kBatch) continue;
    if (i != 0) im.fail_node("the symbolic batch at position {} of the shape", i);
    shape[i] = 0;
  }
  if (im.attr_int("allowzero", 0) != 0)
    im.fail_node("attribute 'allowzero' is 1: a 0 in the shape would mean a dimension of 0");
  if (im.fuse_shuffle(shape)) return;
  pb::LayerParameter& layer = im.add_layer("Reshape", {x}, {im.output(0)});
  for (std::int64_t v : shape)
    layer.mutable_reshape_param()->mutable_shape()->add_dim(v);
}

void convert_batch_norm(Importer& im) {
  const std::string x = im.activation(0);
  // training_mode 1 (opset 14 on; PyTorch's export with TrainingMode.TRAINING): normalised by
  // the batch's own statistics, in every phase (Caffe's use_global_stats: false), the stored
  // ones a moving average with `momentum` the weight of the old (Caffe's
  // moving_average_fraction). Its outputs 1 and 2 (the updated running statistics) are not
  // computed: the BatchNorm keeps its own in its blobs.
  const bool training = im.attr_int("training_mode", 0) != 0;
  im.only_outputs(1);
  const float momentum = im.attr_float("momentum", 0.9f);
  if (training && !(momentum >= 0.0f && momentum <= 1.0f))
    im.fail_node("attribute 'momentum' is {}: a weight in [0, 1]", momentum);
  if (im.opset() < 9) im.ignore("spatial");
  const float eps = im.attr_float("epsilon", 1e-5f);
  const Constant& scale = im.constant_input(1, "scale");
  const Constant& bias = im.constant_input(2, "bias");
  const Constant& mean = im.constant_input(3, "mean");
  const Constant& var = im.constant_input(4, "variance");
  const Dims c = scale.dims;
  if (c.size() != 1 || bias.dims != c || mean.dims != c || var.dims != c)
    im.fail_node(
        "scale, bias, mean and variance of shapes {}, {}, {}, {}: one value per channel "
        "each",
        dims_text(scale.dims), dims_text(bias.dims), dims_text(mean.dims), dims_text(var.dims));
  // In place where it can be, the Scale on the BatchNorm's top: the chain the Net fuses.
  const std::string y = im.in_place_output();
  pb::LayerParameter& bn = im.add_layer("BatchNorm", {x}, {y}, "/bn");
  bn.mutable_batch_norm_param()->set_use_global_stats(!training);
  if (training) bn.mutable_batch_norm_param()->set_moving_average_fraction(momentum);
  bn.mutable_batch_norm_param()->set_eps(eps);
  Importer::add_blob(bn, c, im.floats(mean, "mean"));
  Importer::add_blob(bn, c, im.floats(var, "variance"));
  Importer::add_blob(bn, {1}, {1.0f});
  pb::LayerParameter& affine = im.add_layer("Scale", {y}, {y});
  affine.mutable_scale_param()->set_bias_term(true);
  Importer::add_blob(affine, c, im.floats(scale, "scale"));
  Importer::add_blob(affine, c, im.floats(bias, "bias"));
}

void convert_softmax(Importer& im) {
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  std::int64_t axis = im.attr_int("axis", im.opset() >= 13 ? -1 : 1);
  if (d.empty()) im.fail_node("the input's rank is not known");
  if (axis < 0) axis += static_cast<std::int64_t>(d.size());
  if (axis < 0 || axis >= static_cast<std::int64_t>(d.size()))
    im.fail_node("attribute 'axis' is out of range for an input of shape {}", dims_text(d));
  // Before opset 13 the input is coerced to 2-D at `axis`: one softmax over all the axes
  // from there, which equals Caffe's over one axis only when that is the last.
  if (im.opset() < 13 && axis + 1 != static_cast<std::int64_t>(d.size()))
    im.fail_node(
        "attribute 'axis' is {} on a {}-D input under opset {}: a softmax over several "
        "axes",
        axis, d.size(), im.opset());
  pb::LayerParameter& layer = im.add_layer(
      im.node().op_type() == "LogSoftmax" ? "LogSoftmax" : "Softmax", {x}, {im.output(0)});
  layer.mutable_softmax_param()->set_axis(static_cast<std::int32_t>(axis));
}

void convert_lrn(Importer& im) {
  const std::int64_t size = im.attr_int("size", 0);
  if (size < 1 || size % 2 == 0 || size > kMaxAttribute)
    im.fail_node(
        "attribute 'size' is {}: the importer reads odd sizes (windows centred on "
        "the channel)",
        size);
  pb::LayerParameter& layer = im.add_layer("LRN", {im.activation(0)}, {im.output(0)});
  pb::LRNParameter& p = *layer.mutable_lrn_param();
  p.set_local_size(static_cast<std::uint32_t>(size));
  p.set_alpha(im.attr_float("alpha", 1e-4f));
  p.set_beta(im.attr_float("beta", 0.75f));
  p.set_k(im.attr_float("bias", 1.0f));
}

// Identity and Dropout (inference: the identity) name their input again.
void convert_identity(Importer& im) {
  if (im.node().op_type() == "Dropout") {
    im.only_outputs(1);
    im.ignore("seed");
    im.ignore("ratio");  // opset < 12 (later: an input, equally unused)
    im.ignore("is_test");
    if (im.opset() >= 12 && im.has_input(2)) {
      const Dims training = im.ints(im.constant_input(2, "training_mode"), "training_mode");
      if (!training.empty() && training[0] != 0)
        im.fail_node(
            "input 'training_mode' is true: a dropout in a model exported for "
            "training");
    }
  }
  im.alias(im.output(0), im.input(0));
}

// Pad in constant, reflect and edge modes: a Pad layer over the axes after the batch (none
// padded: an alias); wrap (opset 19) is an error.
void convert_pad(Importer& im) {
  const std::string mode = im.attr_string("mode", "constant");
  Dims pads;
  float value = 0.0f;
  if (im.opset() < 11) {
    pads = im.attr_ints("pads", {});
    value = im.attr_float("value", 0.0f);
  } else {
    pads = im.int_input(1, "pads");
    if (im.has_input(2)) {
      const std::vector<float> values =
          im.floats(im.constant_input(2, "constant value"), "constant value");
      if (values.size() != 1)
        im.fail_node("the constant value holds {} values, not one", values.size());
      value = values[0];
    }
    if (im.has_input(3)) im.fail_node("input 3 ('axes', opset 18) is not read by the importer");
  }
  const Dims d = im.dims_of(im.input(0));
  if (pads.size() % 2 != 0 || pads.empty() || (!d.empty() && pads.size() != 2 * d.size()))
    im.fail_node("pads {} for an input of shape {}: 2 per axis", dims_text(pads), dims_text(d));
  const std::size_t rank = pads.size() / 2;
  bool any = false;
  for (std::size_t a = 0; a < rank; ++a) {
    if (pads[a] < 0 || pads[a + rank] < 0 || pads[a] > kMaxAttribute ||
        pads[a + rank] > kMaxAttribute)
      im.fail_node("pads {}: every pad must lie in [0, {}] (negative pads crop)", dims_text(pads),
                   kMaxAttribute);
    any = any || pads[a] != 0 || pads[a + rank] != 0;
  }
  if (!any) {
    im.alias(im.output(0), im.input(0));
    return;
  }
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    im.fail_node("attribute 'mode' is '{}': the importer reads modes constant, reflect and edge",
                 mode);
  if (pads[0] != 0 || pads[rank] != 0) im.fail_node("pads {} pad the batch axis", dims_text(pads));
  pb::PadParameter& p =
      *im.add_layer("Pad", {im.activation(0)}, {im.output(0)}).mutable_pad_param();
  p.set_axis(1);
  for (std::size_t a = 1; a < rank; ++a) {
    p.add_pad_before(static_cast<std::uint32_t>(pads[a]));
    p.add_pad_after(static_cast<std::uint32_t>(pads[a + rank]));
  }
  p.set_value(value);
  p.set_mode(mode);
}

void convert_constant(Importer& im) {
  const onnx::AttributeProto* value = im.attribute("value");
  if (value == nullptr || value->type() != onnx::AttributeProto::TENSOR)
    im.fail_node("a Constant without a tensor 'value' (the importer reads that form only)");
  im.set_constant(im.output(0), value->t(), true);
}

// Transpose: a Permute layer (`perm`; by default the axes reversed).
void convert_transpose(Importer& im) {
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  if (d.empty()) im.fail_node("the input's rank is not known");
  Dims perm = im.attr_ints("perm", {});
  if (perm.empty())
    for (std::size_t k = d.size(); k-- > 0;)
      perm.push_back(static_cast<std::int64_t>(k));
  if (perm.size() != d.size())
    im.fail_node("attribute 'perm' has {} axes for {}", perm.size(), dims_text(d));
  pb::LayerParameter& layer = im.add_layer("Permute", {x}, {im.output(0)});
  for (std::int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<std::int64_t>(d.size()))
      im.fail_node("attribute 'perm' names axis {} of a {}-D input", axis, d.size());
    layer.mutable_permute_param()->add_order(static_cast<std::uint32_t>(axis));
  }
}

// Cuts `x` along `axis` at `points` (strictly increasing, inside the axis) into a Caffe
// Slice; `wanted` maps each piece to its blob, "" for a piece no node reads, which a
// Silence layer takes (so that its gradient is 0, not whatever its memory held).
void add_slice(Importer& im, const std::string& x, std::int64_t axis, const Dims& points,
               std::vector<std::string> tops) {
  std::vector<std::string> unused;
  for (std::size_t i = 0; i < tops.size(); ++i) {
    if (!tops[i].empty()) continue;
    tops[i] = im.fresh_value(fmt::format("{}/piece_{}", x, i));
    unused.push_back(tops[i]);
  }
  pb::LayerParameter& layer = im.add_layer("Slice", {x}, tops);
  layer.mutable_slice_param()->set_axis(static_cast<std::int32_t>(axis));
  for (std::int64_t p : points)
    layer.mutable_slice_param()->add_slice_point(static_cast<std::uint32_t>(p));
  if (!unused.empty()) im.add_layer("Silence", unused, {}, "/unused");
}

// Slice of an activation: along one axis past the batch, step 1.
void convert_slice(Importer& im) {
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  if (d.empty()) im.fail_node("the input's shape is not known");
  const std::int64_t rank = static_cast<std::int64_t>(d.size());
  Dims starts, ends, axes, steps;
  if (im.opset() < 10) {
    starts = im.attr_ints("starts", {});
    ends = im.attr_ints("ends", {});
    axes = im.attr_ints("axes", {});
  } else {
    starts = im.int_input(1, "starts");
    ends = im.int_input(2, "ends");
    if (im.has_input(3)) axes = im.int_input(3, "axes");
    if (im.has_input(4)) steps = im.int_input(4, "steps");
  }
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<std::int64_t>(i));
  if (starts.size() != ends.size() || axes.size() != starts.size())
    im.fail_node("starts, ends and axes of {}, {} and {} values", starts.size(), ends.size(),
                 axes.size());
  std::int64_t axis = -1, begin = 0, end = 0;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    std::int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank) im.fail_node("axis {} of a {}-D input", axes[i], rank);
    if (!steps.empty() && steps[i] != 1)
      im.fail_node("step {}: the importer slices with step 1", steps[i]);
    const std::int64_t n = d[static_cast<std::size_t>(a)];
    if (n < 0) im.fail_node("a slice along axis {}, whose size is not known", a);
    std::int64_t s = starts[i] < 0 ? starts[i] + n : starts[i];
    std::int64_t e = ends[i] < 0 ? ends[i] + n : ends[i];
    s = std::clamp(s, std::int64_t{0}, n);
    e = std::clamp(e, std::int64_t{0}, n);
    if (s == 0 && e == n) continue;  // the whole axis
    if (axis >= 0) im.fail_node("a slice along two axes ({} and {})", axis, a);
    if (a == 0) im.fail_node("a slice of the batch axis");
    if (e <= s) im.fail_node("an empty slice [{}, {}) of axis {}", s, e, a);
    axis = a;
    begin = s;
    end = e;
  }
  if (axis < 0) {
    im.alias(im.output(0), x);
    return;
  }
  if (im.join_slice(x, axis, begin, end)) return;
  const std::int64_t n = d[static_cast<std::size_t>(axis)];
  Dims points;
  std::vector<std::string> tops;
  if (begin > 0) {
    points.push_back(begin);
    tops.emplace_back();
  }
  tops.push_back(im.output(0));
  if (end < n) {
    points.push_back(end);
    tops.emplace_back();
  }
  add_slice(im, x, axis, points, tops);
}

// Split: a Caffe Slice at the sizes given (input 1 from opset 13, the attribute before) or
// in equal parts.
void convert_split(Importer& im) {
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  if (d.empty()) im.fail_node("the input's shape is not known");
  const std::int64_t rank = static_cast<std::int64_t>(d.size());
  std::int64_t axis = im.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis <= 0 || axis >= rank)
    im.fail_node("attribute 'axis' {}: the importer splits past the batch", axis);
  const std::int64_t n = d[static_cast<std::size_t>(axis)];
  const int count = im.node().output_size();
  Dims sizes = im.opset() >= 13 ? (im.has_input(1) ? im.int_input(1, "split") : Dims{})
                                : im.attr_ints("split", {});
  if (sizes.empty()) {
    if (n % count != 0) im.fail_node("{} outputs do not divide axis {} of {}", count, axis, n);
    sizes.assign(static_cast<std::size_t>(count), n / count);
  }
  if (static_cast<int>(sizes.size()) != count)
    im.fail_node("{} sizes for {} outputs", sizes.size(), count);
  Dims points;
  std::vector<std::string> tops;
  std::int64_t at = 0;
  for (int i = 0; i < count; ++i) {
    if (sizes[static_cast<std::size_t>(i)] <= 0)
      im.fail_node("a part of size {}", sizes[static_cast<std::size_t>(i)]);
    if (sizes[static_cast<std::size_t>(i)] > n - at)  // before the sum could overflow
      im.fail_node("sizes summing past the {} of axis {}", n, axis);
    if (i > 0) points.push_back(at);
    at += sizes[static_cast<std::size_t>(i)];
    const std::string& name = im.node().output(i);
    tops.push_back(name.empty() || !im.read_later(name) ? std::string() : name);
  }
  if (at != n) im.fail_node("sizes summing to {} along an axis of {}", at, n);
  add_slice(im, x, axis, points, tops);
}

// ReduceMean over the two spatial axes of a 4-D input: a global average Pooling (then a
// Flatten without keepdims).
void convert_reduce_mean(Importer& im) {
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  Dims axes = im.attr_ints("axes", {});
  for (std::int64_t& a : axes)
    if (a < 0) a += static_cast<std::int64_t>(d.size());
  std::sort(axes.begin(), axes.end());
  if (d.size() != 4 || axes != Dims{2, 3})
    im.fail_node(
        "axes {} of an input of shape {}: the importer averages over the spatial axes of 4-D "
        "inputs",
        dims_text(im.attr_ints("axes", {})), dims_text(d));
  const bool keep = im.attr_int("keepdims", 1) != 0;
  const std::string pooled = keep ? im.output(0) : im.fresh_value(im.output(0) + "/pooled");
  pb::LayerParameter& pool = im.add_layer("Pooling", {x}, {pooled}, keep ? "" : "/pool");
  pool.mutable_pooling_param()->set_pool(pb::PoolingParameter::AVE);
  pool.mutable_pooling_param()->set_global_pooling(true);
  if (!keep) im.add_layer("Flatten", {pooled}, {im.output(0)});
}

// Squeeze and Unsqueeze of an activation: a Reshape to the new shape, the batch copied.
void convert_squeeze(Importer& im) {
  const bool un = im.node().op_type() == "Unsqueeze";
  const std::string x = im.activation(0);
  const Dims d = im.dims_of(x);
  if (d.empty()) im.fail_node("the input's shape is not known");
  Dims axes = im.opset() >= 13 ? (im.has_input(1) ? im.int_input(1, "axes") : Dims{})
                               : im.attr_ints("axes", {});
  const std::int64_t rank = static_cast<std::int64_t>(d.size() + (un ? axes.size() : 0));
  for (std::int64_t& a : axes)
    if (a < 0) a += rank;
  Dims shape;
  if (un) {
    shape = d;
    std::sort(axes.begin(), axes.end());
    for (std::int64_t a : axes) {
      if (a <= 0 || a > static_cast<std::int64_t>(shape.size()))
        im.fail_node("axis {}: the importer keeps the batch first", a);
      shape.insert(shape.begin() + a, 1);
    }
  } else {
    for (std::size_t i = 0; i < d.size(); ++i) {
      const bool listed =
          axes.empty() ? d[i] == 1 && i > 0
                       : std::count(axes.begin(), axes.end(), static_cast<std::int64_t>(i)) > 0;
      if (listed && (i == 0 || d[i] != 1))
        im.fail_node("axis {} of shape {} cannot be squeezed", i, dims_text(d));
      if (!listed) shape.push_back(d[i]);
    }
  }
  shape[0] = 0;  // the batch
  pb::LayerParameter& layer = im.add_layer("Reshape", {x}, {im.output(0)});
  for (std::int64_t v : shape)
    layer.mutable_reshape_param()->mutable_shape()->add_dim(v);
}

struct Operator {
  const char* name;
  Converter convert;
};

// Every operator the importer reads (docs/onnx.md lists them with their attributes).
constexpr Operator kOperators[] = {
    {"AveragePool", convert_pool},
    {"BatchNormalization", convert_batch_norm},
    {"Add", convert_add},
    {"Clip", convert_clip},
    {"Concat", convert_concat},
    {"Constant", convert_constant},
    {"Conv", convert_conv},
    {"ConvTranspose", convert_conv_transpose},
    {"Div", convert_div},
    {"Dropout", convert_identity},
    {"Flatten", convert_flatten},
    {"Gemm", convert_gemm},
    {"GlobalAveragePool", convert_pool},
    {"GlobalMaxPool", convert_pool},
    {"HardSigmoid", convert_hard_sigmoid},
    {"HardSwish", convert_hard_sigmoid},
    {"Identity", convert_identity},
    {"LeakyRelu", convert_relu},
    {"LogSoftmax", convert_softmax},
    {"LRN", convert_lrn},
    {"MatMul", convert_gemm},
    {"Max", convert_max},
    {"MaxPool", convert_pool},
    {"Pad", convert_pad},
    {"Mul", convert_mul},
    {"Relu", convert_relu},
    {"Reshape", convert_reshape},
    {"Sigmoid", convert_unary},
    {"ReduceMean", convert_reduce_mean},
    {"Slice", convert_slice},
    {"Softmax", convert_softmax},
    {"Split", convert_split},
    {"Squeeze", convert_squeeze},
    {"Sub", convert_sub},
    {"Transpose", convert_transpose},
    {"Unsqueeze", convert_squeeze},
    {"Tanh", convert_unary},
};

std::string operator_names() {
  std::vector<std::string> names;
  for (const Operator& op : kOperators)
    names.emplace_back(op.name);
  std::sort(names.begin(), names.end());
  std::string text;
  for (const std::string& name : names)
    text += (text.empty() ? "" : ", ") + name;
  return text;
}

// ---- the model ----------------------------------------------------------------------------

// The graph inputs' declared shapes; every other value's shape comes from infer_dims, never
// from the file's value_info (a file may lie) nor from ONNX's shape inference (libonnx 1.12's
// crashes on some malformed models: the fuzzer found one in its Conv inference).
void Importer::read_dims() {
  for (const onnx::ValueInfoProto& info : model_.graph().input()) {
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) continue;
    Dims dims;
    for (const onnx::TensorShapeProto::Dimension& d : info.type().tensor_type().shape().dim())
      dims.push_back(d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : -1);
    dims_[info.name()] = dims;
  }
}

namespace {

// a * b and a + b of dimensions: -1 when either is unknown or the result overflows.
std::int64_t times(std::int64_t a, std::int64_t b) {
  std::int64_t result = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &result)) return -1;
  return result;
}
std::int64_t plus(std::int64_t a, std::int64_t b) {
  std::int64_t result = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &result)) return -1;
  return result;
}

// Product of dims, -1 when one is unknown.
std::int64_t product(Dims::const_iterator begin, Dims::const_iterator end) {
  std::int64_t total = 1;
  for (auto it = begin; it != end; ++it)
    total = times(total, *it);
  return total;
}

// Caffe's output size of a window (convolution: floor; pooling: its round mode, and the
// last window dropped when it starts in the padding of a padded input); -1 when unknown.
std::int64_t window_output(std::int64_t in, std::int64_t extent, std::int64_t stride,
                           std::int64_t pad, bool ceil, bool padded) {
  // Graph inputs are at most kMaxDim and attributes kMaxAttribute: no overflow below.
  if (in < 0 || in > kMaxDim || stride < 1 || in + 2 * pad < extent) return -1;
  const std::int64_t span = in + 2 * pad - extent;
  std::int64_t out = (ceil ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil && padded && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

// The top shapes of a layer the converters made, from its bottoms' by Caffe's rules (the
// types the importer makes only); unknown dimensions stay -1 (the batch, or past an unknown).
void Importer::infer_dims(const pb::LayerParameter& layer) {
  std::vector<Dims> in;
  for (const std::string& bottom : layer.bottom())
    in.push_back(dims_of(bottom));
  Dims out = in.empty() ? Dims{} : in[0];
  const std::string& type = layer.type();
  if (in.empty() || in[0].empty()) {
    out.clear();
  } else if (type == "Convolution" && in[0].size() == 4) {
    const pb::ConvolutionParameter& p = layer.convolution_param();
    const std::int64_t dil_h = p.dilation_size() > 0 ? p.dilation(0) : 1;
    const std::int64_t dil_w = p.dilation_size() > 1 ? p.dilation(1) : dil_h;
    out = {in[0][0], p.num_output(),
           window_output(in[0][2], dil_h * (p.kernel_h() - 1) + 1, p.stride_h(), p.pad_h(), false,
                         false),
           window_output(in[0][3], dil_w * (p.kernel_w() - 1) + 1, p.stride_w(), p.pad_w(), false,
                         false)};
  } else if (type == "Deconvolution" && in[0].size() == 4) {
    const pb::ConvolutionParameter& p = layer.convolution_param();
    const std::int64_t dil_h = p.dilation_size() > 0 ? p.dilation(0) : 1;
    const std::int64_t dil_w = p.dilation_size() > 1 ? p.dilation(1) : dil_h;
    const std::int64_t extra_h = p.output_pad_size() > 0 ? p.output_pad(0) : 0;
    const std::int64_t extra_w = p.output_pad_size() > 1 ? p.output_pad(1) : extra_h;
    const auto size = [](std::int64_t n, std::int64_t stride, std::int64_t extent, std::int64_t pad,
                         std::int64_t extra) -> std::int64_t {
      return n < 0 ? -1 : stride * (n - 1) + extent - 2 * pad + extra;
    };
    out = {in[0][0], p.num_output(),
           size(in[0][2], p.stride_h(), dil_h * (p.kernel_h() - 1) + 1, p.pad_h(), extra_h),
           size(in[0][3], p.stride_w(), dil_w * (p.kernel_w() - 1) + 1, p.pad_w(), extra_w)};
  } else if (type == "Pad") {
    const auto counts =
        detail::pad_counts(layer.pad_param(), static_cast<std::int64_t>(out.size()));
    for (std::size_t a = 0; a < out.size(); ++a) {
      std::int64_t& d = out[a];
      d = !counts || d < 0 ? -1 : d + counts->first[a] + counts->second[a];
    }
  } else if (type == "Pooling" && in[0].size() == 4) {
    const pb::PoolingParameter& p = layer.pooling_param();
    if (p.global_pooling()) {
      out = {in[0][0], in[0][1], 1, 1};
    } else {
      const bool ceil = p.round_mode() == pb::PoolingParameter::CEIL;
      const bool padded = p.pad_h() > 0 || p.pad_w() > 0;
      out = {in[0][0], in[0][1],
             window_output(in[0][2], p.kernel_h(), p.stride_h(), p.pad_h(), ceil, padded),
             window_output(in[0][3], p.kernel_w(), p.stride_w(), p.pad_w(), ceil, padded)};
    }
  } else if (type == "InnerProduct") {
    out = {in[0][0], layer.inner_product_param().num_output()};
  } else if (type == "Permute") {
    out.clear();
    for (std::uint32_t axis : layer.permute_param().order())
      out.push_back(axis < in[0].size() ? in[0][axis] : -1);
  } else if (type == "Slice") {
    const auto axis = static_cast<std::size_t>(layer.slice_param().axis());
    std::int64_t previous = 0;
    for (int t = 0; t < layer.top_size() && axis < out.size(); ++t) {
      const std::int64_t next = t < layer.slice_param().slice_point_size()
                                    ? layer.slice_param().slice_point(t)
                                    : in[0][axis];
      Dims piece = in[0];
      piece[axis] = in[0][axis] < 0 ? -1 : next - previous;
      dims_[layer.top(t)] = piece;
      previous = next;
    }
    return;
  } else if (type == "Flatten") {
    out = {in[0][0], product(in[0].begin() + 1, in[0].end())};
  } else if (type == "Concat" || type == "ShuffleChannel") {
    const auto axis =
        type == "Concat" ? static_cast<std::size_t>(layer.concat_param().axis()) : std::size_t{1};
    for (std::size_t i = 1; i < in.size() && axis < out.size(); ++i)
      out[axis] = in[i].size() == out.size() ? plus(out[axis], in[i][axis]) : -1;
  } else if (type == "Reshape") {
    // Caffe's: 0 copies the input's dimension, -1 takes what is left (an unknown input
    // dimension copied by a 0 cancels out).
    const pb::BlobShape& shape = layer.reshape_param().shape();
    const Dims& x = in[0];
    out.clear();
    int infer = -1;
    std::int64_t fixed = 1;
    for (int i = 0; i < shape.dim_size(); ++i) {
      const std::int64_t d = shape.dim(i);
      const auto at = static_cast<std::size_t>(i);
      if (d == 0) {
        out.push_back(at < x.size() ? x[at] : -1);
        continue;
      }
      out.push_back(d > 0 ? d : -1);
      if (d == -1)
        infer = i;
      else
        fixed = times(fixed, d > 0 ? d : -1);
    }
    std::int64_t rest = 1;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const bool copied =
          static_cast<int>(i) < shape.dim_size() && shape.dim(static_cast<int>(i)) == 0;
      if (!copied) rest = times(rest, x[i]);
    }
    if (infer >= 0 && rest >= 0 && fixed > 0 && rest % fixed == 0)
      out[static_cast<std::size_t>(infer)] = rest / fixed;
  }
  // Every other type the importer makes keeps its first bottom's shape (element-wise layers,
  // Scale, BatchNorm, LRN, Softmax, LogSoftmax, Swish, ...).
  for (const std::string& top : layer.top())
    dims_[top] = out;
}

void Importer::add_inputs() {
  for (const onnx::ValueInfoProto& info : model_.graph().input()) {
    if (constants_.count(info.name()) > 0) continue;  // an initializer listed as an input
    if (!info.type().has_tensor_type() ||
        info.type().tensor_type().elem_type() != onnx::TensorProto::FLOAT)
      fail("{}: graph input '{}' is not a float tensor", path_, info.name());
    Dims dims = dims_of(info.name());
    if (dims.empty()) fail("{}: graph input '{}' has no shape", path_, info.name());
    for (std::size_t i = 1; i < dims.size(); ++i)
      if (dims[i] < 1 || dims[i] > kMaxDim)
        fail(
            "{}: graph input '{}' of shape {}: only the batch (the first) dimension may be "
            "symbolic, and each must be at most {}",
            path_, info.name(), dims_text(dims), kMaxDim);
    if (dims[0] > kMaxDim)
      fail("{}: graph input '{}': batch {} is too large", path_, info.name(), dims[0]);
    if (dims[0] < 1) dims[0] = 1;  // NetOptions::batch_size sets it
    pb::LayerParameter& layer = *net_.add_layer();
    layer.set_name(info.name());
    layer_names_.insert(info.name());
    layer.set_type("Input");
    layer.add_top(info.name());
    known_.insert(info.name());
    graph_inputs_.insert(info.name());
    pb::BlobShape& shape = *layer.mutable_input_param()->add_shape();
    for (std::int64_t d : dims)
      shape.add_dim(d);
  }
}

OnnxModel Importer::run() {
  for (const onnx::OperatorSetIdProto& set : model_.opset_import()) {
    if (set.domain().empty() || set.domain() == "ai.onnx") opset_ = set.version();
  }
  if (opset_ < kMinOpset || opset_ > kMaxOpset)
    fail("{}: opset {} of the default domain; the importer reads opsets {} to {}", path_, opset_,
         kMinOpset, kMaxOpset);
  const onnx::GraphProto& graph = model_.graph();
  net_.set_name(graph.name().empty() ? std::filesystem::path(path_).stem().string() : graph.name());
  for (const onnx::TensorProto& init : graph.initializer())
    set_constant(init.name(), init);
  if (graph.sparse_initializer_size() > 0)
    fail("{}: sparse initializers ('{}') are not supported", path_,
         graph.sparse_initializer(0).values().name());
  for (const onnx::NodeProto& n : graph.node()) {
    for (const std::string& in : n.input()) {
      consumed_.insert(in);
      graph_values_.insert(in);
      ++readers_[in];
      if (n.op_type() != "Shape") ++value_readers_[in];
    }
    graph_values_.insert(n.output().begin(), n.output().end());
  }
  for (const onnx::ValueInfoProto& in : graph.input())
    graph_values_.insert(in.name());
  for (const onnx::ValueInfoProto& out : graph.output()) {
    consumed_.insert(out.name());
    outputs_.insert(out.name());
  }
  read_dims();
  add_inputs();
  std::map<std::string, int> names;  // layer names used, to keep them unique
  for (int index = 0; index < graph.node_size(); ++index) {
    const onnx::NodeProto& n = graph.node(index);
    node_ = NodeState{
        &n, index, n.name().empty() ? fmt::format("{}_{}", n.op_type(), index) : n.name(), {}};
    if (names[node_.name]++ > 0) node_.name += fmt::format("_{}", index);
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      fail_node("operator domain '{}': the importer reads the default domain only", n.domain());
    if (!fold_integers()) {
      const Operator* op = nullptr;
      for (const Operator& candidate : kOperators)
        if (n.op_type() == candidate.name) op = &candidate;
      if (op == nullptr)
        fail_node("operator '{}' is not supported (supported: {})", n.op_type(), operator_names());
      const int first_layer = net_.layer_size();
      op->convert(*this);
      for (int l = first_layer; l < net_.layer_size(); ++l)
        infer_dims(net_.layer(l));
    }
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (node_.read.count(a.name()) == 0)
        fail_node("attribute '{}' is not supported for {}", a.name(), n.op_type());
    }
  }
  fold_shuffle_slices();
  OnnxModel model;
  for (const pb::LayerParameter& layer : net_.layer())
    if (layer.has_input_param()) model.inputs.push_back(layer.top(0));
  for (const onnx::ValueInfoProto& out : graph.output()) {
    const std::string name = resolve(out.name());
    if (constants_.count(name) > 0) fail("{}: graph output '{}' is a constant", path_, out.name());
    if (known_.count(name) == 0)
      fail("{}: graph output '{}' is computed by no node", path_, out.name());
    model.outputs.push_back(name);
  }
  model.net = std::move(net_);
  return model;
}

}  // namespace

OnnxModel read_onnx_model(const std::string& path) {
  onnx::ModelProto model;
  read_binary_proto(path, model);
  try {
    // onnx::checker::check_model(model), with the model's folder for its external data.
    HN_CHECK(model.ir_version() >= 3, "{}: IR version {}: the importer reads 3 and later", path,
             model.ir_version());
    onnx::checker::CheckerContext context;
    context.set_ir_version(static_cast<int>(model.ir_version()));
    std::unordered_map<std::string, int> opsets;
    for (const onnx::OperatorSetIdProto& set : model.opset_import())
      opsets[set.domain()] = static_cast<int>(set.version());
    context.set_opset_imports(opsets);
    context.set_model_dir(std::filesystem::path(path).parent_path().string());
    onnx::checker::LexicalScopeContext scope;
    onnx::checker::check_graph(model.graph(), context, scope);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& failure) {
    fail("{}: not a valid ONNX model: {}", path, failure.what());
  }
  return Importer(path, model).run();
}

#endif

}  // namespace hn::detail

namespace hn {

void onnx_to_caffe(const std::string& onnx_path, const std::string& prototxt_path,
                   const std::string& caffemodel_path) {
  const detail::OnnxModel model = detail::read_onnx_model(onnx_path);
  detail::pb::NetParameter layers = model.net;
  for (detail::pb::LayerParameter& layer : *layers.mutable_layer())
    layer.clear_blobs();
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(layers, &text))
    detail::fail("{}: its net could not be written as text", onnx_path);
  text = fmt::format("# {} as Caffe's prototxt (hybridnn convert); weights in {}\n{}", onnx_path,
                     caffemodel_path, text);
  detail::write_binary_proto(caffemodel_path, model.net);
  detail::replace_file(prototxt_path, text, "the converted prototxt");
}

}  // namespace hn

namespace hn::detail {

void expand_onnx_layers(pb::NetParameter& net, const std::string& origin) {
  bool any = false;
  for (const pb::LayerParameter& layer : net.layer())
    any = any || layer.type() == "ONNX";
  if (!any) return;
  pb::NetParameter expanded = net;
  expanded.clear_layer();
  for (const pb::LayerParameter& layer : net.layer()) {
    if (layer.type() != "ONNX") {
      *expanded.add_layer() = layer;
      continue;
    }
    const std::string where = fmt::format("{}: layer '{}' (ONNX)", origin, layer.name());
    HN_CHECK(layer.onnx_param().has_source(), "{}: onnx_param {{ source: \"FILE\" }} is missing",
             where);
    std::filesystem::path source(layer.onnx_param().source());
    if (source.is_relative()) {
      const std::filesystem::path beside = std::filesystem::path(origin).parent_path() / source;
      std::error_code error;
      if (std::filesystem::exists(beside, error)) source = beside;
    }
    OnnxModel model;
    try {
      model = read_onnx_model(source.string());
    } catch (const Error& failure) {
      fail("{}: {}", where, failure.what());
    }
    HN_CHECK(layer.bottom_size() == static_cast<int>(model.inputs.size()) &&
                 layer.top_size() == static_cast<int>(model.outputs.size()),
             "{}: {} bottom(s) and {} top(s), but the model '{}' has {} input(s) and {} "
             "output(s)",
             where, layer.bottom_size(), layer.top_size(), source.string(), model.inputs.size(),
             model.outputs.size());
    std::map<std::string, std::string> renamed;
    for (std::size_t i = 0; i < model.inputs.size(); ++i)
      renamed[model.inputs[i]] = layer.bottom(static_cast<int>(i));
    for (std::size_t i = 0; i < model.outputs.size(); ++i)
      renamed[model.outputs[i]] = layer.top(static_cast<int>(i));
    // "LAYER/NAME" (PyTorch's names start with a slash already: "/layer1/conv1/Conv").
    const auto prefixed = [&](const std::string& name) {
      return layer.name() + (name.rfind('/', 0) == 0 ? "" : "/") + name;
    };
    const auto rename = [&](const std::string& blob) {
      auto found = renamed.find(blob);
      return found != renamed.end() ? found->second : prefixed(blob);
    };
    for (pb::LayerParameter& inner : *model.net.mutable_layer()) {
      if (inner.has_input_param()) continue;
      inner.set_name(prefixed(inner.name()));
      for (std::string& bottom : *inner.mutable_bottom())
        bottom = rename(bottom);
      for (std::string& top : *inner.mutable_top())
        top = rename(top);
      *inner.mutable_include() = layer.include();
      *inner.mutable_exclude() = layer.exclude();
      if (layer.has_phase()) inner.set_phase(layer.phase());
      expanded.add_layer()->Swap(&inner);
    }
  }
  net.Swap(&expanded);
}

}  // namespace hn::detail
