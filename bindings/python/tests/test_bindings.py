"""The Python bindings against numpy loops, finite differences and hand values."""
import gc
import math

import numpy as np
import pytest

import hybridnn as hn
from conftest import MLP


def test_version_and_devices():
    assert hn.__version__ == hn.version()
    assert hn.version().count(".") == 2
    assert hn.abi_version() >= 1
    assert "cpu" in hn.available_devices()
    assert "reference" in hn.available_devices()


def test_memory_limit_refuses_a_net_too_large(cpu):
    runtime, driver = cpu
    default = hn.memory_limit()
    assert default > 1 << 26 and hn.peak_resident_memory() > 1 << 20
    big = ("name: 'big'\nlayer { name: 'in' type: 'Input' top: 'x' "
           "input_param { shape { dim: 1 dim: 1 dim: 1024 dim: 1024 } } }\n")
    hn.set_memory_limit(1 << 20)
    try:
        assert hn.memory_limit() == 1 << 20
        with pytest.raises(hn.Error, match="'x'.*host memory limit of 1.0 MiB"):
            hn.Net.from_text(runtime, driver, big)
    finally:
        hn.set_memory_limit(0)
    assert hn.memory_limit() == default
    hn.Net.from_text(runtime, driver, big)


def test_errors_are_hybridnn_errors_with_messages(cpu, tmp_path):
    runtime, driver = cpu
    with pytest.raises(hn.Error, match="cuda:9"):
        runtime.add("cuda:9")
    with pytest.raises(hn.Error, match="unknown option 'bach'"):
        hn.Net.from_text(runtime, driver, MLP, bach=3)
    with pytest.raises(hn.Error, match="no such file"):
        hn.Net(runtime, driver, str(tmp_path / "missing.prototxt"))
    with pytest.raises(RuntimeError, match="NoSuchLayer"):  # hn.Error is a RuntimeError
        hn.Layer('name: "x" type: "NoSuchLayer"')
    with pytest.raises(TypeError, match="float32"):
        hn.Tensor.wrap(np.zeros(3))  # float64
    with pytest.raises(ValueError, match="C-contiguous"):
        hn.Tensor.wrap(np.zeros((4, 4), np.float32)[:, ::2])


def test_wrap_and_views_share_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = np.zeros_like(a)
    t = hn.Tensor.wrap(a, g)
    assert t.shape == (3, 4)
    assert np.shares_memory(t.data, a)
    assert np.shares_memory(t.diff, g)
    t.data[1, 2] = -5.0
    assert a[1, 2] == -5.0
    own = hn.Tensor([2, 3])
    view = own.data
    assert view.dtype == np.float32 and view.shape == (2, 3)
    assert not view.any()
    view[:] = 7.0
    assert (own.data == 7.0).all()  # the same memory again
    own.data = np.ones((2, 3))  # assignment copies in (converted to float32)
    assert (view == 1.0).all()


def test_a_view_keeps_the_net_alive(cpu):
    runtime, driver = cpu
    net = hn.Net.from_text(runtime, driver, MLP)
    net.blob("data").data[:] = 1.0
    net.forward()
    out = net.blob("ip2").data
    expected = out.copy()
    del net, runtime, driver
    gc.collect()
    np.testing.assert_array_equal(out, expected)


def conv_reference(x, w, b, pad, groups):
    """Convolution by loops in float64: x N,C,H,W; w M,C/g,K,K; stride 1."""
    n, c, h, wd = x.shape
    m, cg, k, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - k + 1, wd + 2 * pad - k + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for o in range(m):
        g = o // mg
        for i in range(k):
            for j in range(k):
                patch = xp[:, g * cg:(g + 1) * cg, i:i + oh, j:j + ow]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
        y[:, o] += b[o]
    return y


