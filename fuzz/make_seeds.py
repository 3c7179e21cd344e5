#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into fuzz/corpus/<target>/ (committed; rerun when a
format changes): Caffe's small nets and solvers from ../shared/models and examples/, a
caffemodel and solverstate trained by the hybridnn tool on fuzz.h's kTrainNet, the first
Fashion-MNIST images as raw and gzip IDX, CIFAR-10 records, Datum records and split texts.

    fuzz/make_seeds.py [--tool build/bin/hybridnn]
"""
import argparse
import ast
import gzip
import os
import re
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(os.path.dirname(ROOT), "shared", "models")
FASHION = "/usr/share/datasets/fashion-mnist"
SMALL = 4096  # seeds stay small: only nets and solvers up to this size


def put(target, name, data):
    directory = os.path.join(ROOT, "fuzz", "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def train_net_text():
    """kTrainNet from fuzz.h: the concatenated C string literals."""
    with open(os.path.join(ROOT, "fuzz", "fuzz.h")) as f:
        source = f.read()
    body = re.search(r"kTrainNet =\s*(.*?);", source, re.S).group(1)
    return "".join(ast.literal_eval(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', body))


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def datum(channels, height, width, label, data=None, floats=None, encoded=False):
    """A Caffe Datum: channels 1, height 2, width 3, data 4, label 5, float_data 6, encoded 7."""
    out = field(1, 0, channels) + field(2, 0, height) + field(3, 0, width)
    if data is not None:
        out += field(4, 2, data)
    out += field(5, 0, label)
    if floats is not None:
        out += field(6, 2, b"".join(struct.pack("<f", v) for v in floats))
    if encoded:
        out += field(7, 0, 1)
    return out


def onnx_seeds():
    """Small ONNX models (python3-onnx) exercising every converter: a conv net with pooling,
    BatchNormalization, Clip, Mul by per-channel factors, HardSigmoid, Concat, Flatten, Gemm
    and Reshape; ShuffleNet's shape arithmetic, Transpose, Slice, Split and ReduceMean; each
    under 4 KB."""
    try:
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        print("make_seeds: python3-onnx is missing: no onnx_model seeds")
        return
    rng = np.random.RandomState(0)

    def weights(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def model(name, nodes, inits, out_shape, opset=13):
        graph = helper.make_graph(
            nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        put("onnx_model", name + ".onnx", m.SerializeToString())

    node = helper.make_node
    model("conv_pool_gemm", [
        node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=2),
        node("Relu", ["c"], ["r"]),
        node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        node("Flatten", ["p"], ["f"]),
        node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, alpha=0.5),
    ], [weights("w", 4, 1, 3, 3), weights("b", 4), weights("fw", 3, 36), weights("fb", 3)],
        ["N", 3])
    model("bn_clip_se", [
        node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
        node("Clip", ["n", "lo", "hi"], ["c"]),
        node("GlobalAveragePool", ["c"], ["g"]),
        node("HardSigmoid", ["g"], ["h"], alpha=0.2, beta=0.5),
        node("Mul", ["c", "h"], ["y"]),
    ], [weights("s", 2), weights("bb", 2), weights("m", 2),
        numpy_helper.from_array(np.ones(2, np.float32), "v"),
        numpy_helper.from_array(np.array(0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6, np.float32), "hi")], ["N", 2, 6, 6])
    model("concat_reshape_softmax", [
        node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             count_include_pad=1),
        node("Concat", ["x", "a"], ["k"], axis=1),
        node("LRN", ["k"], ["l"], size=3),
        node("Reshape", ["l", "shape"], ["q"]),
        node("Softmax", ["q"], ["y"], axis=1),
    ], [numpy_helper.from_array(np.array([0, -1], np.int64), "shape")], ["N", 144])

    def ints(name, *values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    def scalar(name, value):
        return numpy_helper.from_array(np.array(value, np.int64), name)

    # ShuffleNet's operators: shape arithmetic folded at import (Shape, Gather, Div,
    # Unsqueeze, Concat), Transpose, Slice and Split with unused pieces, ReduceMean, and
    # arithmetic by constants.
    model("shuffle_slice_reduce", [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Gather", ["s", "one"], ["c"], axis=0),
        node("Div", ["c", "two"], ["half"]),
        node("Unsqueeze", ["n", "axes0"], ["n1"]),
        node("Unsqueeze", ["half", "axes0"], ["h1"]),
        node("Concat", ["n1", "two1", "h1", "rest"], ["shape"], axis=0),
        node("Reshape", ["x", "shape"], ["v"]),
        node("Transpose", ["v"], ["t"], perm=[0, 2, 1, 3, 4]),
        node("Reshape", ["t", "back"], ["u"]),
        node("Slice", ["u", "st", "en", "ax"], ["piece"]),
        node("Split", ["u", "sizes"], ["a", "b"], axis=1),
        node("Sub", ["a", "b"], ["d"]),
        node("Mul", ["d", "k"], ["m"]),
        node("Max", ["m", "piece"], ["mx"]),
        node("ReduceMean", ["mx"], ["y"], axes=[2, 3], keepdims=0),
    ], [scalar("zero", 0), scalar("one", 1), scalar("two", 2), ints("axes0", 0), ints("two1", 2),
        ints("rest", 6, 6), ints("back", 0, 2, 6, 6), ints("st", 1), ints("en", 2),
        ints("ax", 1), ints("sizes", 1, 1),
        numpy_helper.from_array(np.array([[[1.5]]], np.float32), "k")],
        ["N", 1], opset=13)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "hybridnn"))
    args = parser.parse_args()
    corpus = os.path.join(ROOT, "fuzz", "corpus")
    shutil.rmtree(corpus, ignore_errors=True)

    # Nets (parser and builder) and solvers.
    sources = [os.path.join(MODELS, n) for n in sorted(os.listdir(MODELS))]
    sources += [os.path.join(ROOT, "examples", "fashion_mnist", n)
                for n in ("lenet_train_test.prototxt", "lenet_solver.prototxt")]
    for path in sources:
        if not path.endswith(".prototxt") or os.path.getsize(path) > SMALL:
            continue
        with open(path, "rb") as f:
            text = f.read()
        name = os.path.basename(path)
        if "solver" in name:
            put("solver_prototxt", name, text)
        else:
            put("net_prototxt", name, text)
            put("net_builder", name, text)
    put("net_prototxt", "fuzz_net.prototxt", train_net_text())
    put("net_builder", "fuzz_net.prototxt", train_net_text())

    # A caffemodel and a solverstate of kTrainNet, one iteration of SGD with momentum, the
    # snapshot prefix relative so that the state's learned_net is found beside it.
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "net.prototxt"), "w") as f:
            f.write(train_net_text())
        with open(os.path.join(work, "solver.prototxt"), "w") as f:
            f.write("net: 'net.prototxt'\nbase_lr: 0.1\nmomentum: 0.9\nlr_policy: 'multistep'\n"
                    "stepvalue: 2\nstepvalue: 4\ngamma: 0.5\nmax_iter: 1\ndisplay: 0\n"
                    "snapshot_prefix: 'fuzz'\n")
        subprocess.run([args.tool, "train", "--solver", "solver.prototxt", "--device",
                        "reference"], cwd=work, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(work, "fuzz_iter_1.caffemodel"), "rb") as f:
            put("caffemodel", "fuzz_iter_1.caffemodel", f.read())
        with open(os.path.join(work, "fuzz_iter_1.solverstate"), "rb") as f:
            put("solverstate", "fuzz_iter_1.solverstate", f.read())

    # IDX: the first three Fashion-MNIST images and labels; the input's first two bytes are
    # the images file's length (see idx.cpp).
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        images = f.read(16 + 3 * 784)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = f.read(8 + 3)
    images = images[:4] + struct.pack(">I", 3) + images[8:]
    labels = labels[:4] + struct.pack(">I", 3) + labels[8:]
    for name, im, lb in (("raw", images, labels),
                         ("gzip", gzip.compress(images, mtime=0), gzip.compress(labels, mtime=0)),
                         ("gzip_images", gzip.compress(images, mtime=0), labels)):
        put("idx", name, struct.pack(">H", len(im)) + im + lb)

    # CIFAR-10: two records (label byte, 3x32x32 pixels).
    record = lambda label: bytes([label]) + bytes((i * 7 + label) % 256 for i in range(3072))
    put("cifar", "two_records.bin", record(3) + record(9))

    # Datum records: raw bytes, floats, an encoded one (refused), a shape that mismatches.
    put("datum", "bytes_3x32x32", datum(3, 32, 32, 7, data=bytes(range(256)) * 12))
    put("datum", "floats_1x2x2", datum(1, 2, 2, 1, floats=[0.5, -1.0, 2.0, 3.5]))
    put("datum", "encoded", datum(3, 2, 2, 0, data=b"\xff\xd8\xff\xe0", encoded=True))
    put("datum", "bytes_1x28x28", datum(1, 28, 28, 9, data=bytes(784)))

    # LMDB files written by `hybridnn convert`: twelve Fashion-MNIST images (values within
    # the leaf pages, a two-level tree) and the two CIFAR-10 records (values on overflow
    # pages).
    with tempfile.TemporaryDirectory() as work:
        with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
            images = f.read(16 + 12 * 784)
        images = images[:4] + struct.pack(">I", 12) + images[8:]
        with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
            labels = f.read(8 + 12)
        labels = labels[:4] + struct.pack(">I", 12) + labels[8:]
        with open(os.path.join(work, "t10k-images-idx3-ubyte"), "wb") as f:
            f.write(images)
        with open(os.path.join(work, "t10k-labels-idx1-ubyte"), "wb") as f:
            f.write(labels)
        with open(os.path.join(work, "data_batch_1.bin"), "wb") as f:
            f.write(record(3) + record(9))
        for name, source in (("fashion_12", "t10k-images-idx3-ubyte"),
                             ("cifar_2", "data_batch_1.bin")):
            subprocess.run([args.tool, "convert", "--source", os.path.join(work, source),
                            "--output", os.path.join(work, name)], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(work, name, "data.mdb"), "rb") as f:
                put("lmdb", name, f.read())

    # Splits: a split's text and a --split-save file.
    onnx_seeds()
    put("split_file", "split", "cpu:0.6,reference:0.4")
    put("split_file", "split_devices", "cuda:0:0.25,cuda:1:0.25,cpu:0.5")
    put("split_file", "saved",
        "# hybridnn layer splits\nconv1 cpu:0.75,reference:0.25\nip1 reference:1\n")

    # The C ABI's text entry points: a first line of input shapes [|split] (capi_layer) or
    # net options (capi_net), then a layer snippet or a net.
    put('capi_layer', 'batch_norm', '4x3x2x2|reference:0.25,reference:1\nname: "b" type: "BatchNorm" batch_norm_param { eps: 0.001 moving_average_fraction: 0.9 }\n')
    put('capi_layer', 'convolution', '2x3x8x8|reference:0.5,reference:1:0.5\nname: "c" type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 pad: 1 group: 1 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.2 } }\n')
    put('capi_layer', 'eltwise', '2x3x2x2;2x3x2x2;2x3x2x2\nname: "e" type: "Eltwise" eltwise_param { operation: MAX }\n')
    put('capi_layer', 'lrn', '2x5x3x3\nname: "n" type: "LRN" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 k: 2 }\n')
    put('capi_layer', 'pooling', '2x3x6x14\nname: "p" type: "Pooling" pooling_param { pool: AVE kernel_h: 4 kernel_w: 1 stride: 2 pad_h: 2 pad_w: 0 }\n')
    put('capi_layer', 'reshape', '6\nname: "r" type: "Reshape" reshape_param { shape { dim: 0 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 dim: 1 } }\n')
    put('capi_layer', 'softmax_loss', '4x5;4\nname: "l" type: "SoftmaxWithLoss" loss_param { ignore_label: 2 normalization: VALID }\n')
    put('capi_layer', 'permute', '2x3x4x2|reference:0.5,reference:1:0.5\nname: "t" type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }\n')
    put('capi_layer', 'permute_scalar', '\nname: "t" type: "Permute"\n')  # no axes: crashed once
    put('capi_layer', 'pad_reflect', '2x3x4x5\nname: "p" type: "Pad" pad_param { pad_before: 2 pad_before: 1 pad_after: 3 pad_after: 0 mode: "reflect" }\n')
    put('capi_net', 'chain', 'phase=test;reuse_memory=1\nname: "chain"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }\nlayer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 1 } } }\nlayer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\nlayer { name: "ip1" type: "InnerProduct" bottom: "conv" top: "ip1" inner_product_param { num_output: 32 weight_filler { type: "gaussian" std: 1 } } }\nlayer { name: "sig" type: "Sigmoid" bottom: "ip1" top: "sig" }\nlayer { name: "ip2" type: "InnerProduct" bottom: "sig" top: "ip2" inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }\n')
    put('capi_net', 'residual', 'force_backward=1;keep_blobs=s;phase=train\nname: "res"\nlayer { name: "in" type: "DummyData" top: "x" top: "label" dummy_data_param { shape { dim: 2 dim: 4 dim: 5 dim: 5 } shape { dim: 2 } data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }\nlayer { name: "c1" type: "Convolution" bottom: "x" top: "c1" convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }\nlayer { name: "bn" type: "BatchNorm" bottom: "c1" top: "c1" batch_norm_param { use_global_stats: true } }\nlayer { name: "sc" type: "Scale" bottom: "c1" top: "c1" scale_param { bias_term: true } }\nlayer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }\nlayer { name: "sum" type: "Eltwise" bottom: "x" bottom: "c1" top: "s" }\nlayer { name: "r2" type: "ReLU" bottom: "s" top: "s" }\nlayer { name: "pool" type: "Pooling" bottom: "s" top: "p" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }\nlayer { name: "ip" type: "InnerProduct" bottom: "p" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }\nlayer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n')
    put("capi_net", "fuzz_net.prototxt", "batch=2;force_backward=1\n" + train_net_text())


if __name__ == "__main__":
    main()
