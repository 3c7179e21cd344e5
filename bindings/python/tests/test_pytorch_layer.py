"""examples/pytorch_layer.py: hybridnn layers as torch.autograd.Functions (skipped visibly
without python3-torch)."""
import importlib.util
import pathlib
import warnings

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "pytorch_layer.py"


def load_example():
    spec = importlib.util.spec_from_file_location("pytorch_layer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_layers_match_pytorch_and_pass_gradcheck():
    example = load_example()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*double precision.*")
        assert example.check() == 0


def test_no_copies_between_torch_and_hybridnn():
    example = load_example()
    x = torch.randn(2, 3)
    wrapped = example._wrap(x)
    wrapped.data[0, 0] = 42.0
    assert x[0, 0].item() == 42.0
