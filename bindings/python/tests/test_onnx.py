"""ONNX models in (issue 37), against the real thing: torchvision's models exported by
torch.onnx.export (opset 13, a symbolic batch), read by hybridnn, forward compared with
PyTorch's on the same input (max |got - want| / max |want| <= 1e-4) on the cpu driver, the
reference driver and a split of the batch between them; one-node models built with
onnx.helper against PyTorch's functional ops, one per operator and attribute the importer
reads; and the errors that name the node, its op type and the attribute for what it does not
read.

Skipped visibly without python3-torch, python3-torchvision or python3-onnx, or when the
library was built without libonnx-dev.
"""
import math
import pathlib

import numpy as np
import pytest

import hybridnn as hn

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
torchvision = pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F = torch.nn.functional
TOLERANCE = 1e-4  # max |got - want| / max |want|


def relative_error(got, want):
    return float(np.abs(np.asarray(got) - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.fixture(scope="module")
def runtime():
    rt = hn.Runtime()
    return rt, {"cpu": rt.add("cpu"), "reference": rt.add("reference")}


def load(runtime, path, batch, driver="cpu", **options):
    rt, drivers = runtime
    try:
        return hn.Net(rt, drivers[driver], str(path), batch=batch, phase="test", **options)
    except hn.Error as failure:
        if "reads no ONNX files" in str(failure):
            pytest.skip("hybridnn was built without libonnx-dev")
        raise


def run(net, inputs):
    for name, value in inputs.items():
        net.blob(name).data[...] = value
    net.forward()
    return {name: np.array(net.blob(name).data) for name in net.outputs}


# ---- torchvision models ---------------------------------------------------------------------

# name -> (input size, drivers): the reference driver's loops are slow, so it runs the
# smaller models only.
MODELS = {
    "resnet18": (64, ["cpu", "reference", "split"]),
    "squeezenet1_1": (64, ["cpu", "reference", "split"]),
    "googlenet": (64, ["cpu", "split"]),
    "resnet50": (64, ["cpu", "split"]),
    "mobilenet_v2": (64, ["cpu", "split"]),
    "mobilenet_v3_small": (64, ["cpu", "split"]),
    "efficientnet_b0": (64, ["cpu", "split"]),
    "regnet_y_400mf": (64, ["cpu", "split"]),
    "densenet121": (64, ["cpu"]),
    "shufflenet_v2_x1_0": (64, ["cpu", "split"]),
}


def torchvision_model(name):
    torch.manual_seed(0)
    extra = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = getattr(torchvision.models, name)(weights=None, num_classes=10, **extra)
    # Statistics of real activations for every BatchNorm (freshly made ones are 0 and 1,
    # and a net of them passes its inputs through so weakly that the output is the bias).
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # a cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, MODELS[name][0], MODELS[name][0]))
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Exports each model once: name -> (path, input, PyTorch's output)."""
    folder = tmp_path_factory.mktemp("onnx-models")
    cache = {}

    def get(name):
        if name not in cache:
            model = torchvision_model(name)
            size = MODELS[name][0]
            x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
            path = folder / f"{name}.onnx"
            torch.onnx.export(model, x, str(path), opset_version=13, input_names=["data"],
                              output_names=["logits"],
                              dynamic_axes={"data": {0: "batch"}, "logits": {0: "batch"}})
            with torch.no_grad():
                want = model(x).numpy()
            cache[name] = (path, x.numpy(), want)
        return cache[name]

    return get


@pytest.mark.parametrize("name,driver", [(name, driver) for name, (_, drivers) in MODELS.items()
                                         for driver in drivers])
def test_torchvision_model_forward_matches_pytorch(runtime, exported, name, driver):
    path, x, want = exported(name)
    options = {"split": "cpu:0.5,reference:0.5"} if driver == "split" else {}
    net = load(runtime, path, 2, "cpu" if driver == "split" else driver, **options)
    got = run(net, {"data": x})["logits"]
    assert got.shape == want.shape
    # The outputs depend on the input (not the bias alone), so the comparison means something.
    assert np.abs(want[0] - want[1]).max() > 1e-3 * np.abs(want).max()
    assert relative_error(got, want) <= TOLERANCE, (name, driver, relative_error(got, want))


@pytest.mark.parametrize("name", list(MODELS))
def test_torchvision_model_exports_back_to_onnx(runtime, exported, tmp_path, name):
    """Import -> save_onnx -> ONNX's checker -> import again: bitwise the first import's
    outputs; and ONNX Runtime, where installed, reads the written model and computes
    PyTorch's outputs."""
    path, x, want = exported(name)
    net = load(runtime, path, 2)
    first = run(net, {"data": x})["logits"]
    written = tmp_path / f"{name}.onnx"
    net.save_onnx(str(written))
    onnx.checker.check_model(str(written))
    again = load(runtime, written, 2)
    (output,) = again.outputs
    assert np.array_equal(run(again, {"data": x})[output], first)
    ort = onnx_runtime()
    if ort is not None:
        session = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"data": x})
        assert relative_error(got, want) <= TOLERANCE, (name, relative_error(got, want))


def onnx_runtime():
    """onnxruntime where installed (pip install onnxruntime), else None: the checks against
    it are then left out, and test_onnx_runtime_is_installed says so."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def test_onnx_runtime_is_installed():
    if onnx_runtime() is None:
        pytest.skip("onnxruntime is not installed (pip install onnxruntime): the exported "
                    "models were checked by ONNX's checker and hybridnn's importer only")


@pytest.mark.parametrize("prototxt", ["bvlc_googlenet_deploy", "resnet50_deploy",
                                      "mobilenet_v1_deploy", "mnist_lenet_train_test"])
def test_caffe_zoo_net_exports_to_onnx(runtime, tmp_path, prototxt):
    """A Caffe zoo net with random weights -> save_onnx -> ONNX's checker, hybridnn's importer
    (bitwise) and, where installed, ONNX Runtime (<= 1e-4)."""
    models = pathlib.Path(__file__).resolve().parents[3].parent / "shared" / "models"
    if not models.is_dir():
        pytest.skip(f"no Caffe models at {models}")
    lenet = prototxt.startswith("mnist")
    output = "ip2" if lenet else "prob"
    rt, drivers = runtime
    net = hn.Net(rt, drivers["cpu"], str(models / f"{prototxt}.prototxt"), batch=2,
                 phase="test", data="synthetic:1x28x28", seed=5, keep_blobs=f"data,{output}")
    rng = np.random.default_rng(3)
    for i, name in enumerate(net.param_names):
        p = np.asarray(net.param(i).data)
        fan_in = p.size // p.shape[0] if p.ndim >= 2 else 1
        value = rng.uniform(-1, 1, p.shape) * np.sqrt(3.0 / fan_in)
        if p.ndim == 1 and net.layer_types[net.layer_names.index(name.rsplit(".", 1)[0])] \
                == "BatchNorm":
            value = {"0": value, "1": 1.0 + value / 2, "2": np.ones_like(value)}[name[-1]]
        p[...] = value
    if not lenet:
        net.blob("data").data[...] = rng.standard_normal(net.blob("data").shape)
    net.forward()
    x = np.array(net.blob("data").data)
    want = np.array(net.blob(output).data)
    path = tmp_path / f"{prototxt}.onnx"
    net.save_onnx(str(path))
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["data"]
    assert [o.name for o in model.graph.output] == [output]
    back = load(runtime, path, 2)
    assert np.array_equal(run(back, {"data": x})[output], want)
    ort = onnx_runtime()
    if ort is not None:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"data": x})
        assert relative_error(got, want) <= TOLERANCE, relative_error(got, want)


def test_net_from_onnx_is_the_constructor_for_onnx_files(runtime, exported, tmp_path):
    path, x, want = exported("squeezenet1_1")
    rt, drivers = runtime
    net = hn.Net.from_onnx(rt, drivers["cpu"], str(path), batch=2, phase="test")
    assert relative_error(run(net, {"data": x})["logits"], want) <= TOLERANCE
    with pytest.raises(ValueError, match="does not end in .onnx"):
        hn.Net.from_onnx(rt, drivers["cpu"], str(tmp_path / "net.prototxt"))


def test_the_batch_of_an_imported_model_is_the_nets(runtime, exported):
    path, x, want = exported("squeezenet1_1")
    net = load(runtime, path, 1)
    assert net.blob("data").shape == (1, 3, 64, 64)
    got = run(net, {"data": x[1:2]})["logits"]
    assert relative_error(got, want[1:2]) <= TOLERANCE


# ---- one node at a time ---------------------------------------------------------------------

def one_node_model(path, op, inputs, output_rank, attributes=None, initializers=None,
                   opset=13):
    """A model of one node: inputs {name: array} (graph inputs) and initializers {name: array}
    in the node's input order (inputs first, as listed), one float output."""
    initializers = initializers or {}
    node = helper.make_node(op, list(inputs) + list(initializers), ["y"], name="the_node",
                            **(attributes or {}))
    initializers = {n: v for n, v in initializers.items() if v is not None}
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
         for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * output_rank)],
        [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), n)
         for n, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return path


