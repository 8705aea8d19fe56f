"""PyTorch's scaled_dot_product_attention on its flash backend, causal and bf16, at the shapes
bench/attention_bench.cpp gives: the peer of meshtrain's flash attention kernels.

Command line:
  python3 bench/python/attention_bench_torch.py --shapes '[{"name": "gpt2", "B": 8, "NH": 12,
      "T": 1024, "D": 64}, ...]' [--iters 20] [--warmup 5]
q, k and v are views of one [B, T, 3C] bf16 tensor (nanoGPT's split of the qkv product, as users
run it), dout is bf16. Each call is timed alone between two CUDA events; the forward runs under
no_grad, the backward is (forward + backward) less the forward, medians of --iters calls. One
JSON line per shape:
  {"name", "B", "NH", "T", "D", "forward_ms", "backward_ms", "torch_version", "device", "backend"}
or, when PyTorch, its CUDA support or the flash backend is missing, {"skipped": "<why>"}.
"""
import argparse
import json
import statistics
import sys


def skip(why):
    print(json.dumps({"skipped": why}))
    sys.exit(0)


def flash_only(torch):
    """A context that allows only the flash backend (whose absence then raises)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.FLASH_ATTENTION), "flash (torch.nn.attention.sdpa_kernel)"
    except ImportError:
        return (
            torch.backends.cuda.sdp_kernel(
                enable_flash=True, enable_math=False, enable_mem_efficient=False
            ),
            "flash (torch.backends.cuda.sdp_kernel)",
        )


def median_ms(torch, fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", required=True, help="JSON list of {name, B, NH, T, D}")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    shapes = json.loads(args.shapes)
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no peer
        skip(f"PyTorch is not importable: {e}")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} has no usable CUDA device (built with CUDA {torch.version.cuda})")
    if not hasattr(F, "scaled_dot_product_attention"):
        skip(f"PyTorch {torch.__version__} has no scaled_dot_product_attention")
    device = torch.cuda.get_device_name(0)
    for s in shapes:
        B, NH, T, D = s["B"], s["NH"], s["T"], s["D"]
        C = NH * D
        gen = torch.Generator(device="cuda").manual_seed(1)
        qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, generator=gen)
        qkv.requires_grad_(True)
        dout = torch.randn(B, NH, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)

        def heads(x):
            return x.view(B, T, NH, D).transpose(1, 2)

        ctx, backend = flash_only(torch)
        with ctx:

            def forward():
                with torch.no_grad():
                    q, k, v = qkv.split(C, dim=2)
                    F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)

            def forward_backward():
                q, k, v = qkv.split(C, dim=2)
                out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
                out.backward(dout)
                qkv.grad = None

            try:
                fwd = median_ms(torch, forward, args.iters, args.warmup)
                both = median_ms(torch, forward_backward, args.iters, args.warmup)
            except RuntimeError as e:
                skip(f"PyTorch {torch.__version__}: flash attention did not run: {e}")
        print(
            json.dumps(
                {
                    "name": s["name"],
                    "B": B,
                    "NH": NH,
                    "T": T,
                    "D": D,
                    "forward_ms": fwd,
                    "backward_ms": both - fwd,
                    "torch_version": torch.__version__,
                    "device": device,
                    "backend": backend,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
