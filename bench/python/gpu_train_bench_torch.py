"""Training throughput of the PyTorch GPT (tests/python/gpt_torch.py) on one CUDA device: the
bar that meshtrain's cuda trainer is measured against (bench/gpu_train_bench.cpp runs this).

Command line:
  python3 bench/python/gpu_train_bench_torch.py
      [--n-layer 12] [--n-embd 768] [--n-head 12] [--block-size 1024] [--batch-size 8]
      [--vocab-size 50304] [--steps 20] [--warmup 5] [--mode eager|compile] [--tf32 1]
      [--precision f32|bf16] [--attention naive|sdpa] [--fused-adamw 0|1] [--profile 0|1]
Each step: forward, loss, backward, global gradient clipping, AdamW (torch.optim defaults,
weight decay on dim >= 2 parameters), zero_grad, on random tokens. By default all f32 (with
--tf32 1 the matrix products may use TF32, as meshtrain's train.tf32) with the reference GPT of the
parity test, whose attention materialises the T x T scores as meshtrain's kernel does.
--precision bf16 runs forward and loss under torch.autocast(bfloat16) (f32 master weights),
--attention sdpa uses F.scaled_dot_product_attention (flash attention on recent GPUs) and
--fused-adamw 1 the fused AdamW: together with --mode compile, PyTorch as its users run it at its
best. The loss is read back every step and each step is timed to the end of the device work.
With --profile 1, one more step runs under torch.profiler afterwards and its device kernels are
printed first, the longest first, one JSON line each (what meshtrain's --profile prints for its
own step, to set the two side by side):
  {"profile": "pytorch", "kernel", "calls", "ms", "share"}
and {"profile": "pytorch", "total_ms", "kernels"}. Then one JSON line:
  {"impl": "pytorch", "mode", "torch_version", "device", "tf32", "config": {...}, "steps",
   "warmup", "step_ms_median", "tokens_per_s", "peak_allocated_gib", "peak_reserved_gib",
   "final_loss", "n_params"}
or, when PyTorch or its CUDA support is missing, {"impl": "pytorch", "skipped": "<why>"}.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--tf32", type=int, default=1)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--attention", choices=["naive", "sdpa"], default="naive")
    ap.add_argument("--fused-adamw", type=int, default=0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--profile-top", type=int, default=30)
    return ap.parse_args()


def skip(why):
    print(json.dumps({"impl": "pytorch", "skipped": why}))
    sys.exit(0)


def device_kernel_times(prof):
    """(kernel name, calls, device ms) of each kernel a profile saw, the longest first: the
    events' device time (named device_time_total from PyTorch 2.4, cuda_time_total before)."""
    rows = []
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0)
        device_type = str(getattr(evt, "device_type", ""))
        # Kernels are the events that run on the device; their parents on the host have no
        # self device time.
        if us > 0 and "CPU" not in device_type:
            rows.append((evt.key, evt.count, us / 1e3))
    rows.sort(key=lambda r: -r[2])
    return rows


def print_profile(rows, top):
    total = sum(r[2] for r in rows)
    for name, calls, ms in rows[:top]:
        print(json.dumps({"profile": "pytorch", "kernel": name, "calls": calls, "ms": ms,
                          "share": ms / total if total > 0 else 0.0}))
    print(json.dumps({"profile": "pytorch", "total_ms": total, "kernels": len(rows)}))


def main():
    args = parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "python"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        skip(f"PyTorch is not importable: {e}")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} has no usable CUDA device "
             f"(built with CUDA {torch.version.cuda})")
    import gpt_torch
    from train_bench_torch import timed_steps

    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", 0)
    cfg = gpt_torch.GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                              n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                              attention=args.attention)
    model = gpt_torch.GPT(cfg)
    model.reset_parameters(seed=args.seed)
    model.to(dev)
    opt = torch.optim.AdamW(gpt_torch.decay_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if args.fused_adamw else {}))
    params = list(model.parameters())
    step_fn = model
    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            skip(f"PyTorch {torch.__version__} has no torch.compile")
        step_fn = torch.compile(model)
    if args.precision == "bf16":
        compiled = step_fn

        def step_fn(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return compiled(x, y)
    B, T = args.batch_size, args.block_size
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    pool = [torch.randint(0, args.vocab_size, (B, T + 1), generator=gen, dtype=torch.int32)
            .pin_memory() for _ in range(8)]

    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.synchronize(dev)
    times, loss_value = timed_steps(torch, args, pool, step_fn, opt,
                                    prepare=lambda t: t.to(dev, non_blocking=True),
                                    finish=lambda: torch.cuda.synchronize(dev))

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        args_one = argparse.Namespace(**vars(args))
        args_one.warmup, args_one.steps = 0, 1
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            timed_steps(torch, args_one, pool, step_fn, opt,
                        prepare=lambda t: t.to(dev, non_blocking=True),
                        finish=lambda: torch.cuda.synchronize(dev))
        print_profile(device_kernel_times(prof), args.profile_top)

    median = statistics.median(times)
    print(json.dumps({
        "impl": "pytorch",
        "mode": args.mode,
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(dev),
        "tf32": bool(args.tf32),
        "precision": args.precision,
        "attention": args.attention,
        "fused_adamw": bool(args.fused_adamw),
        "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                   "block_size": T, "batch_size": B, "vocab_size": args.vocab_size},
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms_median": median * 1e3,
        "tokens_per_s": B * T / median,
        "peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2**30,
        "final_loss": loss_value,
        "n_params": sum(p.numel() for p in params),
    }))


if __name__ == "__main__":
    main()
