"""PyTorch reference for tests/runtime/resnet_torch_parity_test.cpp: meshtrain's ResNet weights
loaded into the torch.nn ResNet (resnet_torch.py) with load_state_dict(strict=True), then run.

    resnet_reference.py --config tiny|small|resnet18|resnet50|'{"block": ...}'
        --weights model.safetensors --inputs in.safetensors --output out.safetensors
    resnet_reference.py --describe NAME [--in-channels C] [--num-classes K]

With --weights: every tensor of the file must be one of the model's, with its shape and dtype
(num_batches_tracked an int64 scalar), and every tensor of the model must be in the file. Then,
on the inputs x_eval, x_train (f32 images) and y_train (i32 labels): logits of x_eval in eval
mode ("logits_eval"); one train-mode forward of x_train ("logits_train", batch statistics), its
mean cross-entropy ("loss") and backward (a gradient per parameter, "<name>.grad"), and the
buffers that forward updated ("<name>" of every running_mean, running_var and
num_batches_tracked). With --describe: one JSON object {name: [dtype, shape]} of the state dict.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_torch  # noqa: E402
import st  # noqa: E402


def build(spec, in_channels=None, num_classes=None):
    if spec.startswith("{"):
        return resnet_torch.ResNet(**json.loads(spec))
    return resnet_torch.resnet(spec, in_channels, num_classes)


def load_strict(model, weights):
    want = model.state_dict()
    for name, t in weights.items():
        if name not in want:
            sys.exit(f"resnet_reference: the weights hold {name!r}, which the model has not")
        if t.dtype != want[name].dtype or t.shape != want[name].shape:
            sys.exit(f"resnet_reference: {name!r} is {t.dtype} {list(t.shape)}, the model's "
                     f"{want[name].dtype} {list(want[name].shape)}")
    # Raises for a missing or unexpected name and for a shape that differs.
    model.load_state_dict(weights, strict=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--weights")
    ap.add_argument("--inputs")
    ap.add_argument("--output")
    ap.add_argument("--describe")
    ap.add_argument("--in-channels", type=int)
    ap.add_argument("--num-classes", type=int)
    args = ap.parse_args()
    torch.set_num_threads(1)

    if args.describe:
        model = build(args.describe, args.in_channels, args.num_classes)
        print(json.dumps({k: [str(v.dtype).replace("torch.", ""), list(v.shape)]
                          for k, v in model.state_dict().items()}))
        return

    weights, _ = st.load(args.weights)
    inputs, _ = st.load(args.inputs)
    in_channels = inputs["x_eval"].shape[1]
    model = build(args.config, in_channels, args.num_classes)
    load_strict(model, weights)

    out = {}
    model.eval()
    with torch.no_grad():
        out["logits_eval"] = model(inputs["x_eval"])
    model.train()
    logits = model(inputs["x_train"])
    loss = F.cross_entropy(logits, inputs["y_train"].long())
    loss.backward()
    out["logits_train"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for name, p in model.named_parameters():
        out[name + ".grad"] = p.grad
    for name, b in model.named_buffers():
        out[name] = b
    st.save(args.output, out)


if __name__ == "__main__":
    main()
