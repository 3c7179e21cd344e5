"""Differential test against PyTorch: randomized, seeded configurations of every layer type
the library has, each run through the bindings on the cpu driver, the reference driver and
a split of the batch between the two, and compared with a float64 reference written in
PyTorch from the same float32 values: output shapes, forward values (max abs difference over
max |reference| <= 1e-4) and every gradient, of inputs and parameters (relative L2 error
<= 1e-3), against torch.autograd. Where Caffe's convention differs from PyTorch's, the
reference says so and follows Caffe's source (BVLC/caffe, src/caffe/layers/*.cpp).

Layer types covered (lib/net/layer_factory.cpp lists 29, all of them): Accuracy (forward
only: it has no gradient), BatchNorm, Clip, Concat, Convolution, Deconvolution, Dropout, Eltwise,
EuclideanLoss,
Flatten, InnerProduct, LogSoftmax, LRN, Pad, Permute, Pooling, ReLU, Reshape, Scale, Sigmoid,
ShuffleChannel, SigmoidCrossEntropyLoss, Silence, Slice, Softmax, SoftmaxWithLoss, Split, Swish,
TanH. Left out: the data
layers (Input, DummyData, Data, ...), which take no bottoms and are handled by the Net, not
computable as a standalone layer. A new layer type needs a generator in GENERATORS;
test_every_layer_type_has_a_generator fails until it has one.

Each configuration is its own test, `test_layer_matches_pytorch[Convolution-017]`: its
random stream is seeded by (SEED, the type's name, the index), so an id reproduces alone and
adding configurations does not change the others. A failure prints the prototxt, the input
shapes, the phase, the split and every error.

Skipped visibly without python3-torch.
"""
import dataclasses
import math
import re
import zlib

import numpy as np
import pytest

import hybridnn as hn

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
F = torch.nn.functional

SEED = 20240611
FORWARD_TOLERANCE = 1e-4  # max |got - want| / max |want|
GRADIENT_TOLERANCE = 1e-3  # ||got - want||_2 / ||want||_2
TINY = 1e-12  # floor of the denominators, so an all-zero reference needs an exact zero
# Input diffs start at SENTINEL: backward must overwrite them where propagate_down is true
# and, as Caffe does, leave them alone where it is false.
SENTINEL = 7.0
FLT_MIN = float(np.finfo(np.float32).tiny)


def f32(value):
    """A prototxt number as the library holds it: float32, widened exactly."""
    return float(np.float32(value))


def number(value):
    """A float for a prototxt: Python's shortest repr, which reads back as the same value
    (the generators round what they draw, so it stays short)."""
    return repr(float(value))


def normal(rng, shape, scale=1.0, shift=0.0):
    return np.array(rng.standard_normal(shape) * scale + shift, np.float32)


def integers(rng, shape, low=-3, high=3):
    """Small integers as floats: equal values, so the tie rules are exercised."""
    return np.array(rng.randint(low, high + 1, size=shape), np.float32)


def random_shape(rng, axes, low=1, high=4):
    return tuple(int(d) for d in rng.randint(low, high + 1, size=axes))


def pair(rng, low, high, square=0.4):
    """(h, w) in [low, high]; equal with probability `square` (or by chance)."""
    h = int(rng.randint(low, high + 1))
    w = h if rng.rand() < square else int(rng.randint(low, high + 1))
    return h, w


def pair_fields(rng, value, default, square_name, h_name, w_name, repeated):
    """One of Caffe's ways of writing an (h, w) pair: omitted (when both are the default),
    the square field once, the repeated field twice (Convolution), or the _h/_w fields."""
    h, w = value
    forms = []
    if h == w:
        forms.append(f"{square_name}: {h}")
        if h == default:
            forms.append("")
    elif repeated:
        forms.append(f"{square_name}: {h} {square_name}: {w}")
    if h_name is not None:
        forms.append(f"{h_name}: {h} {w_name}: {w}")
    return forms[rng.randint(len(forms))]


def canonical(axis, axes):
    return axis + axes if axis < 0 else axis


def prod(values):
    return int(np.prod(values, dtype=np.int64)) if len(values) else 1


@dataclasses.dataclass
class Case:
    """One configuration: the layer, its inputs and parameters, and the reference."""
    prototxt: str
    inputs: list
    # reference(xs, ps) -> outputs: float64 torch tensors of the inputs and parameters.
    reference: object
    params: list = dataclasses.field(default_factory=list)
    # propagate_down per input (None: every input); labels take no gradient.
    propagate: list = None
    phase: str = "train"
    backward: bool = True
    # False: the parameters are not trained (BatchNorm's statistics): their diff stays 0.
    param_grads: bool = True
    # params_after(xs) -> the parameters' values after forward (BatchNorm's moving averages).
    params_after: object = None
    # The parameters' values right after setup (the constant fillers of Scale).
    initial_params: list = None
    # Output 0 is input 0's tensor (in place).
    in_place: bool = False
    # reference(xs, ps, outputs): the reference needs the run's outputs (Dropout's mask).
    uses_outputs: bool = False
    # The library must refuse this configuration (hn.Error from the Layer or its setup).
    rejects: str = None


# ---- Caffe's rules that PyTorch does not share ---------------------------------------------