def t(array):
    return torch.from_numpy(np.asarray(array, np.float64))


def rng_array(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def case_conv(rng):
    x, w, b = rng_array(rng, 2, 4, 9, 8), rng_array(rng, 6, 2, 3, 2), rng_array(rng, 6)
    attrs = {"group": 2, "strides": [2, 1], "pads": [1, 2, 1, 2], "dilations": [1, 2]}
    want = F.conv2d(t(x), t(w), t(b), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    return "Conv", {"x": x}, {"w": w, "b": b}, attrs, want


def case_conv_same_upper(rng):
    x, w = rng_array(rng, 1, 3, 7, 7), rng_array(rng, 4, 3, 3, 3)
    want = F.conv2d(t(x), t(w), padding=1)
    return "Conv", {"x": x}, {"w": w}, {"auto_pad": "SAME_UPPER"}, want


def case_conv_unequal_pads(rng):
    # A Pad layer in front adds what one side pads more than the other.
    x, w = rng_array(rng, 2, 3, 6, 7), rng_array(rng, 4, 3, 3, 3)
    want = F.conv2d(F.pad(t(x), (1, 2, 0, 1)), t(w))
    return "Conv", {"x": x}, {"w": w}, {"pads": [0, 1, 1, 2]}, want


def case_conv_same_upper_stride_2(rng):
    # TensorFlow's SAME with a stride: 8 -> 4 pads 0 before and 1 after.
    x, w, b = rng_array(rng, 2, 3, 8, 8), rng_array(rng, 4, 3, 3, 3), rng_array(rng, 4)
    want = F.conv2d(F.pad(t(x), (0, 1, 0, 1)), t(w), t(b), stride=2)
    return "Conv", {"x": x}, {"w": w, "b": b}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, want


def case_max_pool_same_upper(rng):
    x = rng_array(rng, 2, 3, 8, 8)
    want = F.max_pool2d(F.pad(t(x), (0, 1, 0, 1), value=-math.inf), 3, stride=2)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}
    return "MaxPool", {"x": x}, {}, attrs, want


def case_pad(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    pads = np.array([0, 0, 1, 2, 0, 1, 0, 3], np.int64)
    want = F.pad(t(x), (2, 3, 1, 0, 0, 1), value=0.5)
    return "Pad", {"x": x}, {"pads": pads, "value": np.array(0.5, np.float32)}, {}, want


def case_pad_reflect(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)
    want = F.pad(t(x), (2, 1, 1, 2), mode="reflect")
    return "Pad", {"x": x}, {"pads": pads}, {"mode": "reflect"}, want


def case_pad_edge(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    pads = np.array([0, 0, 3, 0, 0, 0, 1, 4], np.int64)
    want = F.pad(t(x), (0, 4, 3, 1), mode="replicate")
    return "Pad", {"x": x}, {"pads": pads}, {"mode": "edge"}, want


def case_log_softmax(rng):
    x = rng_array(rng, 3, 6) * 30  # probabilities far below float's smallest
    return "LogSoftmax", {"x": x}, {}, {"axis": 1}, F.log_softmax(t(x), dim=1)


def case_conv_transpose(rng):
    x, w, b = rng_array(rng, 2, 4, 3, 4), rng_array(rng, 4, 3, 3, 3), rng_array(rng, 6)
    want = F.conv_transpose2d(t(x), t(w), t(b), stride=2, padding=1, output_padding=(1, 0),
                              groups=2)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0], "group": 2}
    return "ConvTranspose", {"x": x}, {"w": w, "b": b}, attrs, want


def case_gemm(rng):
    a, b, c = rng_array(rng, 3, 5), rng_array(rng, 5, 4), rng_array(rng, 4)
    want = 0.5 * t(a) @ t(b) + 2.0 * t(c)
    return "Gemm", {"a": a}, {"b": b, "c": c}, {"alpha": 0.5, "beta": 2.0}, want


def case_gemm_trans_b(rng):
    a, b, c = rng_array(rng, 3, 5), rng_array(rng, 4, 5), rng_array(rng, 1, 4)
    want = t(a) @ t(b).T + t(c)
    return "Gemm", {"a": a}, {"b": b, "c": c}, {"transB": 1}, want


def case_matmul(rng):
    a, b = rng_array(rng, 3, 5), rng_array(rng, 5, 2)
    return "MatMul", {"a": a}, {"b": b}, {}, t(a) @ t(b)


def case_max_pool_ceil(rng):
    x = rng_array(rng, 2, 3, 8, 9)
    want = F.max_pool2d(t(x), 3, stride=2, padding=1, ceil_mode=True)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    return "MaxPool", {"x": x}, {}, attrs, want


def case_average_pool(rng):
    x = rng_array(rng, 2, 3, 8, 8)
    want = F.avg_pool2d(t(x), (3, 2), stride=(2, 2), padding=(1, 1), count_include_pad=True)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 1],
             "count_include_pad": 1}
    return "AveragePool", {"x": x}, {}, attrs, want


