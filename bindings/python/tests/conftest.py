"""Shared fixtures: a runtime with the cpu driver, and the small nets the tests use."""
import pytest

import hybridnn as hn

# y = relu(W1 x + b1), z = W2 y + b2: a two-layer perceptron on 3 rows of 4 features.
MLP = """
name: "mlp"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""

# A classifier on generated data whose labels are all 1: the loss falls from ln 3.
TINY_NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 6 } shape { dim: 8 }
                     data_filler { type: "gaussian" std: 1 }
                     data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def cpu():
    runtime = hn.Runtime()
    return runtime, runtime.add("cpu")


@pytest.fixture
def tiny_solver(tmp_path):
    """A solver file (and its net) in tmp_path: SGD, 40 iterations, display every 5."""
    (tmp_path / "net.prototxt").write_text(TINY_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.1\nmomentum: 0.9\n'
                      f'lr_policy: "fixed"\ndisplay: 5\nmax_iter: 40\n'
                      f'snapshot_prefix: "{tmp_path / "tiny"}"\n')
    return solver