def caffe_pooled_size(size, kernel, stride, pad, any_pad, ceil_mode=True):
    """Caffe's PoolingLayer::Reshape: the output size rounds UP by default (round_mode CEIL;
    PyTorch's default rounds down, as FLOOR does), and then `if (pad_h_ || pad_w_)` -- on
    BOTH axes once either is padded -- a last window starting at or beyond size + pad is
    dropped:
        if ((pooled_height_ - 1) * stride_h_ >= height_ + pad_h_) --pooled_height_;
    A kernel larger than the padded input is clipped to it (one window, from -pad)."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if any_pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def caffe_pool(x, method, kernel, stride, pad, ceil_mode=True, count_include_pad=True):
    """Caffe's MAX / AVE pooling of an N x C x H x W tensor.

    MAX: the window clipped to the input, the first maximum wins (PyTorch's max_pool2d
    agrees on both once the padding is -inf). AVE: Caffe divides by the window clipped to
    the PADDED input, not the input and not the whole kernel:
        hend = min(hstart + kernel_h_, height_ + pad_h_);
        pool_size = (hend - hstart) * (wend - wstart);
    which PyTorch's count_include_pad does not express once ceil mode runs past the padding,
    so the sums come from a sum-pool and the divisors from that rule. count_include_pad
    False (hybridnn's field, PyTorch's and ONNX's meaning): the divisor is the window
    clipped to the input, the cells the sum adds."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    height, width = x.shape[2], x.shape[3]
    any_pad = ph > 0 or pw > 0
    out_h = caffe_pooled_size(height, kh, sh, ph, any_pad, ceil_mode)
    out_w = caffe_pooled_size(width, kw, sw, pw, any_pad, ceil_mode)
    # Pad enough for every window; the padding never wins a max (each window holds an
    # input pixel) and adds nothing to a sum.
    right = max(0, (out_w - 1) * sw - pw + kw - width)
    bottom = max(0, (out_h - 1) * sh - ph + kh - height)
    fill = -math.inf if method == "MAX" else 0.0
    padded = F.pad(x, (pw, right, ph, bottom), value=fill)
    if method == "MAX":
        return F.max_pool2d(padded, (kh, kw), (sh, sw))[:, :, :out_h, :out_w]
    sums = F.avg_pool2d(padded, (kh, kw), (sh, sw), divisor_override=1)[:, :, :out_h, :out_w]

    def sizes(out, stride_, kernel_, pad_, size):
        starts = np.arange(out) * stride_ - pad_
        if not count_include_pad:
            return np.minimum(starts + kernel_, size) - np.maximum(starts, 0)
        return np.minimum(starts + kernel_, size + pad_) - starts

    divisor = np.outer(sizes(out_h, sh, kh, ph, height), sizes(out_w, sw, kw, pw, width))
    return sums / torch.from_numpy(divisor.astype(np.float64))


def caffe_normalizer(mode, outer, inner, valid_count):
    """Caffe's LossLayer::GetNormalizer, never below 1."""
    value = {"FULL": outer * inner, "VALID": valid_count, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return max(1.0, float(value))


def loss_param_fields(rng, default):
    """A LossParameter's normalization (or the legacy `normalize`, or nothing) and the mode
    in effect by Caffe's rule: normalization if set, else normalize ? VALID : BATCH_SIZE,
    else the layer's default."""
    form = rng.randint(4)
    if form == 0:
        return "", default
    if form == 1:
        normalize = bool(rng.rand() < 0.5)
        return f"normalize: {str(normalize).lower()}", "VALID" if normalize else "BATCH_SIZE"
    mode = ["FULL", "VALID", "BATCH_SIZE", "NONE"][rng.randint(4)]
    return f"normalization: {mode}", mode


def truncated(values):
    """Caffe reads a label as static_cast<int>(float): truncation toward zero."""
    return np.trunc(np.asarray(values, np.float64)).astype(np.int64)


# ---- generators: one per layer type ---------------------------------------------------------

def gen_convolution(rng):
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.randint(1, 4))
    num_output = group * int(rng.randint(1, 4))
    kernel = pair(rng, 1, 4)
    stride = pair(rng, 1, 3)
    pad = pair(rng, 0, 2)
    dilation = pair(rng, 1, 3) if rng.rand() < 0.4 else (1, 1)
    extent = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    height = max(1, extent[0] - 2 * pad[0]) + int(rng.randint(0, 6))
    width = max(1, extent[1] - 2 * pad[1]) + int(rng.randint(0, 6))
    batch = int(rng.randint(1, 5))
    bias_term = bool(rng.rand() < 0.75)
    fields = [f"num_output: {num_output}",
              pair_fields(rng, kernel, None, "kernel_size", "kernel_h", "kernel_w", True),
              pair_fields(rng, stride, 1, "stride", "stride_h", "stride_w", True),
              pair_fields(rng, pad, 0, "pad", "pad_h", "pad_w", True),
              # Caffe has no dilation_h / dilation_w: the repeated field only.
              pair_fields(rng, dilation, 1, "dilation", None, None, True)]
    if group > 1 or rng.rand() < 0.2:
        fields.append(f"group: {group}")
    if not bias_term or rng.rand() < 0.2:
        fields.append(f"bias_term: {str(bias_term).lower()}")
    x = normal(rng, (batch, channels, height, width))
    fan_in = channels // group * kernel[0] * kernel[1]
    params = [normal(rng, (num_output, channels // group) + kernel, 1 / math.sqrt(fan_in))]
    if bias_term:
        params.append(normal(rng, (num_output,), 0.5))

    # Caffe's convolution is PyTorch's conv2d: cross-correlation, output size rounded down.
    def reference(xs, ps):
        return [F.conv2d(xs[0], ps[0], ps[1] if bias_term else None, stride, pad, dilation,
                         group)]

    text = " ".join(f for f in fields if f)
    return Case(f'name: "conv" type: "Convolution" convolution_param {{ {text} }}', [x],
                reference, params)


def gen_deconvolution(rng):
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.randint(1, 4))
    num_output = group * int(rng.randint(1, 4))
    kernel = pair(rng, 1, 4)
    stride = pair(rng, 1, 3)
    dilation = pair(rng, 1, 3) if rng.rand() < 0.4 else (1, 1)
    extent = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    height, width = int(rng.randint(1, 5)), int(rng.randint(1, 5))
    # Caffe's (and PyTorch's) output: stride * (in - 1) + extent - 2 * pad (+ output_pad);
    # pads that leave at least one output.
    pad = tuple(int(rng.randint(0, max(1, (s * (n - 1) + e + 1) // 2)))
                for s, n, e in zip(stride, (height, width), extent))
    extra = tuple(int(rng.randint(0, s)) for s in stride) if rng.rand() < 0.3 else (0, 0)
    batch = int(rng.randint(1, 5))
    bias_term = bool(rng.rand() < 0.75)
    fields = [f"num_output: {num_output}",
              pair_fields(rng, kernel, None, "kernel_size", "kernel_h", "kernel_w", True),
              pair_fields(rng, stride, 1, "stride", "stride_h", "stride_w", True),
              pair_fields(rng, pad, 0, "pad", "pad_h", "pad_w", True),
              pair_fields(rng, dilation, 1, "dilation", None, None, True),
              pair_fields(rng, extra, 0, "output_pad", None, None, True)]
    if group > 1 or rng.rand() < 0.2:
        fields.append(f"group: {group}")
    if not bias_term or rng.rand() < 0.2:
        fields.append(f"bias_term: {str(bias_term).lower()}")
    x = normal(rng, (batch, channels, height, width))
    # Caffe's Deconvolution weights are [C][num_output / group][kh][kw], PyTorch's
    # conv_transpose2d's too.
    params = [normal(rng, (channels, num_output // group) + kernel, 0.5)]
    if bias_term:
        params.append(normal(rng, (num_output,), 0.5))

    def reference(xs, ps):
        return [F.conv_transpose2d(xs[0], ps[0], ps[1] if bias_term else None, stride, pad,
                                   extra, group, dilation)]

    text = " ".join(f for f in fields if f)
    return Case(f'name: "deconv" type: "Deconvolution" convolution_param {{ {text} }}', [x],
                reference, params)


def gen_pooling(rng):
    method = "MAX" if rng.rand() < 0.5 else "AVE"
    batch, channels = int(rng.randint(1, 4)), int(rng.randint(1, 4))
    if rng.rand() < 0.15:
        height, width = pair(rng, 1, 6, square=0.3)
        kernel, stride, pad, ceil_mode = (height, width), (1, 1), (0, 0), True
        text = "global_pooling: true"
    else:
        ceil_mode = bool(rng.rand() < 0.8)
        while True:
            kernel = pair(rng, 1, 4)
            stride = pair(rng, 1, 3)
            # Caffe: pad < kernel on each axis; pads drawn apart as often as together.
            pad_h = int(rng.randint(0, kernel[0]))
            pad_w = pad_h if rng.rand() < 0.4 and pad_h < kernel[1] else int(
                rng.randint(0, kernel[1]))
            pad = (pad_h, pad_w)
            # Now and then a kernel larger than the padded input (Caffe clips it).
            low = -3 if rng.rand() < 0.3 else 0
            height = max(1, kernel[0] - 2 * pad[0] + int(rng.randint(low, 6)))
            width = max(1, kernel[1] - 2 * pad[1] + int(rng.randint(low, 6)))
            sizes = [caffe_pooled_size(size, k, s, p, pad != (0, 0), ceil_mode)
                     for size, k, s, p in zip((height, width), kernel, stride, pad)]
            # No window at all (FLOOR with a kernel past the padded input), or, without any
            # padding, a last window that starts past the input (Caffe keeps it: an empty
            # window, -FLT_MAX or a negative divisor there): not meaningful, draw again.
            if min(sizes) < 1 or any((n - 1) * s - p >= size for n, s, p, size in zip(
                    sizes, stride, pad, (height, width))):
                continue
            break
        # PoolingParameter has no repeated fields: the square field or the _h/_w pair.
        text = " ".join(f for f in (
            pair_fields(rng, kernel, None, "kernel_size", "kernel_h", "kernel_w", False),
            pair_fields(rng, stride, 1, "stride", "stride_h", "stride_w", False),
            pair_fields(rng, pad, 0, "pad", "pad_h", "pad_w", False),
            "" if ceil_mode and rng.rand() < 0.8 else
            f"round_mode: {'CEIL' if ceil_mode else 'FLOOR'}") if f)
    count_include_pad = True
    if method == "AVE" and rng.rand() < 0.3:
        count_include_pad = bool(rng.rand() < 0.2)  # the field given as its default, now and then
        text += f" count_include_pad: {str(count_include_pad).lower()}"
    if method == "MAX" and rng.rand() < 0.3:
        x = integers(rng, (batch, channels, height, width))  # ties: the first maximum wins
    else:
        x = normal(rng, (batch, channels, height, width))
    prototxt = f'name: "pool" type: "Pooling" pooling_param {{ pool: {method} {text} }}'
    return Case(prototxt, [x],
                lambda xs, ps: [caffe_pool(xs[0], method, kernel, stride, pad, ceil_mode,
                                           count_include_pad)])


def gen_inner_product(rng):
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    axis = int(rng.randint(-axes, axes))
    start = canonical(axis, axes)
    rows, inputs = prod(shape[:start]), prod(shape[start:])
    num_output = int(rng.randint(1, 7))
    transpose = bool(rng.rand() < 0.5)
    bias_term = bool(rng.rand() < 0.75)
    fields = [f"num_output: {num_output}"]
    if axis != 1 or rng.rand() < 0.2:
        fields.append(f"axis: {axis}")
    if transpose or rng.rand() < 0.2:
        fields.append(f"transpose: {str(transpose).lower()}")
    if not bias_term or rng.rand() < 0.2:
        fields.append(f"bias_term: {str(bias_term).lower()}")
    weight_shape = (inputs, num_output) if transpose else (num_output, inputs)
    params = [normal(rng, weight_shape, 1 / math.sqrt(inputs))]
    if bias_term:
        params.append(normal(rng, (num_output,), 0.5))

    # Caffe flattens axes [axis, end) into each row's K inputs and keeps [0, axis) as the
    # rows; `transpose` means the weights are stored K x N (y = x W), not N x K (y = x W^T).
    def reference(xs, ps):
        flat = xs[0].reshape(rows, inputs)
        y = flat @ (ps[0] if transpose else ps[0].t())
        if bias_term:
            y = y + ps[1]
        return [y.reshape(shape[:start] + (num_output,))]

    prototxt = f'name: "ip" type: "InnerProduct" inner_product_param {{ {" ".join(fields)} }}'
    return Case(prototxt, [normal(rng, shape)], reference, params)


def gen_lrn(rng):
    size = int(rng.choice([1, 3, 5, 7]))
    alpha = round(float(rng.uniform(1e-3, 2.0)), 4)
    beta = round(float(rng.uniform(0.3, 1.2)), 4)
    k = round(float(rng.uniform(0.5, 2.5)), 4)
    within = bool(rng.rand() < 0.4)
    shape = (int(rng.randint(1, 4)), int(rng.randint(1, 9))) + pair(rng, 1, 6, square=0.3)
    fields = [f"local_size: {size}", f"alpha: {number(alpha)}", f"beta: {number(beta)}"]
    if within:
        fields.append("norm_region: WITHIN_CHANNEL")
    if not within or rng.rand() < 0.3:
        fields.append(f"k: {number(k)}")

    def reference(xs, ps):
        x = xs[0]
        if not within:
            # ACROSS_CHANNELS: scale = k + alpha / size * sum over the channel window of x^2,
            # y = x * scale^-beta; PyTorch's local_response_norm is that formula (its
            # average pool over the zero-padded window divides by size, as Caffe's alpha /
            # size does).
            return [F.local_response_norm(x, size, f32(alpha), f32(beta), f32(k))]
        # WITHIN_CHANNEL: Caffe builds it from layers -- x^2, AVE pooling (kernel size,
        # stride 1, pad (size - 1) / 2, Caffe's divisor), then a Power layer with shift 1,
        # scale alpha, power -beta, and the product with x. k is not used (Caffe's rule).
        pad = (size - 1) // 2
        mean = caffe_pool(x * x, "AVE", (size, size), (1, 1), (pad, pad))
        return [x * (1.0 + f32(alpha) * mean) ** -f32(beta)]

    prototxt = f'name: "lrn" type: "LRN" lrn_param {{ {" ".join(fields)} }}'
    return Case(prototxt, [normal(rng, shape, 1.5)], reference)


def gen_relu(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)))
    in_place = bool(rng.rand() < 0.3)
    # In place Caffe's backward reads the output, whose sign is the input's only for a
    # slope >= 0.
    low = 0.0 if in_place else -0.5
    slope = 0.0 if rng.rand() < 0.4 else round(float(rng.uniform(low, 0.5)), 3)
    text = f" relu_param {{ negative_slope: {number(slope)} }}" if slope != 0.0 else ""

    # Caffe: y = max(x, 0) + negative_slope * min(x, 0).
    def reference(xs, ps):
        return [torch.where(xs[0] > 0, xs[0], f32(slope) * xs[0])]

    return Case(f'name: "relu" type: "ReLU"{text}', [normal(rng, shape)], reference,
                in_place=in_place)


def gen_sigmoid(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)))
    return Case('name: "sigmoid" type: "Sigmoid"', [normal(rng, shape, 3.0)],
                lambda xs, ps: [torch.sigmoid(xs[0])], in_place=bool(rng.rand() < 0.3))


def gen_tanh(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)))
    return Case('name: "tanh" type: "TanH"', [normal(rng, shape, 2.0)],
                lambda xs, ps: [torch.tanh(xs[0])], in_place=bool(rng.rand() < 0.3))


def gen_clip(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)))
    low = round(float(rng.uniform(-2.0, 0.5)), 2)
    high = round(low + float(rng.choice([0.0, 0.5, 1.5, 6.0])), 2)
    x = normal(rng, shape, 2.0)
    x.flat[::7] = f32(low)  # the bounds pass the gradient (Caffe's rule, PyTorch's clamp)
    x.flat[3::7] = f32(high)
    return Case(f'name: "clip" type: "Clip" clip_param {{ min: {number(low)} max: {number(high)} }}',
                [x], lambda xs, ps: [torch.clamp(xs[0], f32(low), f32(high))])


def gen_dropout(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)), 2, 5)
    ratio = float(rng.choice([0.0, 0.1, 0.25, 0.5, 0.75]))
    phase = "test" if rng.rand() < 0.35 else "train"
    text = f" dropout_param {{ dropout_ratio: {ratio} }}" if ratio != 0.5 else ""
    x = normal(rng, shape)
    x[x == 0] = 1.0  # a dropped element reads as 0 below

    if phase == "test":
        return Case(f'name: "drop" type: "Dropout"{text}', [x], lambda xs, ps: [xs[0] * 1.0],
                    phase="test", in_place=bool(rng.rand() < 0.3))

    def reference(xs, ps, outputs=None):
        """Train phase: the mask is random, so it is read from the run's output (an element
        is kept where the output is not 0) and the reference checks the rest of Caffe's rule:
        a kept element is x / (1 - ratio), a dropped one 0, the gradient dy * mask / (1 -
        ratio), and about 1 - ratio of them kept."""
        if outputs is None:
            return [xs[0] * 1.0]
        kept = outputs[0] != 0
        n = kept.size
        expected, spread = n * (1 - ratio), math.sqrt(n * ratio * (1 - ratio))
        assert abs(kept.sum() - expected) <= 5 * spread + 1, (
            f"{kept.sum()} of {n} elements kept; expected about {expected:.1f} at ratio {ratio}")
        mask = torch.from_numpy(kept.astype(np.float64))
        return [xs[0] * mask / (1 - f32(ratio))]

    return Case(f'name: "drop" type: "Dropout"{text}', [x], reference, uses_outputs=True,
                in_place=bool(rng.rand() < 0.3))