def case_average_pool_without_pads_counted(rng):
    x = rng_array(rng, 2, 3, 7, 8)
    want = F.avg_pool2d(t(x), 3, stride=2, padding=1, count_include_pad=False)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
             "count_include_pad": 0}
    return "AveragePool", {"x": x}, {}, attrs, want


def case_average_pool_ceil_without_pads_counted(rng):
    x = rng_array(rng, 2, 3, 8, 8)
    want = F.avg_pool2d(t(x), 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    return "AveragePool", {"x": x}, {}, attrs, want


def case_global_average_pool(rng):
    x = rng_array(rng, 2, 3, 5, 4)
    return "GlobalAveragePool", {"x": x}, {}, {}, t(x).mean(dim=(2, 3), keepdim=True)


def case_global_max_pool(rng):
    x = rng_array(rng, 2, 3, 5, 4)
    return "GlobalMaxPool", {"x": x}, {}, {}, t(x).amax(dim=(2, 3), keepdim=True)


def case_batch_norm(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    scale, bias, mean = rng_array(rng, 3), rng_array(rng, 3), rng_array(rng, 3)
    var = np.abs(rng_array(rng, 3)) + 0.5
    want = F.batch_norm(t(x), t(mean), t(var), t(scale), t(bias), training=False, eps=1e-3)
    return ("BatchNormalization", {"x": x},
            {"scale": scale, "bias": bias, "mean": mean, "var": var}, {"epsilon": 1e-3}, want)


def case_leaky_relu(rng):
    x = rng_array(rng, 2, 7)
    return "LeakyRelu", {"x": x}, {}, {"alpha": 0.2}, F.leaky_relu(t(x), 0.2)


def case_softmax(rng):
    x = rng_array(rng, 3, 6)
    return "Softmax", {"x": x}, {}, {"axis": 1}, F.softmax(t(x), dim=1)


def case_lrn(rng):
    x = rng_array(rng, 2, 7, 3, 3)
    want = F.local_response_norm(t(x), 5, alpha=2e-3, beta=0.6, k=1.5)
    return "LRN", {"x": x}, {}, {"size": 5, "alpha": 2e-3, "beta": 0.6, "bias": 1.5}, want


def case_flatten(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    return "Flatten", {"x": x}, {}, {"axis": 1}, t(x).reshape(2, -1)


def case_reshape(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    shape = np.array([0, -1, 5], np.int64)
    return "Reshape", {"x": x}, {"shape": shape}, {}, t(x).reshape(2, 12, 5)


def case_add(rng):
    a, b = rng_array(rng, 2, 3, 4), rng_array(rng, 2, 3, 4)
    return "Add", {"a": a, "b": b}, {}, {}, t(a) + t(b)


def case_concat(rng):
    a, b = rng_array(rng, 2, 3, 4), rng_array(rng, 2, 5, 4)
    return "Concat", {"a": a, "b": b}, {}, {"axis": 1}, torch.cat([t(a), t(b)], 1)


def case_clip_relu6(rng):
    x = rng_array(rng, 2, 3, 4) * 5
    return ("Clip", {"x": x}, {"min": np.array(0, np.float32), "max": np.array(6, np.float32)},
            {}, torch.clamp(t(x), 0, 6))


def case_clip_max_only(rng):
    x = rng_array(rng, 2, 5)
    # The min input left out (an empty name) and max given.
    return "Clip", {"x": x}, {"": None, "max": np.array(0.5, np.float32)}, {}, t(x).clamp(max=0.5)


def case_mul(rng):
    a, b = rng_array(rng, 2, 3, 4), rng_array(rng, 2, 3, 4)
    return "Mul", {"a": a, "b": b}, {}, {}, t(a) * t(b)


def case_mul_per_channel(rng):
    # Squeeze-and-excitation: per-channel factors of each image, [N, C, 1, 1].
    a, b = rng_array(rng, 2, 3, 4, 5), rng_array(rng, 2, 3, 1, 1)
    return "Mul", {"a": a, "b": b}, {}, {}, t(a) * t(b)


def case_mul_per_channel_first(rng):
    a, b = rng_array(rng, 2, 3, 1, 1), rng_array(rng, 2, 3, 4, 5)
    return "Mul", {"a": a, "b": b}, {}, {}, t(a) * t(b)


def case_hard_sigmoid(rng):
    x = rng_array(rng, 2, 3, 4) * 4
    want = torch.clamp(0.3 * t(x) + 0.4, 0, 1)
    return "HardSigmoid", {"x": x}, {}, {"alpha": 0.3, "beta": 0.4}, want


def case_sigmoid(rng):
    x = rng_array(rng, 2, 5)
    return "Sigmoid", {"x": x}, {}, {}, torch.sigmoid(t(x))


def case_mul_by_channel_constant(rng):
    x, c = rng_array(rng, 2, 3, 4, 5), rng_array(rng, 3, 1, 1)
    return "Mul", {"x": x}, {"c": c}, {}, t(x) * t(c)


def case_add_scalar_constant(rng):
    x, c = rng_array(rng, 2, 3, 4), np.array(0.75, np.float32)
    return "Add", {"x": x}, {"c": c}, {}, t(x) + 0.75


def case_sub(rng):
    a, b = rng_array(rng, 2, 3, 4), rng_array(rng, 2, 3, 4)
    return "Sub", {"a": a, "b": b}, {}, {}, t(a) - t(b)


def case_div_by_constant(rng):
    x, c = rng_array(rng, 2, 3, 4, 5), rng_array(rng, 3, 1, 1) + 3
    return "Div", {"x": x}, {"c": c}, {}, t(x) / t(c)


def case_max(rng):
    a, b, c = rng_array(rng, 2, 3, 4), rng_array(rng, 2, 3, 4), rng_array(rng, 2, 3, 4)
    return "Max", {"a": a, "b": b, "c": c}, {}, {}, torch.maximum(torch.maximum(t(a), t(b)), t(c))


def case_transpose(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    return "Transpose", {"x": x}, {}, {"perm": [0, 3, 1, 2]}, t(x).permute(0, 3, 1, 2)


def case_slice(rng):
    x = rng_array(rng, 2, 6, 4)
    inits = {"starts": np.array([1], np.int64), "ends": np.array([4], np.int64),
             "axes": np.array([1], np.int64)}
    return "Slice", {"x": x}, inits, {}, t(x)[:, 1:4]


def case_reduce_mean(rng):
    x = rng_array(rng, 2, 3, 4, 5)
    return "ReduceMean", {"x": x}, {}, {"axes": [2, 3], "keepdims": 0}, t(x).mean((2, 3))


def case_unsqueeze(rng):
    x = rng_array(rng, 2, 3)
    return "Unsqueeze", {"x": x}, {"axes": np.array([2, 3], np.int64)}, {}, t(x)[:, :, None, None]


def case_squeeze(rng):
    x = rng_array(rng, 2, 3, 1, 1)
    return "Squeeze", {"x": x}, {"axes": np.array([2, 3], np.int64)}, {}, t(x)[:, :, 0, 0]


CASES = [case_conv, case_conv_same_upper, case_conv_unequal_pads, case_conv_same_upper_stride_2,
         case_max_pool_same_upper, case_pad, case_pad_reflect, case_pad_edge, case_log_softmax,
         case_conv_transpose, case_gemm, case_gemm_trans_b, case_matmul,
         case_max_pool_ceil, case_average_pool, case_average_pool_without_pads_counted,
         case_average_pool_ceil_without_pads_counted, case_global_average_pool, case_global_max_pool,
         case_batch_norm, case_leaky_relu, case_softmax, case_lrn, case_flatten, case_reshape,
         case_add, case_concat, case_sigmoid, case_clip_relu6, case_clip_max_only, case_mul,
         case_mul_per_channel, case_mul_per_channel_first, case_hard_sigmoid,
         case_mul_by_channel_constant, case_add_scalar_constant, case_sub, case_div_by_constant,
         case_max, case_transpose, case_slice, case_reduce_mean, case_unsqueeze, case_squeeze]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__[5:])
@pytest.mark.parametrize("driver", ["cpu", "reference"])
def test_one_node_matches_pytorch(runtime, tmp_path, case, driver):
    rng = np.random.RandomState(abs(hash(case.__name__)) % (2**31))
    op, inputs, initializers, attrs, want = case(rng)
    path = one_node_model(tmp_path / "model.onnx", op, inputs, want.dim(), attrs, initializers)
    batch = next(iter(inputs.values())).shape[0]
    net = load(runtime, path, batch, driver)
    got = run(net, inputs)["y"]
    want = want.numpy()
    assert got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__[5:])
def test_one_node_model_exports_back(runtime, tmp_path, case):
    """Each one-node model read, written by save_onnx and read again computes bitwise what
    it computed (and ONNX's checker accepts what was written)."""
    rng = np.random.RandomState(abs(hash(case.__name__)) % (2**31))
    op, inputs, initializers, attrs, want = case(rng)
    path = one_node_model(tmp_path / "model.onnx", op, inputs, want.dim(), attrs, initializers)
    batch = next(iter(inputs.values())).shape[0]
    first = run(load(runtime, path, batch), inputs)["y"]
    net = load(runtime, path, batch)
    written = tmp_path / "written.onnx"
    net.save_onnx(str(written))
    onnx.checker.check_model(str(written))
    again = load(runtime, written, batch)
    (output,) = again.outputs
    assert np.array_equal(run(again, inputs)[output], first)


def test_silu_reads_as_one_swish_layer_and_matches_pytorch(runtime, tmp_path):
    """PyTorch exports SiLU as Sigmoid and Mul(x, sigmoid): one Swish layer (no Split of x);
    a Sigmoid read by another node as well keeps its own layer."""
    rng = np.random.RandomState(5)
    x = rng_array(rng, 2, 3, 4, 5)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Mul", ["s", "x"], ["y"], name="silu"),
             helper.make_node("Sigmoid", ["y"], ["t"], name="sig2"),
             helper.make_node("Mul", ["y", "t"], ["z"], name="silu2"),
             helper.make_node("Relu", ["t"], ["r"], name="relu")]
    graph = helper.make_graph(
        nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 4) for n in ("z", "r")])
    path = tmp_path / "silu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    net = load(runtime, path, 2)
    assert net.layer_types.count("Swish") == 1 and "Eltwise" in net.layer_types
    got = run(net, {"x": x})
    y = F.silu(t(x))
    assert relative_error(got["z"], (y * torch.sigmoid(y)).numpy()) <= TOLERANCE
    assert relative_error(got["r"], torch.sigmoid(y).numpy()) <= TOLERANCE