def test_convolution_as_a_kernel_on_numpy_arrays(cpu):
    runtime, driver = cpu
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 6, 5), dtype=np.float32)
    w = rng.standard_normal((6, 2, 3, 3), dtype=np.float32) * 0.3
    b = rng.standard_normal(6, dtype=np.float32)
    dx, dw, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b)
    y = np.zeros((2, 6, 6, 5), np.float32)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    conv = hn.Layer('name: "conv" type: "Convolution" '
                    'convolution_param { num_output: 6 kernel_size: 3 pad: 1 group: 2 }')
    inputs, outputs = [hn.Tensor.wrap(x, dx)], [hn.Tensor.wrap(y, dy)]
    assert conv.setup(inputs) == [(2, 6, 6, 5)]
    conv.set_param(0, hn.Tensor.wrap(w, dw))
    conv.set_param(1, hn.Tensor.wrap(b, db))
    conv.forward(driver, inputs, outputs)
    np.testing.assert_allclose(y, conv_reference(x, w, b, 1, 2), rtol=1e-4, atol=1e-4)
    conv.backward(driver, inputs, outputs)
    # The gradients as the transposes of the forward: <dy, conv(x)> is linear in x and in w.
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4)
    def numeric(loss_of, values, index, eps=1e-2):
        """d loss / d values[index] by central differences, in float64."""
        plus, minus = values.astype(np.float64), values.astype(np.float64)
        plus[index] += eps
        minus[index] -= eps
        return (loss_of(plus) - loss_of(minus)) / (2 * eps)

    def loss_of_x(values):
        return (conv_reference(values, w, b, 1, 2) * dy).sum()

    def loss_of_w(values):
        return (conv_reference(x, values, b, 1, 2) * dy).sum()

    for index in [(0, 1, 2, 3), (1, 3, 0, 4)]:
        assert dx[index] == pytest.approx(numeric(loss_of_x, x, index), rel=1e-3, abs=1e-3)
    for index in [(0, 0, 1, 1), (5, 1, 2, 0)]:
        assert dw[index] == pytest.approx(numeric(loss_of_w, w, index), rel=1e-3, abs=1e-3)
    # The caller's weights changed in place between calls: the next call computes with them
    # (the CPU driver keeps a convolution's weights in its own layout while they are the same).
    w *= -0.5
    conv.forward(driver, inputs, outputs)
    np.testing.assert_allclose(y, conv_reference(x, w, b, 1, 2), rtol=1e-4, atol=1e-4)
    # Split between the cpu and reference drivers: the same outputs.
    runtime.add("reference")
    conv.set_split(runtime, "cpu:0.5,reference:0.5")
    y[:] = 0
    conv.forward(driver, inputs, outputs)
    np.testing.assert_allclose(y, conv_reference(x, w, b, 1, 2), rtol=1e-4, atol=1e-4)


CONV_NET = """
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 16 dim: 7 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 32 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
"""


@pytest.mark.parametrize("layout", ["nchw", "blocked"])
def test_net_weights_changed_through_a_kept_view_are_used(cpu, layout):
    """A numpy view of a parameter, kept across forwards and written between them."""
    runtime, driver = cpu
    net = hn.Net.from_text(runtime, driver, CONV_NET, seed=5, phase="test", layout=layout)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 16, 7, 6), dtype=np.float32)
    net.blob("data").data[...] = x
    w, b = net.param(0).data, net.param(1).data
    for step in range(3):
        net.forward()
        want = np.maximum(conv_reference(x, w, b, 1, 1), 0)
        np.testing.assert_allclose(net.blob("conv").data, want, rtol=1e-4, atol=1e-4)
        w *= -0.75  # through the view taken before the forwards
        b += 0.25