def softmax_case(rng, layer_type, reference, scale):
    """Softmax or LogSoftmax over a random axis (softmax_param's) of inputs of `scale`."""
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    axis = int(rng.randint(-axes, axes))
    text = f" softmax_param {{ axis: {axis} }}" if axis != 1 or rng.rand() < 0.2 else ""
    return Case(f'name: "{layer_type.lower()}" type: "{layer_type}"{text}',
                [normal(rng, shape, scale)],
                lambda xs, ps: [reference(xs[0], canonical(axis, axes))])


def gen_softmax(rng):
    return softmax_case(rng, "Softmax", torch.softmax, 3.0)


def gen_log_softmax(rng):
    # Wide inputs: the small probabilities whose logarithms a softmax then log would lose.
    return softmax_case(rng, "LogSoftmax", torch.log_softmax, 20.0)


def gen_batch_norm(rng):
    """Caffe's BatchNorm (batch_norm_layer.cpp): no scale or shift of its own; three blobs,
    the SUMS of means and of variances and their weight (the moving-average factor), never
    trained (lr_mult 0). Batch statistics (training, unless use_global_stats) normalise with
    the BIASED variance and update the blobs with the unbiased one:
        blob2 = blob2 * f + 1; blob0 = blob0 * f + mean; blob1 = blob1 * f + m / (m - 1) * var
    (m = count / channels, correction 1 when m == 1). Stored statistics divide the blobs by
    blob2 (0 when blob2 is 0). y = (x - mean) / sqrt(var + eps)."""
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    if axes > 1 and rng.rand() < 0.8:
        shape = (max(shape[0], 2),) + shape[1:]
    channels = 1 if axes == 1 else shape[1]
    phase = "test" if rng.rand() < 0.4 else "train"
    stats = [None, None, True, False][rng.randint(4)]  # use_global_stats: unset, true, false
    fraction = round(float(rng.uniform(0.5, 1.0)), 3)
    eps = round(float(10 ** rng.uniform(-5, -1)), 7)
    fields = []
    if stats is not None:
        fields.append(f"use_global_stats: {str(stats).lower()}")
    if rng.rand() < 0.7:
        fields.append(f"moving_average_fraction: {number(fraction)}")
    else:
        fraction = 0.999
    if rng.rand() < 0.7:
        fields.append(f"eps: {number(eps)}")
    else:
        eps = 1e-5
    rejects = None
    if rng.rand() < 0.08:
        # Caffe takes any eps; hybridnn refuses a negative one, since sqrt(var + eps) is NaN
        # for a channel whose variance is below -eps (a constant channel, say).
        eps = -round(float(rng.uniform(1e-4, 0.1)), 4)
        fields = [f for f in fields if not f.startswith("eps")] + [f"eps: {number(eps)}"]
        rejects = "eps < 0"
    text = f" batch_norm_param {{ {' '.join(fields)} }}" if fields else ""
    global_stats = stats if stats is not None else phase == "test"
    if not global_stats:
        # With 2 values per channel the normalised output is +-1 whatever the input, and the
        # input gradient is all cancellation (float32 noise over a reference near 0): at
        # least 4 values per channel keep it a gradient worth comparing.
        while prod(shape) // channels < 4:
            shape = (shape[0] + 1,) + shape[1:]

    shift = normal(rng, (channels,), 2.0)
    view = (1, channels) + (1,) * (axes - 2) if axes > 1 else (1,)
    x = normal(rng, shape, float(rng.uniform(0.5, 3.0))) + shift.reshape(view)
    factor = 0.0 if rng.rand() < 0.1 else round(float(rng.uniform(0.5, 3.0)), 3)
    params = [normal(rng, (channels,)) * np.float32(factor),
              (rng.uniform(0.5, 2.0, channels) * factor).astype(np.float32),
              np.array([factor], np.float32)]

    def per_channel(x):
        return x.reshape(x.shape[0], channels, -1) if x.dim() > 1 else x.reshape(-1, 1, 1)

    def batch_moments(x):
        v = per_channel(x)
        mean = v.mean((0, 2))
        return mean, ((v - mean[None, :, None]) ** 2).mean((0, 2))

    def reference(xs, ps):
        x = xs[0]
        if global_stats:
            weight = float(ps[2][0])
            scale = 0.0 if weight == 0.0 else 1.0 / weight
            mean, var = ps[0] * scale, ps[1] * scale
        else:
            mean, var = batch_moments(x)
        y = (per_channel(x) - mean[None, :, None]) / torch.sqrt(var + f32(eps))[None, :, None]
        return [y.reshape(x.shape)]

    def params_after(xs):
        if global_stats:
            return params
        mean, var = (t.numpy() for t in batch_moments(xs[0]))
        m = xs[0].numel() // channels
        correction = m / (m - 1) if m > 1 else 1.0
        f = f32(fraction)
        p = [q.astype(np.float64) for q in params]
        return [p[0] * f + mean, p[1] * f + correction * var, p[2] * f + 1.0]

    return Case(f'name: "bn" type: "BatchNorm"{text}', [x], reference, params, phase=phase,
                param_grads=False, params_after=params_after, rejects=rejects,
                in_place=bool(rng.rand() < 0.3))


