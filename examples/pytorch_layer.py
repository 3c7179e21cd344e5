#!/usr/bin/env python3
"""hybridnn layers inside PyTorch: a Caffe Convolution and an InnerProduct run by hybridnn
as torch.autograd.Functions on PyTorch's own CPU tensors, without copies (both sides see
the same memory through numpy views), checked by torch.autograd.gradcheck and against
torch.nn.functional.

    python3 examples/pytorch_layer.py      # needs python3-torch and the bindings on the path
"""
import sys

import numpy as np
import torch

import hybridnn as hn

_runtime = hn.Runtime()
_cpu = _runtime.add("cpu")


def _wrap(values, gradient=None):
    """A hybridnn Tensor over a contiguous float32 CPU tensor's memory (and its gradient's)."""
    data = values.detach().numpy()
    diff = gradient.detach().numpy() if gradient is not None else None
    return hn.Tensor.wrap(data, diff)


class HybridnnFunction(torch.autograd.Function):
    """y = layer(x; params): forward and backward by a hybridnn Layer on the tensors' memory."""

    @staticmethod
    def forward(ctx, layer, x, *params):
        x = x.detach().contiguous()
        params = [p.detach().contiguous() for p in params]
        (out_shape,) = layer.setup([_wrap(x)])
        y = torch.empty(out_shape, dtype=torch.float32)
        for index, param in enumerate(params):
            layer.set_param(index, _wrap(param))
        layer.forward(_cpu, [_wrap(x)], [_wrap(y)])
        ctx.layer = layer
        ctx.save_for_backward(x, y, *params)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y, *params = ctx.saved_tensors
        layer = ctx.layer
        dx = torch.empty_like(x)
        dparams = [torch.zeros_like(p) for p in params]  # hybridnn adds into them
        for index, (param, dparam) in enumerate(zip(params, dparams)):
            layer.set_param(index, _wrap(param, dparam))
        layer.backward(_cpu, [_wrap(x, dx)], [_wrap(y, dy.contiguous())])
        return (None, dx, *dparams)


class Conv2d(torch.nn.Module):
    """A Caffe Convolution (square kernel, stride, padding, groups) as a torch module."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad=0, group=1):
        super().__init__()
        self.layer = hn.Layer(
            f'name: "conv" type: "Convolution" convolution_param {{ num_output: {out_channels} '
            f'kernel_size: {kernel_size} stride: {stride} pad: {pad} group: {group} }}')
        self.weight = torch.nn.Parameter(
            torch.randn(out_channels, in_channels // group, kernel_size, kernel_size) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(out_channels) * 0.1)
        self.stride, self.pad, self.group = stride, pad, group

    def forward(self, x):
        return HybridnnFunction.apply(self.layer, x, self.weight, self.bias)


class Linear(torch.nn.Module):
    """A Caffe InnerProduct as a torch module (y = x W^T + b over all but the first axis)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = hn.Layer(
            f'name: "ip" type: "InnerProduct" inner_product_param {{ num_output: {out_features} }}')
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x):
        return HybridnnFunction.apply(self.layer, x, self.weight, self.bias)


def check():
    """Forward against torch.nn.functional, gradients by gradcheck (float32 tolerances: the
    library computes in float32). Returns the number of failures."""
    torch.manual_seed(0)
    failures = 0
    conv = Conv2d(4, 6, 3, stride=1, pad=1, group=2)
    linear = Linear(6 * 5 * 4, 3)
    x = torch.randn(2, 4, 5, 4, requires_grad=True)

    y = conv(x)
    want = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1, groups=2)
    failures += not torch.allclose(y, want, atol=1e-5)
    z = linear(y)
    want_z = torch.nn.functional.linear(y.reshape(2, -1), linear.weight, linear.bias)
    failures += not torch.allclose(z, want_z, atol=1e-5)

    # Gradients through both layers against PyTorch's own.
    z.sum().backward()
    ours = [x.grad.clone(), conv.weight.grad.clone(), linear.weight.grad.clone()]
    for p in (x, conv.weight, linear.weight, conv.bias, linear.bias):
        p.grad = None
    reference = torch.nn.functional.linear(
        torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1, groups=2).reshape(2, -1),
        linear.weight, linear.bias)
    reference.sum().backward()
    for got, expected in zip(ours, [x.grad, conv.weight.grad, linear.weight.grad]):
        failures += not torch.allclose(got, expected, atol=1e-4, rtol=1e-4)

    # gradcheck on each function: float32, so a larger step and tolerances.
    small = torch.randn(1, 4, 4, 3, requires_grad=True)
    for module, inputs in ((conv, small), (Linear(12, 2), torch.randn(3, 12, requires_grad=True))):
        params = [p.detach().clone().requires_grad_() for p in (module.weight, module.bias)]
        ok = torch.autograd.gradcheck(
            lambda inp, *ps, layer=module.layer: HybridnnFunction.apply(layer, inp, *ps),
            (inputs, *params), eps=1e-2, atol=1e-2, rtol=1e-2, raise_exception=False)
        failures += not ok
    return failures


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore", message=".*double precision.*")
    failed = check()
    print(f"pytorch_layer: hybridnn {hn.version()} Convolution and InnerProduct in PyTorch "
          f"{torch.__version__}: forward, gradients and gradcheck "
          f"{'OK' if not failed else f'{failed} FAILED'}")
    sys.exit(1 if failed else 0)