class ShuffleUnits(torch.nn.Module):
    """ShuffleNet v2's stride-1 unit twice over (x.chunk(2): two Slice nodes; cat; view,
    transpose, view), then a shuffle of one input in 4 groups, then two slices that leave
    pieces unread ([2, 4) and [6, 8) of 8 channels). With `keep_cat`, the first unit's
    concatenation is also a graph output."""

    def __init__(self, keep_cat):
        super().__init__()
        self.keep_cat = keep_cat
        self.branch = torch.nn.Conv2d(4, 4, 3, padding=1)

    @staticmethod
    def shuffle(x, groups):
        n, c, h, w = x.size()
        return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        cat = torch.cat((a, F.relu(self.branch(b))), dim=1)
        x = self.shuffle(cat, 2)
        a, b = x.chunk(2, dim=1)
        x = self.shuffle(torch.cat((a, self.branch(b)), dim=1), 2)
        x = self.shuffle(x, 4)
        y = x[:, 2:4] + x[:, 6:8]
        return (y, cat) if self.keep_cat else y


@pytest.mark.parametrize("keep_cat", [False, True])
def test_channel_shuffles_and_chunks_read_as_one_layer_each(runtime, tmp_path, keep_cat):
    """PyTorch's channel shuffle (Reshape, Transpose, Reshape) becomes one ShuffleChannel
    layer, with the Concat before it unless something else reads the Concat's output; the
    Slice nodes of one input along one axis become one Slice layer, and that layer becomes
    the cut of the ShuffleChannel whose output it alone reads. Forward and the export back
    match PyTorch."""
    torch.manual_seed(4)
    model = ShuffleUnits(keep_cat).eval()
    x = np.random.RandomState(9).standard_normal((2, 8, 5, 5)).astype(np.float32)
    path = tmp_path / "units.onnx"
    outputs = ["y", "cat"] if keep_cat else ["y"]
    torch.onnx.export(model, torch.from_numpy(x), str(path), opset_version=13,
                      input_names=["x"], output_names=outputs,
                      dynamic_axes={"x": {0: "batch"}, **{o: {0: "batch"} for o in outputs}})
    net = load(runtime, path, 2)
    types = net.layer_types
    assert types.count("ShuffleChannel") == 3
    assert "Permute" not in types and "Reshape" not in types
    assert types.count("Concat") == (1 if keep_cat else 0)
    # Two chunks and the two slices of the shuffled x: one Slice layer each, the pieces no
    # node reads ([0, 2) and [4, 6) of the last) silenced; all but the first chunk (of the
    # input) cut the output of a shuffle that nothing else reads, so that shuffle cuts it.
    assert types.count("Slice") == 1 and types.count("Silence") == 1
    with torch.no_grad():
        want = model(torch.from_numpy(x))
    want = want if keep_cat else (want,)
    got = run(net, {"x": x})
    for name, value in zip(outputs, want):
        # "cat" is read inside the net too: no output of the Net's, a blob of it.
        assert relative_error(np.array(net.blob(name).data), value.numpy()) <= TOLERANCE, name
    written = tmp_path / "written.onnx"
    net.save_onnx(str(written))
    onnx.checker.check_model(str(written))
    again = load(runtime, written, 2)
    assert again.layer_types.count("ShuffleChannel") == 3
    assert again.layer_types.count("Slice") == 1
    assert np.array_equal(run(again, {"x": x})[again.outputs[0]], got["y"])