def gen_scale(rng):
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    axis = int(rng.randint(-axes, axes))
    start = canonical(axis, axes)
    two_inputs = bool(rng.rand() < 0.35)
    bias_term = bool(rng.rand() < 0.5)
    fields = []
    if axis != 1 or rng.rand() < 0.2:
        fields.append(f"axis: {axis}")
    if two_inputs:
        # The second input's shape is the scale's; it covers axes [axis, axis + its axes).
        scale_shape = shape[start:start + int(rng.randint(0, axes - start + 1))]
        if rng.rand() < 0.3:
            fields.append(f"num_axes: {int(rng.randint(-1, 3))}")  # ignored with two inputs
    else:
        num_axes = int(rng.randint(-1, axes - start + 1))
        if num_axes != 1 or rng.rand() < 0.2:
            fields.append(f"num_axes: {num_axes}")
        scale_shape = shape[start:] if num_axes == -1 else shape[start:start + num_axes]
    initial = []
    if not two_inputs:
        value = 1.0
        if rng.rand() < 0.4:
            value = round(float(rng.uniform(-2, 2)), 3)
            fields.append(f'filler {{ type: "constant" value: {number(value)} }}')
        initial.append(np.full(scale_shape, f32(value)))
    if bias_term:
        fields.append("bias_term: true")
        value = 0.0
        if rng.rand() < 0.4:
            value = round(float(rng.uniform(-2, 2)), 3)
            fields.append(f'bias_filler {{ type: "constant" value: {number(value)} }}')
        initial.append(np.full(scale_shape, f32(value)))
    inputs = [normal(rng, shape)]
    params = []
    if two_inputs:
        inputs.append(normal(rng, scale_shape))
    else:
        params.append(normal(rng, scale_shape))
    if bias_term:
        params.append(normal(rng, scale_shape))
    propagate = None
    if two_inputs and rng.rand() < 0.3:
        propagate = [True, False] if rng.rand() < 0.5 else [False, True]

    # Caffe: y = x * scale + bias, the scale broadcast over the axes before and after
    # [axis, axis + its axes) (a scalar scale over everything).
    def reference(xs, ps):
        x = xs[0]
        s = xs[1] if two_inputs else ps[0]
        view = (1,) * start + tuple(s.shape) + (1,) * (axes - start - s.dim())
        y = x * s.reshape(view)
        if bias_term:
            y = y + ps[-1].reshape(view)
        return [y]

    text = f" scale_param {{ {' '.join(fields)} }}" if fields else ""
    return Case(f'name: "scale" type: "Scale"{text}', inputs, reference, params,
                propagate=propagate, initial_params=initial,
                in_place=not two_inputs and bool(rng.rand() < 0.25))


def random_propagate(rng, count):
    """propagate_down per input, at least one true; mostly all."""
    if rng.rand() < 0.7:
        return None
    flags = [bool(rng.rand() < 0.6) for _ in range(count)]
    flags[rng.randint(count)] = True
    return flags


