// The Net's fusion of layers (NetOptions::fuse_layers). A convolution followed in place by
// a BatchNorm on stored statistics and a per-channel Scale takes both into its weights and
// bias (Layer::fold_norm, lib/layers/norm_fold.h: the Net derives them before the forward
// and turns their gradients into the sources' after the backward), and a rectifier after
// them as its activation: ResNet-50's and MobileNet v1's chains, one after every
// convolution but the last, then cost no pass over their blobs forward (apart, the three
// layers read and write each activation about eight times per iteration). Any other
// in-place chain BatchNorm on stored statistics -> Scale per channel [-> ReLU] runs as the
// Scale's calls (ScaleLayer::fuse_norm), one pass over the blob each way. An Eltwise SUM followed
// by a ReLU in place on its output (the end of every residual block) runs as the Eltwise's
// calls (EltwiseLayer::fuse_relu). A ReLU (slope >= 0) or a Clip in place on a
// convolution's output runs as the convolution's calls (ConvolutionLayer::fuse_activation):
// on the CPU driver inside oneDNN's convolution, which applies it while the output is in
// registers (MobileNet v2's ReLU6 after each convolution took a fifth of its forward). An
// Eltwise SUM of two inputs that a convolution's output alone feeds, the other input
// computed before the convolution, runs as the convolution's calls with the rectifier in
// place after it (ConvolutionLayer::fuse_residual, Driver::conv_forward_residual): the end
// of ResNet's bottleneck and of MobileNet v2's inverted residual, as ONNX Runtime fuses it.
// The convolution runs where it did, writing the sum's output; its own output blob is
// never written (BlobVersion::summed_by).
//
// The chain must be in place on one blob (so the Scale's operands are the BatchNorm's input
// and the ReLU's output, the same memory) with each version consumed only by the next layer
// of the chain and no loss weight, and every layer of it cut alike: unsplit on the Net's
// driver, the same split, or all automatic (in-place layers take the split of the layer
// before them, so the fused ones take the Scale's or Eltwise's: calibrate_layer). The
// fused Scale runs where the Scale would, each device on its rows; nothing else reads the
// chain's blob between the BatchNorm and the ReLU, so running their work there changes no
// other layer's inputs.
#include "lib/layers/registry.h"
#include "lib/net/net_impl.h"

#include <algorithm>

