"""Reference optimizer trajectories from torch.optim, for the optimizer tests in tests/optim.

Usage: python3 optim_reference.py SPEC.json
  SPEC.json:
    {"optimizer": "sgd" | "adamw",
     "options": {"lr", "momentum", "dampening", "nesterov"}              (sgd)
                {"lr", "beta1", "beta2", "eps"}                          (adamw),
     "groups": [{"weight_decay": float,
                 "params": [{"name": str, "shape": [int...], "init": [float...]}]}],
     "steps": [{"lr": float, "grads": {name: [float...] | null}}]}
  A null (or missing) gradient leaves that parameter without .grad for the step.
Prints one JSON object: {"torch_version": str, "params": [{name: [float...]} after each step]}.
SPEC.json may instead be {"cases": [spec, ...]}; the answer is then
{"torch_version": str, "results": [answer, ...]} (one interpreter start for many cases).
All tensors are float32; the values printed are exact float32 values.
"""
import json
import sys

import torch


def run_case(spec):
    params = {}
    groups = []
    for g in spec["groups"]:
        plist = []
        for p in g["params"]:
            t = torch.tensor(p["init"], dtype=torch.float32).reshape(p["shape"])
            t.requires_grad_(True)
            params[p["name"]] = t
            plist.append(t)
        groups.append({"params": plist, "weight_decay": g["weight_decay"]})
    o = spec["options"]
    if spec["optimizer"] == "sgd":
        opt = torch.optim.SGD(groups, lr=o["lr"], momentum=o.get("momentum", 0.0),
                              dampening=o.get("dampening", 0.0),
                              nesterov=o.get("nesterov", False))
    elif spec["optimizer"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    else:
        raise ValueError("unknown optimizer " + spec["optimizer"])

    history = []
    for step in spec["steps"]:
        for g in opt.param_groups:
            g["lr"] = step["lr"]
        for name, t in params.items():
            grad = step["grads"].get(name)
            t.grad = None if grad is None else torch.tensor(
                grad, dtype=torch.float32).reshape(t.shape)
        opt.step()
        history.append({name: t.detach().reshape(-1).tolist() for name, t in params.items()})
    return {"params": history}


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    if "cases" in spec:
        answer = {"results": [run_case(c) for c in spec["cases"]]}
    else:
        answer = run_case(spec)
    answer["torch_version"] = torch.__version__
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