def gen_eltwise(rng):
    count = int(rng.randint(2, 5))
    shape = random_shape(rng, int(rng.randint(1, 5)))
    operation = ["SUM", "PROD", "MAX"][rng.randint(3)]
    fields = [f"operation: {operation}"] if operation != "SUM" or rng.rand() < 0.3 else []
    coeffs = [1.0] * count
    rejects = None
    if (operation == "SUM" and rng.rand() < 0.6) or rng.rand() < 0.15:
        # Caffe takes one coefficient per input for SUM, ignores them for MAX and refuses
        # them for PROD ("Eltwise layer only takes coefficients for summation").
        written = [round(float(rng.uniform(-2, 2)), 3) for _ in range(count)]
        fields += [f"coeff: {number(c)}" for c in written]
        if operation == "SUM":
            coeffs = written
        elif operation == "PROD":
            rejects = "coeff with PROD"
    if operation == "PROD" and rng.rand() < 0.5:
        fields.append("stable_prod_grad: false")  # Caffe's dy * y / x_i
    if operation == "MAX" and rng.rand() < 0.4:
        inputs = [integers(rng, shape, -2, 2) for _ in range(count)]
    else:
        inputs = [normal(rng, shape) for _ in range(count)]

    def reference(xs, ps):
        if operation == "SUM":
            return [sum(f32(c) * x for c, x in zip(coeffs, xs))]
        if operation == "PROD":
            y = xs[0]
            for x in xs[1:]:
                y = y * x
            return [y]
        # MAX, Caffe's tie rule (eltwise_layer.cpp): inputs 0 and 1 compare with
        #   if (bottom_data_a[idx] > bottom_data_b[idx]) mask = 0; else mask = 1;
        # so on a tie input 1 wins; each later input replaces only a strictly larger one
        # (`if (bottom_data_b[idx] > top_data[idx])`). The gradient goes to the winner.
        values = [x.detach().numpy() for x in xs]
        winner = np.where(values[0] > values[1], 0, 1)
        best = np.maximum(values[0], values[1])
        for i, v in enumerate(values[2:], 2):
            winner = np.where(v > best, i, winner)
            best = np.maximum(best, v)
        return [sum(x * torch.from_numpy((winner == i).astype(np.float64))
                    for i, x in enumerate(xs))]

    text = f" eltwise_param {{ {' '.join(fields)} }}" if fields else ""
    bottoms = " ".join(f'bottom: "x{i}"' for i in range(count))
    return Case(f'name: "eltwise" type: "Eltwise" {bottoms}{text}', inputs, reference,
                propagate=random_propagate(rng, count), rejects=rejects)


def gen_concat(rng):
    count = int(rng.randint(1, 5))
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    axis = int(rng.randint(-axes, axes))
    start = canonical(axis, axes)
    inputs = []
    for _ in range(count):
        own = list(shape)
        own[start] = int(rng.randint(1, 4))
        inputs.append(normal(rng, tuple(own)))
    if rng.rand() < 0.2:
        text = f" concat_param {{ concat_dim: {start} }}"  # the legacy field: axis >= 0
    elif axis != 1 or rng.rand() < 0.2:
        text = f" concat_param {{ axis: {axis} }}"
    else:
        text = ""
    return Case(f'name: "concat" type: "Concat"{text}', inputs,
                lambda xs, ps: [torch.cat(xs, start)], propagate=random_propagate(rng, count))


