"""Data-parallel training throughput of the PyTorch GPT (tests/python/gpt_torch.py) with
DistributedDataParallel on the gloo backend: the bar that meshtrain's DDP is measured against
(bench/ddp_bench.sh, case (d)).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/ddp_bench_torch.py
      [--world-size 2] [--threads 1] [--n-layer 4] [--n-embd 128] [--n-head 4]
      [--block-size 128] [--batch-size 8] [--vocab-size 257] [--steps 30] [--warmup 3]
      [--lr 6e-4] [--weight-decay 0.1] [--grad-clip 1.0] [--seed 0] [--port 29531]
Spawns --world-size local processes, each with --threads intra-op threads. Each step: forward,
loss, backward (DDP all-reduces the gradients in buckets, overlapped with backward), global
gradient clipping, AdamW, zero_grad, on random tokens (different per rank). The first --warmup
steps are not timed. Rank 0 prints one JSON line:
  {"impl": "pytorch-ddp", "backend": "gloo", "torch_version", "blas", "blas_libs",
   "world_size", "threads", "config": {...}, "steps", "warmup", "step_ms_median",
   "step_ms_min", "step_ms_max", "tokens_per_step" (global: batch * block * world),
   "tokens_per_s" (aggregate: tokens_per_step / rank 0's median step time), "final_loss"}
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    sys.path.insert(0, HERE)
    from train_bench_torch import add_model_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--gradient-as-bucket-view", type=int, choices=(0, 1), default=0,
                    help="DDP's gradient_as_bucket_view (gradients alias the buckets: one copy "
                         "less per step)")
    add_model_args(ap, steps=30)
    return ap.parse_args()


def setup_rank(rank, args):
    """What every data-parallel PyTorch peer does first in a rank (zero_bench_torch.py too):
    threads, the gloo process group, the GPT with its seeded initialisation and the rank's pool of
    random batches. Returns (torch, gpt_torch module, model, pool)."""
    # OpenBLAS (OpenMP build) and torch's own kernels both follow the OpenMP thread count; it must
    # be set before torch's first parallel region in this process.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    sys.path.insert(0, HERE)
    import torch
    import torch.distributed as dist
    import gpt_torch

    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)

    torch.manual_seed(args.seed)
    cfg = gpt_torch.GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                              n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    model = gpt_torch.GPT(cfg)
    model.reset_parameters(seed=args.seed)
    B, T = args.batch_size, args.block_size
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    pool = [torch.randint(0, args.vocab_size, (B, T + 1), generator=gen) for _ in range(8)]
    return torch, gpt_torch, model, pool


def result_record(torch, args, times, loss_value, impl, **variant):
    """The JSON line a PyTorch peer prints: its settings, BLAS and median step time."""
    from train_bench_torch import blas_report
    blas, libs = blas_report(torch)
    median = statistics.median(times)
    B, T = args.batch_size, args.block_size
    tokens_per_step = B * T * args.world_size
    return {
        "impl": impl,
        "backend": "gloo",
        **variant,
        "torch_version": torch.__version__,
        "blas": blas,
        "blas_libs": libs,
        "world_size": args.world_size,
        "threads": args.threads,
        "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                   "block_size": T, "batch_size": B, "vocab_size": args.vocab_size},
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms_median": median * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / median,
        "final_loss": loss_value,
    }


def ddp_wrap(torch, model, gradient_as_bucket_view):
    """DistributedDataParallel as every PyTorch peer uses it."""
    from torch.nn.parallel import DistributedDataParallel
    # The causal masks are constant bool buffers, identical on every rank, and gloo cannot
    # broadcast bool tensors: DDP leaves them out of its initial state sync.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [name for name, b in model.named_buffers() if b.dtype == torch.bool])
    return DistributedDataParallel(model, broadcast_buffers=False,
                                   gradient_as_bucket_view=gradient_as_bucket_view)


def worker(rank, args):
    torch, gpt_torch, model, pool = setup_rank(rank, args)
    import torch.distributed as dist
    from train_bench_torch import timed_steps

    ddp = ddp_wrap(torch, model, bool(args.gradient_as_bucket_view))
    opt = torch.optim.AdamW(gpt_torch.decay_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)

    times, loss_value = timed_steps(torch, args, pool, ddp, opt)

    if rank == 0:
        print(json.dumps(result_record(
            torch, args, times, loss_value, impl="pytorch-ddp",
            gradient_as_bucket_view=bool(args.gradient_as_bucket_view))), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