def test_the_shapes_of_pad_and_conv_transpose_outputs_feed_later_auto_pads(runtime, tmp_path):
    """auto_pad SAME needs its input's size: after a Pad and after a ConvTranspose the
    importer must know the sizes they make (each SAME here pads 0 before and 1 after; with
    the input's size kept it would pad 1 and 1)."""
    rng = np.random.RandomState(6)
    x = rng_array(rng, 2, 2, 5, 5)
    w1, w2, w3 = rng_array(rng, 3, 2, 3, 3), rng_array(rng, 3, 2, 3, 3), rng_array(rng, 4, 2, 3, 3)
    pads = np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w1"], ["c"], name="conv", strides=[2, 2],
                              auto_pad="SAME_UPPER"),
             helper.make_node("ConvTranspose", ["c", "w2"], ["u"], name="up", strides=[2, 2],
                              pads=[1, 1, 1, 1], output_padding=[1, 1]),
             helper.make_node("Conv", ["u", "w3"], ["y"], name="conv2", strides=[2, 2],
                              auto_pad="SAME_UPPER")]
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("w1", w1), ("w2", w2), ("w3", w3), ("pads", pads))]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], inits)
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    p = F.pad(t(x), (0, 1, 1, 0))  # 6x6
    c = F.conv2d(F.pad(p, (0, 1, 0, 1)), t(w1), stride=2)  # 3x3
    u = F.conv_transpose2d(c, t(w2), stride=2, padding=1, output_padding=1)  # 6x6
    want = F.conv2d(F.pad(u, (0, 1, 0, 1)), t(w3), stride=2).numpy()
    got = run(load(runtime, path, 2), {"x": x})["y"]
    assert got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE


def test_split_of_opset_13_gives_each_part(runtime, tmp_path):
    x = np.random.RandomState(4).standard_normal((2, 7, 3)).astype(np.float32)
    node = helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], name="the_node", axis=1)
    graph = helper.make_graph(
        [node], "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 3) for n in "abc"],
        [numpy_helper.from_array(np.array([2, 4, 1], np.int64), "sizes")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    got = run(load(runtime, path, 2), {"x": x})
    for name, (begin, end) in zip("abc", [(0, 2), (2, 6), (6, 7)]):
        assert np.array_equal(got[name], x[:, begin:end])


def test_shape_arithmetic_is_folded_at_import(runtime, tmp_path):
    """x.view(n, 2, c // 2, h * w) written as PyTorch does: Shape, Gather, Div, Mul,
    Unsqueeze and Concat of the input's shape; the batch stays free (read at batch 3)."""
    class View(torch.nn.Module):
        def forward(self, x):
            n, c, h, w = x.size()
            return x.view(n, 2, c // 2, h * w).transpose(1, 2)

    x = np.random.RandomState(8).standard_normal((2, 6, 2, 3)).astype(np.float32)
    path = tmp_path / "view.onnx"
    torch.onnx.export(View(), torch.from_numpy(x), str(path), opset_version=13,
                      input_names=["data"], output_names=["y"],
                      dynamic_axes={"data": {0: "batch"}, "y": {0: "batch"}})
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Shape", "Gather", "Concat"} <= ops, ops
    x3 = np.random.RandomState(9).standard_normal((3, 6, 2, 3)).astype(np.float32)
    got = run(load(runtime, path, 3), {"data": x3})["y"]
    assert np.array_equal(got, torch.from_numpy(x3).view(3, 2, 3, 6).transpose(1, 2).numpy())


def test_no_layer_overwrites_an_output_its_producer_needs_for_backward(runtime, tmp_path):
    """Tanh -> BatchNormalization -> Relu: Tanh's gradient reads its output, so the BatchNorm
    (which computes in place where it can) must not overwrite it; the input's gradient is
    PyTorch's."""
    rng = np.random.RandomState(12)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    stats = [rng.standard_normal(3).astype(np.float32) for _ in range(3)]
    var = (rng.rand(3) + 0.5).astype(np.float32)
    nodes = [helper.make_node("Tanh", ["x"], ["h"], name="tanh"),
             helper.make_node("BatchNormalization", ["h", "s", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "tanh_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])],
        [numpy_helper.from_array(a, n) for a, n in zip(stats + [var], "sbmv")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    net = load(runtime, path, 2, force_backward=True)
    g = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    net.blob("x").data[...] = x
    net.forward()
    net.blob("y").diff[...] = g
    net.backward()
    xt = t(x).requires_grad_(True)
    s_, b_, m_, v_ = (t(a).view(1, 3, 1, 1) for a in stats + [var])
    y = torch.relu((torch.tanh(xt) - m_) / torch.sqrt(v_ + 1e-5) * s_ + b_)
    (y * t(g)).sum().backward()
    assert relative_error(np.array(net.blob("x").diff), xt.grad.numpy()) <= TOLERANCE


def test_a_constant_minus_a_value_matches_pytorch(runtime, tmp_path):
    x = np.random.RandomState(5).standard_normal((2, 3, 4, 5)).astype(np.float32)
    c = np.random.RandomState(6).standard_normal((1, 3, 1, 1)).astype(np.float32)
    node = helper.make_node("Sub", ["c", "x"], ["y"], name="the_node")
    graph = helper.make_graph(
        [node], "sub", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
        [numpy_helper.from_array(c, "c")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    got = run(load(runtime, path, 2), {"x": x})["y"]
    assert relative_error(got, (t(c) - t(x)).numpy()) <= TOLERANCE


def test_hard_swish_of_opset_14_matches_pytorch(runtime, tmp_path):
    x = np.random.RandomState(3).standard_normal((2, 3, 5)).astype(np.float32) * 4
    path = one_node_model(tmp_path / "m.onnx", "HardSwish", {"x": x}, 3, opset=14)
    got = run(load(runtime, path, 2), {"x": x})["y"]
    assert relative_error(got, F.hardswish(t(x)).numpy()) <= TOLERANCE


def test_batch_norm_exported_for_training_normalises_by_the_batch(runtime, tmp_path):
    """PyTorch's export with TrainingMode.TRAINING (opset 14): BatchNormalization with
    training_mode 1 normalises by the batch's statistics, in the test phase too, as the
    PyTorch module in train mode does; its input gradient matches too."""
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU())
    with torch.no_grad():  # statistics and an affine far from the defaults
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].weight.uniform_(0.5, 2)
        model[1].bias.uniform_(-1, 1)
    model.train()
    x = np.random.RandomState(8).standard_normal((3, 3, 6, 5)).astype(np.float32)
    path = tmp_path / "bn.onnx"
    torch.onnx.export(model, torch.from_numpy(x), str(path), opset_version=14,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    node = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "BatchNormalization")
    assert any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
    xt = torch.from_numpy(x).requires_grad_(True)
    want = model(xt)
    net = load(runtime, path, 3, force_backward=True)
    got = run(net, {"x": x})["y"]
    assert relative_error(got, want.detach().numpy()) <= TOLERANCE
    g = np.random.RandomState(9).standard_normal(got.shape).astype(np.float32)
    net.blob("y").diff[...] = g
    net.backward()
    (want * torch.from_numpy(g)).sum().backward()
    assert relative_error(np.array(net.blob("x").diff), xt.grad.numpy()) <= 1e-3
    # The stored statistics would give another output: the batch's are the ones used.
    model.eval()
    with torch.no_grad():
        assert relative_error(got, model(torch.from_numpy(x)).numpy()) > 0.01


@pytest.mark.parametrize("size", [[10, 8], [11, 9], [1, 1, 9, 7]])
def test_conv_transpose_output_shape_sets_the_pads_as_onnx_does(runtime, tmp_path, size):
    """ConvTranspose with output_shape (2 sizes, or [N, C, H, W]): the pads ONNX derives (the
    larger half of the total at the start), checked against the full transposed convolution
    cropped by hand."""
    rng = np.random.RandomState(10)
    x = rng_array(rng, 2, 3, 5, 4)
    w = rng_array(rng, 3, 2, 3, 3)
    b = rng_array(rng, 2)
    path = one_node_model(tmp_path / "m.onnx", "ConvTranspose", {"x": x}, 4,
                          {"strides": [2, 2], "output_shape": size}, {"w": w, "b": b})
    got = run(load(runtime, path, 2), {"x": x})["y"]
    full = F.conv_transpose2d(t(x), t(w), t(b), stride=2)  # 11 x 9
    h, w_ = size[-2:]
    top, left = (11 - h) - (11 - h) // 2, (9 - w_) - (9 - w_) // 2
    want = full[:, :, top:top + h, left:left + w_]
    assert got.shape == tuple(want.shape)
    assert relative_error(got, want.numpy()) <= TOLERANCE


# ---- what the importer refuses ----------------------------------------------------------------

def refused(runtime, path, batch=1):
    with pytest.raises(hn.Error) as failure:
        load(runtime, path, batch)
    return str(failure.value)


def test_an_unsupported_operator_is_named_with_its_node(runtime, tmp_path):
    x = np.zeros((1, 3, 4, 4), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "Elu", {"x": x}, 4)
    message = refused(runtime, path)
    assert "node 'the_node'" in message and "operator 'Elu' is not supported" in message
    assert "Conv" in message  # the supported set is listed


def test_an_unread_attribute_is_an_error(runtime, tmp_path):
    x = np.zeros((1, 3), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "Softmax", {"x": x}, 2,
                          {"axis": 1, "unheard_of": 3})
    # ONNX's checker (run first) or the importer's own check: either names all three.
    message = refused(runtime, path)
    assert "unheard_of" in message and "Softmax" in message and "the_node" in message


def test_unequal_pads_of_an_average_counting_the_padding_are_a_pad_in_front(runtime, tmp_path):
    """AveragePool with count_include_pad 1 and unequal pads: zeros padded in front, every
    window divided by the kernel's 9 cells (a naive reference: F.pad, then an unpadded
    average)."""
    x = np.random.RandomState(2).standard_normal((2, 2, 5, 6)).astype(np.float32)
    path = one_node_model(tmp_path / "m.onnx", "AveragePool", {"x": x}, 4,
                          {"kernel_shape": [3, 3], "pads": [0, 1, 1, 2], "strides": [2, 1],
                           "count_include_pad": 1})
    got = run(load(runtime, path, 2), {"x": x})["y"]
    # ONNX's pads [h_begin, w_begin, h_end, w_end]; F.pad's (left, right, top, bottom).
    want = F.avg_pool2d(F.pad(t(x), (1, 2, 0, 1)), 3, stride=(2, 1))
    assert got.shape == tuple(want.shape)
    assert relative_error(got, want.numpy()) <= TOLERANCE


def test_unequal_pads_of_an_average_are_refused_not_approximated(runtime, tmp_path):
    # A Conv's or a MaxPool's unequal pads become a Pad layer in front; an average that
    # leaves the padding out of its count (count_include_pad 0, the default) would count it.
    x = np.zeros((1, 2, 5, 5), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "AveragePool", {"x": x}, 4,
                          {"kernel_shape": [3, 3], "pads": [0, 1, 1, 1]})
    message = refused(runtime, path)
    assert "the_node" in message and "AveragePool" in message and "'pads' [0, 1, 1, 1]" in message


def test_pad_wrap_and_reflect_wider_than_the_input_are_refused(runtime, tmp_path):
    x = np.zeros((1, 2, 5, 5), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "Pad", {"x": x}, 4, {"mode": "wrap"},
                          {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})
    message = refused(runtime, path)
    assert "the_node" in message and "Pad" in message and "'wrap'" in message
    # A mirror of 5 rows has at most 4 to give on each side.
    path = one_node_model(tmp_path / "wide.onnx", "Pad", {"x": x}, 4, {"mode": "reflect"},
                          {"pads": np.array([0, 0, 5, 0, 0, 0, 0, 0], np.int64)})
    message = refused(runtime, path)
    assert "reflect pads axis 2" in message and "1x2x5x5" in message


def test_an_opset_outside_the_supported_range_is_refused(runtime, tmp_path):
    x = np.zeros((1, 3), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "Relu", {"x": x}, 2, opset=6)
    message = refused(runtime, path)
    assert "opset 6" in message and "7 to 17" in message


def test_weights_computed_by_the_graph_are_refused(runtime, tmp_path):
    x = np.zeros((1, 2, 5, 5), np.float32)
    path = one_node_model(tmp_path / "m.onnx", "Conv", {"x": x, "w": np.zeros((2, 2, 3, 3),
                                                                              np.float32)}, 4)
    message = refused(runtime, path)
    assert "the_node" in message and "must be a constant" in message


def test_external_data_outside_the_models_folder_is_refused(runtime, tmp_path):
    x = np.zeros((1, 4), np.float32)
    b = numpy_helper.from_array(np.ones((4, 3), np.float32), "b")
    b.data_location = TensorProto.EXTERNAL
    b.ClearField("raw_data")
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "48")):
        entry = b.external_data.add()
        entry.key, entry.value = key, value
    node = helper.make_node("MatMul", ["x", "b"], ["y"], name="the_node")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              [b])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    message = refused(runtime, path)
    assert "'../secret.bin'" in message or "not a valid ONNX model" in message


def test_external_data_beside_the_model_is_read(runtime, tmp_path):
    rng = np.random.RandomState(5)
    x, w = rng_array(rng, 2, 4), rng_array(rng, 4, 3)
    model = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="the_node")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.weights", size_threshold=0)
    assert (tmp_path / "m.weights").exists()
    got = run(load(runtime, path, 2), {"x": x})["y"]
    assert relative_error(got, x.astype(np.float64) @ w) <= TOLERANCE


def test_a_solver_naming_an_onnx_model_says_it_cannot_train_it_yet(runtime, tmp_path):
    x = np.zeros((1, 3), np.float32)
    one_node_model(tmp_path / "m.onnx", "Relu", {"x": x}, 2)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "m.onnx"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n')
    rt, drivers = runtime
    with pytest.raises(hn.Error) as failure:
        hn.Solver(rt, drivers["cpu"], str(solver))
    assert "is an ONNX model" in str(failure.value) and "m.onnx" in str(failure.value)


# ---- training an imported model: the ONNX layer ---------------------------------------------

FINETUNE_NET = """
name: "finetune"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 dim: 32 dim: 32 } shape { dim: 4 } } }
layer { name: "body" type: "ONNX" bottom: "data" top: "logits"
        onnx_param { source: "model.onnx" } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
"""

FINETUNE_SOLVER = """
net: "train.prototxt"
base_lr: 0.1
lr_policy: "fixed"
momentum: 0
weight_decay: 0
max_iter: 1
snapshot_after_train: false
"""


class ShuffleBlock(torch.nn.Module):
    """ShuffleNet v2's unit in small: chunk(2) (two Slices, each with a piece no node reads),
    a convolution on one half, a concat and the channel shuffle (view, transpose, view: shape
    arithmetic folded at import and a Permute)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.branch = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.head = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem(x)), 8)
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, F.relu(self.branch(b))), dim=1)
        n, c, h, w = x.size()
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        return self.head(x.flatten(1))


def small_model(name):
    torch.manual_seed(3)
    if name == "shuffle":
        return ShuffleBlock().eval()
    if name == "tiny":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10)).eval()
    # SqueezeNet has no BatchNorm (an export for inference folds BatchNorm into the
    # convolutions, whose gradients are then another net's) and its Dropout is the
    # identity in eval mode on both sides.
    return torchvision.models.squeezenet1_1(weights=None, num_classes=10).eval()


@pytest.mark.parametrize("name", ["tiny", "squeezenet1_1", "shuffle"])
@pytest.mark.parametrize("split", [None, "cpu:0.5,reference:0.5"])
def test_an_onnx_layer_trains_one_sgd_step_as_pytorch_does(runtime, tmp_path, name, split):
    model = small_model(name)
    rng = np.random.RandomState(7)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    label = np.array([1, 0, 7, 3], np.float32)
    torch.onnx.export(model, torch.from_numpy(x), str(tmp_path / "model.onnx"), opset_version=13,
                      input_names=["data"], output_names=["logits"])
    (tmp_path / "train.prototxt").write_text(FINETUNE_NET)
    (tmp_path / "solver.prototxt").write_text(FINETUNE_SOLVER)
    rt, drivers = runtime
    options = {"split": split} if split else {}
    try:
        solver = hn.Solver(rt, drivers["cpu"], str(tmp_path / "solver.prototxt"), **options)
    except hn.Error as failure:
        if "reads no ONNX files" in str(failure):
            pytest.skip("hybridnn was built without libonnx-dev")
        raise
    net = solver.net
    assert any(n.startswith("body/") for n in net.layer_names)
    net.blob("data").data[...] = x
    net.blob("label").data[...] = label
    solver.step(1)
    # A layer cut by outputs (the fully connected layer under a split) lists one shard per
    # device, under the same name, in order: joined, they are the parameter.
    got, names = [], net.param_names
    for i, param_name in enumerate(names):
        value = np.array(net.param(i).data)
        if i > 0 and names[i - 1] == param_name:
            got[-1] = np.concatenate([got[-1], value])
        else:
            got.append(value)
    # PyTorch's same step: SGD at 0.1 on the mean cross-entropy.
    before = [p.detach().numpy().copy() for p in model.parameters()]
    loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(label).long())
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    want = [p.detach().numpy() for p in model.parameters()]
    assert [g.shape for g in got] == [w.shape for w in want]
    assert abs(solver.loss - loss.item()) <= 1e-4 * abs(loss.item())
    for g, w, b in zip(got, want, before):
        assert relative_error(g, w) <= TOLERANCE
        step_want, step_got = w - b, g - b
        assert np.linalg.norm(step_got - step_want) <= 1e-3 * np.linalg.norm(step_want) + 1e-12
