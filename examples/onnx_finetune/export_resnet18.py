"""Exports torchvision's ResNet-18 (10 classes, random weights) for 32x32 images to ONNX, as a
user would export a model of theirs: `torch.onnx.export` in eval mode (BatchNorm folded into
the convolutions), opset 13, a symbolic batch. Run with Debian's python3 (python3-torch,
python3-torchvision): /usr/bin/python3 export_resnet18.py OUT.onnx
"""
import sys

import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None, num_classes=10).eval()
torch.onnx.export(model, torch.randn(1, 3, 32, 32), sys.argv[1], opset_version=13,
                  input_names=["data"], output_names=["logits"],
                  dynamic_axes={"data": {0: "batch"}, "logits": {0: "batch"}})
print(f"wrote {sys.argv[1]}")