def test_net_forward_and_backward_match_numpy(cpu, tmp_path):
    runtime, driver = cpu
    net = hn.Net.from_text(runtime, driver, MLP, seed=3)
    assert net.inputs == ["data"] and net.outputs == ["ip2"]
    assert net.layer_names == ["data", "ip1", "relu1", "ip2"]
    assert net.param_names == ["ip1.0", "ip1.1", "ip2.0", "ip2.1"]
    w1, b1, w2, b2 = (net.param(i).data.astype(np.float64) for i in range(4))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    net.blob("data").data[:] = x
    net.forward()
    hidden = np.maximum(x @ w1.T + b1, 0)
    np.testing.assert_allclose(net.blob("ip2").data, hidden @ w2.T + b2, rtol=1e-5, atol=1e-6)
    g = np.array([[1, -1], [0.5, 2], [-1, 0]], np.float32)
    net.clear_param_diffs()
    net.blob("ip2").diff[:] = g
    net.backward()
    np.testing.assert_allclose(net.param(2).diff, g.T @ hidden, rtol=1e-5, atol=1e-6)
    dhidden = (g @ w2) * (hidden > 0)
    np.testing.assert_allclose(net.blob("data").diff, dhidden @ w1, rtol=1e-5, atol=1e-6)
    model = str(tmp_path / "mlp.caffemodel")
    net.save(model)
    again = hn.Net.from_text(runtime, driver, MLP, seed=99, weights=model)
    np.testing.assert_array_equal(again.param(0).data, net.param(0).data)


# Input -> Convolution -> ReLU -> InnerProduct -> Sigmoid -> InnerProduct: the memory plan
# gives 'conv' to 'sig' in a test-phase net.
CHAIN = """
name: "chain"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip1" type: "InnerProduct" bottom: "conv" top: "ip1"
        inner_product_param { num_output: 32 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip1" top: "sig" }
layer { name: "ip2" type: "InnerProduct" bottom: "sig" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
"""


def test_a_reused_blob_is_an_error_naming_keep_blobs_not_another_blobs_values(cpu):
    runtime, driver = cpu
    x = np.linspace(-1, 1, 72, dtype=np.float32).reshape(2, 1, 6, 6)
    net = hn.Net.from_text(runtime, driver, CHAIN, phase="test")
    net.blob("data").data[:] = x
    net.forward()
    with pytest.raises(hn.Error, match="keep_blobs"):
        net.blob("conv").data
    kept = hn.Net.from_text(runtime, driver, CHAIN, phase="test", keep_blobs="conv")
    kept.blob("data").data[:] = x
    kept.forward()
    w = kept.param(0).data.astype(np.float64)
    b = kept.param(1).data.astype(np.float64)
    # The convolution at output (0, 0, 0, 0) by hand, after the ReLU.
    want = max(0.0, float((w[0, 0] * x[0, 0, :3, :3]).sum() + b[0]))
    assert kept.blob("conv").data[0, 0, 0, 0] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_solver_trains_reports_snapshots_and_restores(cpu, tiny_solver, tmp_path):
    runtime, driver = cpu
    solver = hn.Solver(runtime, driver, str(tiny_solver), max_iter=30)
    events = []
    solver.on_event(events.append)
    solver.step(1)
    first = solver.loss
    assert first == pytest.approx(math.log(3), abs=0.3)
    solver.step(19)
    assert solver.iter == 20
    assert solver.loss < 0.5 * first
    assert [e["iter"] for e in events] == [0, 5, 10, 15]
    assert events[0]["kind"] == "train" and "loss" in events[0]["outputs"]
    path = solver.snapshot()
    assert path == str(tmp_path / "tiny_iter_20.caffemodel")
    resumed = hn.Solver(runtime, driver, str(tiny_solver))
    resumed.restore(str(tmp_path / "tiny_iter_20.solverstate"))
    assert resumed.iter == 20
    np.testing.assert_array_equal(resumed.net.param(0).data, solver.net.param(0).data)

    def stop(event):
        raise KeyError("stop here")

    resumed.on_event(stop)
    with pytest.raises(KeyError, match="stop here"):
        resumed.step(10)
    assert resumed.iter <= 26


def test_local_communicator(cpu):
    _, driver = cpu
    comm = hn.Communicator("local")
    assert (comm.rank, comm.size, comm.backend) == (0, 1, "local")
    values = np.array([1.0, 2.0, 4.0], np.float32)
    comm.allreduce(driver, values, average=True)
    np.testing.assert_array_equal(values, [1.0, 2.0, 4.0])
    comm.barrier()