namespace hn {

namespace {

FusionRole role(const NetLayer& nl) {
  return nl.layer && nl.type != nullptr ? nl.type->fusion : FusionRole::none;
}

}  // namespace

void Net::Impl::plan_fusion() {
  for (BlobVersion& blob : blobs) {
    blob.gradient_fused_by.clear();
    blob.summed_by.clear();
  }
  for (NetLayer& nl : layers) {
    nl.fused_into = nl.fused_norm = nl.fused_residual = nl.folded_norm = nl.folded_scale = -1;
    nl.folded.reset();
    if (role(nl) == FusionRole::affine) nl.layer->fuse_norm(std::nullopt);
    if (role(nl) == FusionRole::sum) nl.layer->fuse_relu(std::nullopt);
    if (role(nl) == FusionRole::conv) {
      nl.layer->fuse_activation(std::nullopt);
      nl.layer->fuse_residual(std::nullopt);
      if (nl.layer->can_fold_norm()) nl.layer->fold_norm(std::nullopt);
    }
  }
  if (!options.fuse_layers) return;
  // A layer that computes one top, by rows (not cut by outputs), with no loss weight.
  const auto runs_alone = [&](int l) {
    const NetLayer& nl = layers[static_cast<std::size_t>(l)];
    bool no_loss = true;
    for (float weight : nl.loss_weights)
      no_loss = no_loss && weight == 0.0f;
    return nl.kind == Kind::compute && nl.output_cut.empty() && !nl.across_ranks && no_loss &&
           nl.tops.size() == 1;
  };
  const auto plain = [&](int l) {
    return runs_alone(l) && layers[static_cast<std::size_t>(l)].bottoms.size() == 1;
  };
  // Whether two layers run on the same rows of the same devices.
  const auto cut_alike = [&](int a, int b) {
    const NetLayer& x = layers[static_cast<std::size_t>(a)];
    const NetLayer& y = layers[static_cast<std::size_t>(b)];
    if (x.automatic || y.automatic) return x.automatic && y.automatic;
    return x.split.to_string() == y.split.to_string();
  };
  // The layer after `l` in an in-place chain: the only consumer of its top, in place too,
  // cut as `l` is.
  const auto next_in_place = [&](int l) {
    const NetLayer& nl = layers[static_cast<std::size_t>(l)];
    const BlobVersion& top = blobs[static_cast<std::size_t>(nl.tops[0])];
    if (top.keep || top.consumers.size() != 1) return -1;
    const int next = top.consumers[0];
    if (!plain(next) || !cut_alike(l, next)) return -1;
    const NetLayer& after = layers[static_cast<std::size_t>(next)];
    return blobs[static_cast<std::size_t>(after.tops[0])].data_group == top.data_group ? next : -1;
  };
  // The rectifier's slope when layer `l` is one (y > 0 must mean x > 0 for the gradient read
  // from y: slope >= 0).
  const auto rectifier = [&](int l) -> std::optional<float> {
    if (l < 0) return std::nullopt;
    const NetLayer& nl = layers[static_cast<std::size_t>(l)];
    if (role(nl) != FusionRole::rectifier) return std::nullopt;
    const std::optional<float> slope = nl.layer->rectifier_slope();
    return slope && *slope >= 0.0f ? slope : std::nullopt;
  };
  // The activation a rectifier in place after layer `l` computes, when the layer before it
  // may compute it instead and its output is not asked for (its gradient would be left as
  // the rectifier's input gradient); `index` is set to the rectifier's.
  const auto fusable_after = [&](int l, int& index) -> std::optional<Activation> {
    index = next_in_place(l);
    if (index < 0) return std::nullopt;
    const NetLayer& rectifier_layer = layers[static_cast<std::size_t>(index)];
    if (role(rectifier_layer) != FusionRole::rectifier) return std::nullopt;
    if (blobs[static_cast<std::size_t>(rectifier_layer.tops[0])].keep) return std::nullopt;
    return rectifier_layer.layer->fusable_activation();
  };
  // The rectifier in place after layer `after`, where fusable_after finds one, becomes the
  // activation of convolution `c`.
  const auto take_rectifier_after = [&](int after, int c) {
    int index = -1;
    const std::optional<Activation> activation = fusable_after(after, index);
    if (!activation) return;
    NetLayer& rectifier_layer = layers[static_cast<std::size_t>(index)];
    layers[static_cast<std::size_t>(c)].layer->fuse_activation(
        Layer::FusedActivation{rectifier_layer.param.name(), *activation});
    rectifier_layer.fused_into = c;
  };
  // A convolution, then in place a BatchNorm on stored statistics and a per-channel Scale
  // [and a rectifier]: the two folded into its weights and bias (lib/layers/norm_fold.h),
  // the rectifier its fused activation, so that no pass over the blob is left. Its
  // gradients are the Scale's, so both must have backward or neither.
  std::size_t fold_scratch_floats = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& conv = layers[l];
    const int c = static_cast<int>(l);
    if (role(conv) != FusionRole::conv || !conv.layer->can_fold_norm() || !plain(c)) continue;
    const int n = next_in_place(c);
    if (n < 0 || role(layers[static_cast<std::size_t>(n)]) != FusionRole::norm) continue;
    NetLayer& norm = layers[static_cast<std::size_t>(n)];
    const std::optional<float> eps = norm.layer->stored_norm_eps(options.state.phase);
    const int a = next_in_place(n);
    if (!eps || a < 0) continue;
    NetLayer& affine = layers[static_cast<std::size_t>(a)];
    if (role(affine) != FusionRole::affine || !affine.layer->can_fuse_norm() ||
        affine.needs_backward != conv.needs_backward)
      continue;
    take_rectifier_after(a, c);
    conv.layer->fold_norm(Layer::FoldedNorm{norm.param.name(), affine.param.name()});
    norm.fused_into = affine.fused_into = c;
    conv.folded_norm = n;
    conv.folded_scale = a;
    conv.folded = std::make_unique<NetLayer::Folded>();
    const Shape& weights = conv.params[0]->shape();
    const index_t outputs = weights[0];
    conv.folded->weights = Tensor(weights);
    conv.folded->bias = Tensor(Shape{outputs});
    conv.folded->channels = Tensor(Shape{norm_fold_channel_floats(outputs)});
    conv.folded->eps = *eps;
    fold_scratch_floats = std::max(fold_scratch_floats, static_cast<std::size_t>(2 * outputs));
  }
  fold_scratch = Tensor(Shape{static_cast<index_t>(fold_scratch_floats)});
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const int norm_index = static_cast<int>(l);
    if (role(layers[l]) != FusionRole::norm || !plain(norm_index) || layers[l].fused_into >= 0)
      continue;
    const std::optional<float> eps = layers[l].layer->stored_norm_eps(options.state.phase);
    if (!eps || blobs[static_cast<std::size_t>(layers[l].tops[0])].data_group !=
                    blobs[static_cast<std::size_t>(layers[l].bottoms[0])].data_group) {
      continue;
    }
    const int affine_index = next_in_place(norm_index);
    if (affine_index < 0) continue;
    NetLayer& affine = layers[static_cast<std::size_t>(affine_index)];
    if (role(affine) != FusionRole::affine || !affine.layer->can_fuse_norm()) continue;
    Layer::FusedNorm fused;
    fused.batch_norm = layers[l].param.name();
    fused.eps = *eps;
    const int relu_index = next_in_place(affine_index);
    if (const std::optional<float> slope = rectifier(relu_index)) {
      fused.relu = layers[static_cast<std::size_t>(relu_index)].param.name();
      fused.relu_slope = *slope;
      layers[static_cast<std::size_t>(relu_index)].fused_into = affine_index;
    }
    affine.layer->fuse_norm(fused);
    layers[l].fused_into = affine_index;
    affine.fused_norm = norm_index;
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& sum = layers[l];
    const int s = static_cast<int>(l);
    if (role(sum) != FusionRole::sum || !sum.layer->is_plain_sum() || !runs_alone(s) ||
        sum.bottoms.size() != 2)
      continue;
    // Of the two inputs, the one computed last (ResNet's first block of a stage computes
    // its shortcut's convolution after conv3).
    const int p0 = blobs[static_cast<std::size_t>(sum.bottoms[0])].producer;
    const int p1 = blobs[static_cast<std::size_t>(sum.bottoms[1])].producer;
    const std::size_t mine = p0 > p1 ? 0 : 1;
    BlobVersion& own = blobs[static_cast<std::size_t>(sum.bottoms[mine])];
    const BlobVersion& other = blobs[static_cast<std::size_t>(sum.bottoms[1 - mine])];
    const BlobVersion& out = blobs[static_cast<std::size_t>(sum.tops[0])];
    if (own.producer < 0 || p0 == p1) continue;
    // The convolution computing it: its producer, or the convolution that the producer, a
    // Scale with no rectifier after it, is folded into (its output is then the Scale's).
    int c = own.producer;
    const int host = layers[static_cast<std::size_t>(c)].fused_into;
    if (host >= 0 && layers[static_cast<std::size_t>(host)].folded_scale == c) c = host;
    NetLayer& conv = layers[static_cast<std::size_t>(c)];
    // The other input must be computed before the convolution runs.
    const int other_at = other.producer >= 0 ? computed_by(other.producer) : other.producer;
    if (role(conv) != FusionRole::conv || !conv.layer->can_fuse_residual() || !runs_alone(c) ||
        output_of(c) != sum.bottoms[mine] || other_at >= c || own.keep ||
        own.consumers.size() != 1 || !cut_alike(c, s) ||
        conv.needs_backward != sum.needs_backward || out.data_group == other.data_group ||
        own.layout != out.layout || other.layout != out.layout)
      continue;
    take_rectifier_after(s, c);
    conv.layer->fuse_residual(Layer::FusedResidual{sum.param.name()});
    conv.fused_residual = s;
    sum.fused_into = c;
    // Neither the convolution's output nor, folded, the BatchNorm's and Scale's are written.
    own.summed_by = conv.param.name();
    for (const int chained : {c, conv.folded_norm}) {
      if (chained >= 0 && conv.folded_scale >= 0)
        blobs[static_cast<std::size_t>(layers[static_cast<std::size_t>(chained)].tops[0])]
            .summed_by = conv.param.name();
    }
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& sum = layers[l];
    if (role(sum) != FusionRole::sum || !sum.layer->can_fuse_relu() || sum.fused_into >= 0 ||
        !runs_alone(static_cast<int>(l)))
      continue;
    const int relu_index = next_in_place(static_cast<int>(l));
    const std::optional<float> slope = rectifier(relu_index);
    if (!slope) continue;
    NetLayer& relu_layer = layers[static_cast<std::size_t>(relu_index)];
    // The blob's gradient would be left unrectified: a blob the caller asked to read (an
    // output or keep_blobs) keeps the two layers apart, so that it holds Caffe's.
    BlobVersion& rectified = blobs[static_cast<std::size_t>(relu_layer.tops[0])];
    if (rectified.keep) continue;
    rectified.gradient_fused_by = relu_layer.param.name();
    sum.layer->fuse_relu(Layer::FusedRelu{relu_layer.param.name(), *slope});
    relu_layer.fused_into = static_cast<int>(l);
  }
  // The convolution turns the blob's gradient into the rectifier's input gradient in place,
  // as the in-place layer would, but on each device's copy of its rows: a blob the caller
  // asked to read keeps the two layers apart.
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& conv = layers[l];
    if (role(conv) != FusionRole::conv || !conv.layer->can_fuse_activation() ||
        conv.fused_residual >= 0 || !runs_alone(static_cast<int>(l)))
      continue;
    take_rectifier_after(static_cast<int>(l), static_cast<int>(l));
  }
}

}  // namespace hn