def gen_slice(rng):
    axes = int(rng.randint(1, 5))
    axis = int(rng.randint(-axes, axes))
    start = canonical(axis, axes)
    shape = list(random_shape(rng, axes))
    tops = int(rng.randint(1, 5))
    if rng.rand() < 0.5:
        # Equal parts: Caffe needs the axis to divide by the number of tops.
        shape[start] = tops * int(rng.randint(1, 3))
        sizes, fields = [shape[start] // tops] * tops, []
    else:
        shape[start] = tops + int(rng.randint(0, 4))
        points = sorted(rng.choice(np.arange(1, shape[start]), tops - 1, replace=False))
        edges = [0] + [int(p) for p in points] + [shape[start]]
        sizes = [b - a for a, b in zip(edges, edges[1:])]
        fields = [f"slice_point: {int(p)}" for p in points]
    if rng.rand() < 0.2:
        fields.append(f"slice_dim: {start}")  # the legacy field: axis >= 0
    elif axis != 1 or rng.rand() < 0.2:
        fields.append(f"axis: {axis}")
    text = f" slice_param {{ {' '.join(fields)} }}" if fields else ""
    top_text = " ".join(f'top: "y{i}"' for i in range(tops))
    return Case(f'name: "slice" type: "Slice" {top_text}{text}', [normal(rng, tuple(shape))],
                lambda xs, ps: list(torch.split(xs[0], sizes, start)))


def gen_permute(rng):
    axes = int(rng.randint(1, 6))
    shape = random_shape(rng, axes)
    full = [int(a) for a in rng.permutation(axes)]
    if rng.rand() < 0.5:
        full = [0] + [int(a) for a in 1 + rng.permutation(axes - 1)]  # the batch stays first
    # SSD's rule: the axes left out of `order` follow in their order.
    given = int(rng.randint(0, axes + 1))
    order = full[:given]
    rest = [a for a in range(axes) if a not in order]
    full = order + rest
    text = " ".join(f"order: {a}" for a in order)
    return Case(f'name: "permute" type: "Permute" permute_param {{ {text} }}',
                [normal(rng, shape)], lambda xs, ps: [xs[0].permute(full)])


def gen_shuffle_channel(rng):
    axes = int(rng.randint(2, 6))
    shape = list(random_shape(rng, axes))
    group = int(rng.randint(1, 5))
    channels = group * int(rng.randint(1, 4))
    # 1 to 3 bottoms joined along the channels (hybridnn's extension), at random cuts.
    count = int(rng.randint(0, 3)) if channels > 1 else 0
    cuts = sorted(set(int(c) for c in rng.randint(1, max(channels, 2), size=count)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [channels])]
    inputs = [normal(rng, tuple([shape[0], size] + shape[2:])) for size in sizes]
    text = f" shuffle_channel_param {{ group: {group} }}" if group != 1 or rng.rand() < 0.5 else ""

    def reference(xs, ps):
        x = torch.cat(xs, 1)
        rest = list(x.shape[2:])
        return [x.reshape([x.shape[0], group, channels // group] + rest).transpose(1, 2)
                .reshape([x.shape[0], channels] + rest)]

    return Case(f'name: "shuffle" type: "ShuffleChannel"{text}', inputs, reference,
                propagate=random_propagate(rng, len(inputs)))


def gen_pad(rng):
    axes = int(rng.randint(2, 6))
    shape = random_shape(rng, axes)
    axis = int(rng.randint(1, axes))
    padded = axes - axis
    same = rng.rand() < 0.3  # one count for every axis
    before = [int(rng.randint(0, 3))] * (1 if same else padded)
    after = [] if rng.rand() < 0.3 else [int(rng.randint(0, 3))] * (1 if same else padded)
    if not same:
        before = [int(rng.randint(0, 3)) for _ in range(padded)]
        if after:
            after = [int(rng.randint(0, 3)) for _ in range(padded)]
    value = float(np.round(rng.randn(), 3)) if rng.rand() < 0.5 else 0.0
    full_before = before * padded if len(before) == 1 else before
    full_after = full_before if not after else (after * padded if len(after) == 1 else after)
    fields = [f"axis: {axis - axes if rng.rand() < 0.3 else axis}"]
    fields += [f"pad_before: {c}" for c in before] + [f"pad_after: {c}" for c in after]
    if value:
        fields.append(f"value: {value}")
    # torch's F.pad lists (before, after) pairs from the last axis back.
    pairs = []
    for k in reversed(range(padded)):
        pairs += [full_before[k], full_after[k]]
    return Case(f'name: "pad" type: "Pad" pad_param {{ {" ".join(fields)} }}',
                [normal(rng, shape)],
                lambda xs, ps: [torch.nn.functional.pad(xs[0], pairs, value=value)])


def gen_swish(rng):
    shape = random_shape(rng, int(rng.randint(1, 5)))
    beta = 1.0 if rng.rand() < 0.5 else float(np.round(rng.uniform(-2, 2), 3))
    text = f" swish_param {{ beta: {beta} }}" if beta != 1.0 or rng.rand() < 0.2 else ""
    # Caffe's SwishLayer: x * sigmoid(beta * x) (PyTorch's SiLU at beta 1).
    return Case(f'name: "swish" type: "Swish"{text}', [normal(rng, shape, 3.0)],
                lambda xs, ps: [xs[0] * torch.sigmoid(beta * xs[0])])


def gen_silence(rng):
    bottoms = int(rng.randint(1, 4))
    inputs = [normal(rng, random_shape(rng, int(rng.randint(1, 5)))) for _ in range(bottoms)]
    # No outputs; the inputs' gradients are zeros.
    return Case('name: "silence" type: "Silence"', inputs, lambda xs, ps: [])


def gen_split(rng):
    tops = int(rng.randint(1, 5))
    shape = random_shape(rng, int(rng.randint(1, 5)))
    top_text = " ".join(f'top: "y{i}"' for i in range(tops))
    # Every top is the input; backward sums the tops' gradients (autograd does too).
    return Case(f'name: "split" type: "Split" {top_text}', [normal(rng, shape)],
                lambda xs, ps: [xs[0] * 1.0 for _ in range(tops)])


def gen_flatten(rng):
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    first = int(rng.randint(0, axes))
    last = int(rng.randint(first, axes))
    if first > 0 and rng.rand() < 0.15:
        # end_axis = axis - 1: Caffe's count(axis, end_axis + 1) is 1, an axis of 1 inserted.
        last = first - 1
    # Either end may be written counting from the end.
    axis = first - axes if rng.rand() < 0.3 else first
    end_axis = last - axes if rng.rand() < 0.5 else last
    fields = []
    if axis != 1 or rng.rand() < 0.2:
        fields.append(f"axis: {axis}")
    if end_axis != -1 or rng.rand() < 0.2:
        fields.append(f"end_axis: {end_axis}")
    out = shape[:first] + (prod(shape[first:last + 1]),) + shape[last + 1:]
    text = f" flatten_param {{ {' '.join(fields)} }}" if fields else ""
    return Case(f'name: "flat" type: "Flatten"{text}', [normal(rng, shape)],
                lambda xs, ps: [xs[0].reshape(out)])


def caffe_reshape(shape, spec, axis, num_axes):
    """Caffe's ReshapeLayer::Reshape: axes [start, end) are replaced by `spec`, where 0
    copies the input's dimension at that position (start + i) and one -1 is inferred; a
    negative axis counts from the end with -1 meaning after the last axis. None when the
    spec does not fit the input."""
    axes = len(shape)
    start = axis if axis >= 0 else axes + axis + 1
    end = axes if num_axes == -1 else start + num_axes
    if not 0 <= start <= end <= axes:
        return None
    out = list(shape[:start])
    for i, d in enumerate(spec):
        if d == 0:
            if start + i >= axes:
                return None
            d = shape[start + i]
        out.append(d)
    out += shape[end:]
    known = prod([d for d in out if d != -1])
    if -1 in out:
        if known == 0 or prod(shape) % known:
            return None
        out[out.index(-1)] = prod(shape) // known
    return tuple(out) if prod(out) == prod(shape) else None


def gen_reshape(rng):
    while True:
        axes = int(rng.randint(1, 5))
        shape = random_shape(rng, axes)
        axis = int(rng.randint(-axes - 1, axes + 1)) if rng.rand() < 0.5 else 0
        start = axis if axis >= 0 else axes + axis + 1
        num_axes = -1 if rng.rand() < 0.5 else int(rng.randint(0, axes - start + 1))
        end = axes if num_axes == -1 else start + num_axes
        total = prod(shape[start:end])
        # Factor the replaced count into 1 to 3 dimensions, then write some as 0 or -1.
        spec = []
        rest = total
        for _ in range(int(rng.randint(0, 3))):
            divisors = [d for d in range(1, rest + 1) if rest % d == 0]
            d = int(rng.choice(divisors))
            spec.append(d)
            rest //= d
        spec.append(rest)
        rng.shuffle(spec)
        if rng.rand() < 0.4:
            spec[rng.randint(len(spec))] = 0
        if rng.rand() < 0.5:
            spec[rng.randint(len(spec))] = -1
        if total == 1 and rng.rand() < 0.4:
            spec = []  # no dimensions: the replaced axes (all 1) go away
        out = caffe_reshape(shape, spec, axis, num_axes)
        if out is not None:
            break
    fields = []
    if spec or rng.rand() < 0.5:  # Caffe's shape field may be left out: no dimensions
        fields.append(f"shape {{ {' '.join(f'dim: {d}' for d in spec)} }}")
    if axis != 0:
        fields.append(f"axis: {axis}")
    if num_axes != -1:
        fields.append(f"num_axes: {num_axes}")
    text = f" reshape_param {{ {' '.join(fields)} }}" if fields else ""
    return Case(f'name: "reshape" type: "Reshape"{text}', [normal(rng, shape)],
                lambda xs, ps: [xs[0].reshape(out)])


def class_layout(rng, min_axis):
    """Scores with a class axis and labels with one per position: (shape, axis, outer,
    classes, inner, label shape). Caffe's LossLayer also wants the labels' first dimension
    to be the scores' (loss layers take min_axis 1)."""
    axes = int(rng.randint(max(2, min_axis + 1), 5))
    shape = list(random_shape(rng, axes))
    start = int(rng.randint(min_axis, axes))
    axis = start - axes if rng.rand() < 0.3 else start
    shape[start] = max(2, shape[start])  # one class: a loss of 0 whatever the scores
    shape = tuple(shape)
    outer, classes, inner = prod(shape[:start]), shape[start], prod(shape[start + 1:])
    if start >= 1 and rng.rand() < 0.5:
        label_shape = (shape[0], outer * inner // shape[0])
    else:
        label_shape = shape[:start] + shape[start + 1:]
    return shape, axis, outer, classes, inner, label_shape


def random_labels(rng, classes, label_shape, ignore_label):
    labels = rng.randint(0, classes, size=label_shape).astype(np.float32)
    if ignore_label is not None:
        labels[rng.rand(*label_shape) < 0.25] = ignore_label
    return labels


def gen_softmax_with_loss(rng):
    shape, axis, outer, classes, inner, label_shape = class_layout(rng, 1)
    ignore_label = None if rng.rand() < 0.5 else int(rng.choice([-1, 0, classes - 1, 255]))
    loss_fields, mode = loss_param_fields(rng, "VALID")
    if ignore_label is not None:
        loss_fields += f" ignore_label: {ignore_label}"
    two_tops = bool(rng.rand() < 0.3)
    x = normal(rng, shape, 2.0)
    labels = random_labels(rng, classes, label_shape, ignore_label)

    def reference(xs, ps):
        """Caffe: -sum over the non-ignored positions of log(max(p[label], FLT_MIN)),
        divided by the normalizer; the gradient (p - onehot) * loss_weight / normalizer.
        With two tops the probabilities are top 1, and Caffe ignores any gradient on them."""
        logp = torch.log_softmax(xs[0].reshape(outer, classes, inner), 1)
        label = truncated(labels).reshape(outer, inner)
        valid = np.ones_like(label, bool) if ignore_label is None else label != ignore_label
        index = torch.from_numpy(np.where(valid, label, 0))[:, None, :]
        picked = torch.clamp(logp.gather(1, index)[:, 0, :], min=math.log(FLT_MIN))
        normalizer = caffe_normalizer(mode, outer, inner, int(valid.sum()))
        loss = -(picked * torch.from_numpy(valid.astype(np.float64))).sum() / normalizer
        outs = [loss]
        if two_tops:
            outs.append(torch.softmax(xs[0], canonical(axis, len(shape))).detach())
        return outs

    fields = []
    if axis != 1 or rng.rand() < 0.2:
        fields.append(f"softmax_param {{ axis: {axis} }}")
    if loss_fields.strip():
        fields.append(f"loss_param {{ {loss_fields.strip()} }}")
    tops = ' top: "loss" top: "prob"' if two_tops else ""
    return Case(f'name: "loss" type: "SoftmaxWithLoss"{tops} {" ".join(fields)}',
                [x, labels], reference, propagate=[True, False])


def gen_sigmoid_cross_entropy_loss(rng):
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    target_shape = shape if rng.rand() < 0.7 else (shape[0], prod(shape[1:]))
    ignore_label = None if rng.rand() < 0.5 else int(rng.choice([-1, 1]))
    loss_fields, mode = loss_param_fields(rng, "BATCH_SIZE")
    if ignore_label is not None:
        loss_fields += f" ignore_label: {ignore_label}"
    x = normal(rng, shape, 3.0)
    if rng.rand() < 0.5:
        targets = (rng.rand(*target_shape) < 0.5).astype(np.float32)
    else:
        targets = rng.rand(*target_shape).astype(np.float32)
    if ignore_label is not None:
        targets[rng.rand(*target_shape) < 0.2] = ignore_label

    def reference(xs, ps):
        """Caffe: sum over targets whose int value is not ignore_label of
        max(x, 0) - x t + log(1 + exp(-|x|)) (binary_cross_entropy_with_logits, whose
        gradient is sigmoid(x) - t as Caffe's), divided by the normalizer: outer = axis 0
        of x, inner = the rest; VALID counts the targets not ignored."""
        t = targets.astype(np.float64).reshape(shape)
        valid = np.ones(shape, bool) if ignore_label is None else truncated(t) != ignore_label
        losses = F.binary_cross_entropy_with_logits(
            xs[0], torch.from_numpy(np.where(valid, t, 0.0)), reduction="none")
        normalizer = caffe_normalizer(mode, shape[0], prod(shape[1:]), int(valid.sum()))
        return [(losses * torch.from_numpy(valid.astype(np.float64))).sum() / normalizer]

    text = f" loss_param {{ {loss_fields.strip()} }}" if loss_fields.strip() else ""
    return Case(f'name: "loss" type: "SigmoidCrossEntropyLoss"{text}', [x, targets], reference,
                propagate=[True, False])


def gen_euclidean_loss(rng):
    axes = int(rng.randint(1, 5))
    shape = random_shape(rng, axes)
    other = shape if rng.rand() < 0.7 else (shape[0], prod(shape[1:]))
    a, b = normal(rng, shape), normal(rng, other)

    # Caffe: sum((a - b)^2) / (2 N), N = axis 0; a gets +(a - b) w / N, b gets -(a - b) w / N.
    def reference(xs, ps):
        diff = xs[0].reshape(-1) - xs[1].reshape(-1)
        return [(diff * diff).sum() / (2 * shape[0])]

    return Case('name: "loss" type: "EuclideanLoss"', [a, b], reference,
                propagate=random_propagate(rng, 2))


def gen_accuracy(rng):
    shape, axis, outer, classes, inner, label_shape = class_layout(rng, 0)
    top_k = int(rng.randint(1, classes + 1)) if rng.rand() < 0.5 else 1
    ignore_label = None if rng.rand() < 0.6 else int(rng.choice([-1, 0, classes - 1]))
    two_tops = bool(rng.rand() < 0.4)
    scores = integers(rng, shape, -2, 2) if rng.rand() < 0.4 else normal(rng, shape)
    labels = random_labels(rng, classes, label_shape, ignore_label)
    fields = []
    if top_k != 1 or rng.rand() < 0.2:
        fields.append(f"top_k: {top_k}")
    if axis != 1 or rng.rand() < 0.2:
        fields.append(f"axis: {axis}")
    if ignore_label is not None:
        fields.append(f"ignore_label: {ignore_label}")

    def reference(xs, ps):
        """Caffe's AccuracyLayer: a position is correct when fewer than top_k classes score
        >= the true class's score, the true class counting itself (so a tie counts AGAINST
        the label); ignored labels are not counted; accuracy = correct / counted (0 when
        none). Top 1: per class, correct / positions with that label (0 for none)."""
        s = scores.astype(np.float64).reshape(outer, classes, inner)
        label = truncated(labels).reshape(outer, inner)
        correct, counted = 0, 0
        hits, seen = np.zeros(classes), np.zeros(classes)
        for o in range(outer):
            for i in range(inner):
                if ignore_label is not None and label[o, i] == ignore_label:
                    continue
                better = int((s[o, :, i] >= s[o, label[o, i], i]).sum()) - 1
                seen[label[o, i]] += 1
                if better < top_k:
                    correct += 1
                    hits[label[o, i]] += 1
                counted += 1
        outs = [torch.tensor(correct / counted if counted else 0.0, dtype=torch.float64)]
        if two_tops:
            outs.append(torch.from_numpy(np.where(seen > 0, hits / np.maximum(seen, 1), 0.0)))
        return outs

    text = f" accuracy_param {{ {' '.join(fields)} }}" if fields else ""
    tops = ' top: "accuracy" top: "per_class"' if two_tops else ""
    return Case(f'name: "accuracy" type: "Accuracy"{tops}{text}', [scores, labels], reference,
                propagate=[False, False], backward=False)


# Layer type -> (generator, number of configurations).
GENERATORS = {
    "Accuracy": (gen_accuracy, 60),
    "BatchNorm": (gen_batch_norm, 120),
    "Concat": (gen_concat, 60),
    "Convolution": (gen_convolution, 300),
    "Deconvolution": (gen_deconvolution, 80),
    "Dropout": (gen_dropout, 60),
    "Eltwise": (gen_eltwise, 100),
    "EuclideanLoss": (gen_euclidean_loss, 40),
    "Flatten": (gen_flatten, 40),
    "InnerProduct": (gen_inner_product, 120),
    "LogSoftmax": (gen_log_softmax, 40),
    "LRN": (gen_lrn, 100),
    "Pad": (gen_pad, 40),
    "Pooling": (gen_pooling, 300),
    "ReLU": (gen_relu, 50),
    "Reshape": (gen_reshape, 60),
    "Scale": (gen_scale, 100),
    "Sigmoid": (gen_sigmoid, 30),
    "SigmoidCrossEntropyLoss": (gen_sigmoid_cross_entropy_loss, 60),
    "Slice": (gen_slice, 60),
    "Softmax": (gen_softmax, 60),
    "SoftmaxWithLoss": (gen_softmax_with_loss, 80),
    "Split": (gen_split, 30),
    "Swish": (gen_swish, 30),
    "Permute": (gen_permute, 40),
    "ShuffleChannel": (gen_shuffle_channel, 40),
    "Silence": (gen_silence, 10),
    "TanH": (gen_tanh, 30),
    "Clip": (gen_clip, 20),
}

CONFIGS = [(layer_type, index) for layer_type, (_, count) in GENERATORS.items()
           for index in range(count)]


# ---- running one configuration --------------------------------------------------------------

@pytest.fixture(scope="module")
def drivers():
    runtime = hn.Runtime()
    return runtime, runtime.add("cpu"), runtime.add("reference")


def config_rng(layer_type, index):
    return np.random.RandomState([SEED, zlib.crc32(layer_type.encode()), index])


def forward_error(got, want):
    """max |got - want| / max |want|; inf on a shape mismatch, nan on a NaN."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), TINY))


def gradient_error(got, want):
    """||got - want||_2 / ||want||_2."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.inf
    return float(np.linalg.norm((got - want).ravel()) / max(float(np.linalg.norm(want)), TINY))


def torch_reference(case, propagate, top_diffs, outputs=None):
    """The reference outputs, input gradients (None where propagate_down is false) and
    parameter gradients, as float64 numpy arrays."""
    xs = [torch.tensor(x, dtype=torch.float64, requires_grad=bool(p and case.backward))
          for x, p in zip(case.inputs, propagate)]
    ps = [torch.tensor(p, dtype=torch.float64,
                       requires_grad=case.param_grads and case.backward) for p in case.params]
    outs = case.reference(xs, ps, outputs) if case.uses_outputs else case.reference(xs, ps)
    wrt = [t for t in xs + ps if t.requires_grad]
    grads = {}
    terms = [(o * torch.from_numpy(d.astype(np.float64))).sum()
             for o, d in zip(outs, top_diffs) if o.requires_grad]
    if wrt and terms:
        for t, g in zip(wrt, torch.autograd.grad(sum(terms), wrt, allow_unused=True)):
            grads[id(t)] = g
    as_numpy = [o.detach().numpy() for o in outs]
    input_grads = [None if not p else
                   grads.get(id(x), torch.zeros_like(x)).detach().numpy()
                   for x, p in zip(xs, propagate)]
    param_grads = [grads.get(id(p), torch.zeros_like(p)).detach().numpy()
                   if case.param_grads else np.zeros(p.shape) for p in ps]
    return as_numpy, input_grads, param_grads


def run_library(case, layer, driver, out_shapes, top_diffs, propagate, wrapped_params):
    """One forward and backward: outputs, parameter values after forward, input diffs and
    parameter diffs, as numpy copies."""
    param_arrays = []
    for i, value in enumerate(case.params):
        if wrapped_params:
            data, diff = value.copy(), np.zeros_like(value)
            layer.set_param(i, hn.Tensor.wrap(data, diff))
            param_arrays.append((data, diff))
        else:
            own = layer.param(i)
            own.data[...] = value
            own.diff[...] = 0  # Caffe layers add into parameter diffs
            param_arrays.append((own.data, own.diff))
    xs = [x.copy() for x in case.inputs]
    dxs = [np.full_like(x, SENTINEL) for x in xs]
    inputs = [hn.Tensor.wrap(x, dx) for x, dx in zip(xs, dxs)]
    if case.in_place:
        ys, dys, outputs = [xs[0]], [dxs[0]], [inputs[0]]
    else:
        ys = [np.full(shape, np.nan, np.float32) for shape in out_shapes]
        dys = [np.zeros(shape, np.float32) for shape in out_shapes]
        outputs = [hn.Tensor.wrap(y, dy) for y, dy in zip(ys, dys)]
    layer.forward(driver, inputs, outputs)
    got = {"outputs": [y.copy() for y in ys],
           "params_after": [data.copy() for data, _ in param_arrays]}
    if case.backward:
        for dy, value in zip(dys, top_diffs):
            dy[...] = value
        layer.backward(driver, inputs, outputs, propagate)
        got["input_grads"] = [dx.copy() for dx in dxs]
        got["param_grads"] = [diff.copy() for _, diff in param_arrays]
    return got


def compare(run, case, got, want, propagate):
    """The errors of one run against the reference, as readable lines."""
    errors = []

    def check(what, error, tolerance, g, w):
        if not error <= tolerance:
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            scale = (f"max |got - want| {np.max(np.abs(g - w)):.3g}, max |want| "
                     f"{np.max(np.abs(w)):.3g}" if tolerance == FORWARD_TOLERANCE else
                     f"|got - want| {np.linalg.norm(g - w):.3g}, |want| {np.linalg.norm(w):.3g}")
            errors.append(f"{run}: {what}: relative error {error:.3g} > {tolerance:g} "
                          f"({scale})" if g.shape == w.shape and g.size else
                          f"{run}: {what}: shape {g.shape}, the reference's {w.shape}")

    outputs, input_grads, param_grads = want
    for i, (g, w) in enumerate(zip(got["outputs"], outputs)):
        check(f"output {i}", forward_error(g, w), FORWARD_TOLERANCE, g, w)
    if case.params_after is not None:
        for i, (g, w) in enumerate(zip(got["params_after"], case.params_after(
                [torch.tensor(x, dtype=torch.float64) for x in case.inputs]))):
            check(f"parameter {i} after forward", forward_error(g, w), FORWARD_TOLERANCE, g, w)
    if not case.backward:
        return errors
    for i, (g, w) in enumerate(zip(got["input_grads"], input_grads)):
        if case.in_place and i == 0:
            check(f"input {i} gradient (in place)", gradient_error(g, w), GRADIENT_TOLERANCE,
                  g, w)
        elif propagate[i]:
            check(f"input {i} gradient", gradient_error(g, w), GRADIENT_TOLERANCE, g, w)
        elif not (g == SENTINEL).all():
            errors.append(f"{run}: input {i} diff written with propagate_down false "
                          "(Caffe leaves it alone)")
    for i, (g, w) in enumerate(zip(got["param_grads"], param_grads)):
        check(f"parameter {i} gradient", gradient_error(g, w), GRADIENT_TOLERANCE, g, w)
    return errors


def describe(layer_type, index, case, split, wrapped_params):
    shapes = ", ".join(str(tuple(x.shape)) for x in case.inputs)
    params = ""
    if case.params:
        params = ("; parameters wrapped (set_param)" if wrapped_params else
                  "; the layer's own parameters")
    return (f"{layer_type} config {index}: {case.prototxt}\n"
            f"  inputs {shapes}; phase {case.phase}; split {split}{params}"
            f"{'; in place' if case.in_place else ''}"
            f"{f'; propagate_down {case.propagate}' if case.propagate else ''}")


@pytest.mark.parametrize("layer_type,index", CONFIGS,
                         ids=[f"{t}-{i:03d}" for t, i in CONFIGS])
def test_layer_matches_pytorch(drivers, layer_type, index):
    runtime, cpu, reference = drivers
    rng = config_rng(layer_type, index)
    case = GENERATORS[layer_type][0](rng)
    fraction = float(rng.choice([0.25, 0.4, 0.5, 0.6, 0.75]))
    split = f"cpu:{fraction:g},reference:{1 - fraction:g}"
    wrapped_params = bool(rng.rand() < 0.5)
    title = describe(layer_type, index, case, split, wrapped_params)

    if case.rejects is not None:
        try:
            layer = hn.Layer(case.prototxt)
            layer.set_phase(case.phase)
            layer.setup([hn.Tensor.wrap(x.copy()) for x in case.inputs])
        except hn.Error:
            return
        pytest.fail(f"{title}\n  accepted; it must be refused: {case.rejects}")

    propagate = case.propagate or [True] * len(case.inputs)
    if not case.backward:
        propagate = [False] * len(case.inputs)
    want_shapes = [tuple(o.shape) for o in torch_reference(case, propagate, [])[0]]
    try:
        layer = hn.Layer(case.prototxt)
        layer.set_phase(case.phase)
        out_shapes = [tuple(s) for s in layer.setup([hn.Tensor.wrap(x.copy())
                                                      for x in case.inputs])]
    except hn.Error as error:
        pytest.fail(f"{title}\n  setup failed: {error}")
    if out_shapes != want_shapes:
        pytest.fail(f"{title}\n  output shapes {out_shapes}, the reference's {want_shapes}")
    param_shapes = [tuple(layer.param(i).shape) for i in range(layer.num_params)]
    want_param_shapes = [tuple(p.shape) for p in case.params]
    if param_shapes != want_param_shapes:
        pytest.fail(f"{title}\n  parameter shapes {param_shapes}, Caffe's {want_param_shapes}")
    errors = []
    for i, value in enumerate(case.initial_params or []):
        error = forward_error(layer.param(i).data, value)
        if not error <= FORWARD_TOLERANCE:
            errors.append(f"setup: parameter {i} is not its constant filler's value")

    # Loss tops carry the loss weight in their diff (Caffe's top[0]->cpu_diff()[0]).
    top_diffs = [np.array(rng.uniform(0.5, 2.0), np.float32) if shape == () else
                 normal(rng, shape) for shape in want_shapes]
    want = None if case.uses_outputs else torch_reference(case, propagate, top_diffs)
    runs = (("cpu", cpu, ""), ("reference", reference, ""), (f"split {split}", cpu, split))
    for run, driver, split_text in runs:
        try:
            layer.set_split(runtime, split_text)
            got = run_library(case, layer, driver, out_shapes, top_diffs, propagate,
                              wrapped_params)
            if case.uses_outputs:
                want = torch_reference(case, propagate, top_diffs, got["outputs"])
        except (hn.Error, AssertionError) as error:
            errors.append(f"{run}: {type(error).__name__}: {error}")
            continue
        errors += compare(run, case, got, want, propagate)
    if errors:
        pytest.fail(f"{title}\n  " + "\n  ".join(errors))


def test_every_layer_type_has_a_generator():
    """A layer type added to the library without a generator here fails this test."""
    with pytest.raises(hn.Error) as error:
        hn.Layer('name: "x" type: "NoSuchLayerType"')
    listed = re.search(r"known types: ([^\[]*)", str(error.value))
    assert listed, f"the error names no known types: {error.value}"
    known = listed.group(1).strip().split(", ")
    assert sorted(known) == sorted(GENERATORS), (
        f"layer types without a generator: {sorted(set(known) - set(GENERATORS))}")
