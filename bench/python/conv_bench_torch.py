"""PyTorch side of bench/conv_bench.cpp: times F.conv2d forward and its backward (input and
weight gradients together, as autograd computes them) for each layer given as JSON, and prints
one JSON line per layer. Runs on the CPU with the given thread count."""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def fastest_us(fn, min_ms):
    fn()
    runs = []
    start = time.perf_counter()
    while len(runs) < 3 or (time.perf_counter() - start) * 1e3 < min_ms:
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e6)
        if len(runs) >= 1000:
            break
    return min(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-ms", type=float, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = "torch %s mkldnn=%s" % (torch.__version__, torch.backends.mkldnn.is_available())
    for l in json.loads(args.layers):
        g = torch.Generator().manual_seed(1)
        x = torch.rand(l["N"], l["C_in"], l["H"], l["W"], generator=g).mul_(2).sub_(1)
        w = torch.rand(l["C_out"], l["C_in"] // l["groups"], l["K"], l["K"], generator=g)
        w = w.mul_(2).sub_(1)
        x.requires_grad_(True)
        w.requires_grad_(True)

        def forward():
            return F.conv2d(x, w, None, l["stride"], l["pad"], l["dil"], l["groups"])

        with torch.no_grad():
            dy = torch.rand_like(forward())

        fwd = fastest_us(forward, args.min_ms)
        # Each backward needs its own graph: time only the backward of a fresh forward.
        def backward_only():
            y = forward()
            t0 = time.perf_counter()
            torch.autograd.grad(y, (x, w), dy)
            return (time.perf_counter() - t0) * 1e6

        backward_only()
        runs = []
        start = time.perf_counter()
        while len(runs) < 3 or (time.perf_counter() - start) * 1e3 < args.min_ms:
            runs.append(backward_only())
        print(json.dumps({"name": l["name"], "fwd_us": fwd, "bwd_us": min(runs), "torch": info}),
              flush=True)


if __name__ == "__main__":
    main()
