"""PyTorch reference for tests/nn/vision_torch_parity_test.cpp: a small convolutional network
(conv, batch norm, ReLU, max pool, batch norm, grouped dilated conv with bias, ReLU, average pool,
global average pool) run with torch.nn and F on the weights and input meshtrain saved. One
training-mode forward and backward (batch statistics, running statistics updated), then an
evaluation-mode forward; writes the outputs, the gradients and the buffers.

    vision_reference.py --inputs in.safetensors --output out.safetensors
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t, _ = st.load(args.inputs)

    layers = {
        "c1": torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
        "bn1": torch.nn.BatchNorm2d(8),
        "c2": torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2, bias=True),
        "bn2": torch.nn.BatchNorm2d(8, momentum=0.2),
    }
    for name, layer in layers.items():
        prefix = name + "."
        layer.load_state_dict({k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)})

    def forward(x):
        h = F.relu(layers["bn1"](layers["c1"](x)))
        h = F.max_pool2d(h, 3, 2, 1)
        h = F.relu(layers["c2"](layers["bn2"](h)))
        h = F.avg_pool2d(h, 3, 2, 1, count_include_pad=False)
        return F.adaptive_avg_pool2d(h, 1).flatten(1)

    x = t["x"].clone().requires_grad_(True)
    y = forward(x)
    (y * t["r"]).sum().backward()
    out = {"y": y, "x.grad": x.grad}
    for name, layer in layers.items():
        for pname, p in layer.named_parameters():
            out[f"{name}.{pname}.grad"] = p.grad
        for bname, b in layer.named_buffers():
            out[f"{name}.{bname}"] = b
    for layer in layers.values():
        layer.eval()
    with torch.no_grad():
        out["y_eval"] = forward(t["x"])
    st.save(args.output, out)


if __name__ == "__main__":
    main()
