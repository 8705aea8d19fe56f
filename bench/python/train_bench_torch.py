"""Training throughput of the PyTorch GPT (tests/python/gpt_torch.py) on the CPU: the bar that
meshtrain's trainer is measured against.

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/train_bench_torch.py
      [--n-layer 4] [--n-embd 128] [--n-head 4] [--block-size 128] [--batch-size 8]
      [--vocab-size 257] [--steps 20] [--warmup 3] [--threads 1]
      [--lr 6e-4] [--weight-decay 0.1] [--grad-clip 1.0] [--seed 0]
Each step: forward, loss, backward, global gradient clipping, AdamW (torch.optim, weight decay
on dim >= 2 parameters), zero_grad, on random tokens. The first --warmup steps are not timed.
Prints one JSON line:
  {"impl": "pytorch", "torch_version", "blas", "blas_libs", "threads", "config": {...},
   "steps", "warmup", "step_ms_median", "step_ms_min", "step_ms_max", "tokens_per_step",
   "tokens_per_s" (tokens_per_step / median step time), "final_loss", "n_params"}
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import sys
import time


def add_model_args(ap, steps=20):
    """The model, optimizer and timing flags shared with ddp_bench_torch.py."""
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=257)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    return ap.parse_args()


def timed_steps(torch, args, pool, forward, opt, prepare=None, finish=None, clip=None):
    """Runs warm-up + timed training steps over the token pool, as the other benchmarks do.

    Returns (seconds of each timed step, last loss). `prepare` moves a batch where it is needed
    (inside the timed region); `finish` waits for the device, so that a step's time is real;
    `clip(max_norm)` replaces the global clipping over the optimizer's parameters where a rank
    holds only part of the gradients (FSDP).
    """
    T = args.block_size
    params = [p for g in opt.param_groups for p in g["params"]]
    times = []
    loss_value = float("nan")
    for step in range(args.warmup + args.steps):
        tokens = pool[step % len(pool)]
        t0 = time.perf_counter()
        if prepare is not None:
            tokens = prepare(tokens)
        x, y = tokens[:, :T], tokens[:, 1:]
        _, loss = forward(x, y)
        loss.backward()
        if args.grad_clip > 0 and clip is not None:
            clip(args.grad_clip)
        elif args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if finish is not None:
            finish()
        elapsed = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(elapsed)
    return times, loss_value


def blas_report(torch):
    """Which BLAS torch really calls: its build info and the libraries mapped into this process
    (Debian's torch links the generic libblas.so.3, which the alternatives system points at
    OpenBLAS or the reference BLAS)."""
    info = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if re.search(r"blas|lapack|mkl", os.path.basename(path), re.I):
                libs.add(os.path.realpath(path))
    names = " ".join(sorted(libs)).lower()
    if "mkl" in names:
        kind = "mkl"
    elif "openblas" in names:
        kind = "openblas-openmp" if "openmp" in names else "openblas"
    elif libs:
        kind = "reference"
    else:
        kind = "unknown"
    # OpenBLAS picks its kernels for the CPU when loaded (OPENBLAS_CORETYPE overrides): ask the
    # instance this process mapped which ones it runs.
    config = ""
    for path in sorted(libs):
        if "openblas" in os.path.basename(path).lower():
            try:
                get = ctypes.CDLL(path).openblas_get_config
                get.restype = ctypes.c_char_p
                config = "; " + get().decode().strip()
            except (OSError, AttributeError):
                pass
            break
    return f"{kind} (BLAS_INFO={info.group(1) if info else '?'}{config})", sorted(libs)


def main():
    args = parse_args()
    # OpenBLAS (OpenMP build) and torch's own kernels both follow the OpenMP thread count.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "python"))
    import torch
    import gpt_torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = gpt_torch.GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                              n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    model = gpt_torch.GPT(cfg)
    model.reset_parameters(seed=args.seed)
    opt = torch.optim.AdamW(gpt_torch.decay_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    params = list(model.parameters())
    B, T = args.batch_size, args.block_size
    pool = [torch.randint(0, args.vocab_size, (B, T + 1)) for _ in range(8)]

    times, loss_value = timed_steps(torch, args, pool, model, opt)

    blas, libs = blas_report(torch)
    median = statistics.median(times)
    print(json.dumps({
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "blas": blas,
        "blas_libs": libs,
        "threads": args.threads,
        "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                   "block_size": T, "batch_size": B, "vocab_size": args.vocab_size},
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms_median": median * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
        "tokens_per_step": B * T,
        "tokens_per_s": B * T / median,
        "final_loss": loss_value,
        "n_params": sum(p.numel() for p in params),
    }))


if __name__ == "__main__":
    main()
