"""Sharded data-parallel training throughput and peak memory of the PyTorch GPT
(tests/python/gpt_torch.py) on the gloo backend: the bars that meshtrain's ZeRO stages are
measured against (bench/zero_bench.sh).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/zero_bench_torch.py --variant zero|fsdp
      [--world-size 2] [--threads 1] [--n-layer 4] [--n-embd 128] [--n-head 4]
      [--block-size 128] [--batch-size 8] [--vocab-size 257] [--steps 30] [--warmup 3]
      [--lr 6e-4] [--weight-decay 0.1] [--grad-clip 1.0] [--seed 0] [--port 29541]
      [--bucket-view 0|1]
Variants:
  zero  DistributedDataParallel (gradients all-reduced in buckets during backward) with
        torch.distributed.optim.ZeroRedundancyOptimizer around AdamW: each rank keeps the AdamW
        state of its share of the parameters, updates them and broadcasts them to the other ranks
        (--bucket-view 1: parameters_as_bucket_view, one broadcast per rank's bucket). The
        counterpart of ZeRO-1 and ZeRO-2 (PyTorch has no sharded-gradient stage on DDP).
  fsdp  FullyShardedDataParallel, one unit per transformer block plus the root (embeddings, final
        layer norm): parameters, gradients and optimizer state sharded (ZeRO-3). Weight decay
        applies to every parameter: FSDP 1.13 flattens each unit into one parameter, so the
        dim >= 2 rule cannot be kept (it does not change the work of a step).
Each step: forward, loss, backward, global gradient clipping, optimizer step, zero_grad, on random
tokens (different per rank); the first --warmup steps are not timed. Rank 0 prints one JSON line:
  {"impl": "pytorch-zero" | "pytorch-fsdp", "backend": "gloo", "torch_version", "blas",
   "blas_libs", "world_size", "threads", "config": {...}, "steps", "warmup", "step_ms_median",
   "step_ms_min", "step_ms_max", "tokens_per_step" (global), "tokens_per_s" (aggregate:
   tokens_per_step / rank 0's median step time), "final_loss",
   "peak_rss_mb" (per rank: getrusage(RUSAGE_SELF).ru_maxrss at the end)}
When the variant cannot run here (FSDP in PyTorch 1.13 refuses CPU-only execution), it prints
"zero_bench_torch: VARIANT cannot run: REASON" on stderr and exits with status 3.
"""
import argparse
import json
import os
import resource
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
CANNOT_RUN = 3


def parse_args():
    sys.path.insert(0, HERE)
    from train_bench_torch import add_model_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=("zero", "fsdp"), required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--bucket-view", type=int, choices=(0, 1), default=1,
                    help="zero: ZeroRedundancyOptimizer's parameters_as_bucket_view")
    add_model_args(ap, steps=30)
    return ap.parse_args()


class CannotRun(Exception):
    """The variant is not available in this PyTorch on this machine."""


def import_fsdp():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    except Exception as e:  # noqa: BLE001 - any import failure means the variant is unusable
        raise CannotRun(f"importing torch.distributed.fsdp failed: {type(e).__name__}: {e}")
    return FullyShardedDataParallel, transformer_auto_wrap_policy


def build(torch, gpt_torch, model, args):
    """The wrapped model, its optimizer and the clipping function of the variant."""
    import functools

    def adamw(**kw):
        return dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **kw)

    if args.variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from ddp_bench_torch import ddp_wrap

        wrapped = ddp_wrap(torch, model, gradient_as_bucket_view=False)
        opt = ZeroRedundancyOptimizer(gpt_torch.decay_groups(model, args.weight_decay),
                                      optimizer_class=torch.optim.AdamW,
                                      parameters_as_bucket_view=bool(args.bucket_view), **adamw())
        return wrapped, opt, None  # gradients are whole on every rank: the usual clipping
    FSDP, auto_wrap = import_fsdp()
    # The causal masks are bool buffers; FSDP leaves buffers unsharded.
    wrapped = FSDP(model, auto_wrap_policy=functools.partial(
        auto_wrap, transformer_layer_cls={gpt_torch.Block}))
    opt = torch.optim.AdamW(wrapped.parameters(), weight_decay=args.weight_decay, **adamw())
    return wrapped, opt, wrapped.clip_grad_norm_


def worker(rank, args):
    from ddp_bench_torch import setup_rank

    torch, gpt_torch, model, pool = setup_rank(rank, args)
    import torch.distributed as dist
    from train_bench_torch import timed_steps

    try:
        wrapped, opt, clip = build(torch, gpt_torch, model, args)
        times, loss_value = timed_steps(torch, args, pool, wrapped, opt, clip=clip)
    except CannotRun:
        raise
    except Exception as e:  # noqa: BLE001 - report why, in one line, and let the script go on
        raise CannotRun(f"{type(e).__name__}: {e}".splitlines()[0]) from e

    # Peak resident memory of this rank (kilobytes on Linux), gathered on rank 0.
    peaks = [None] * args.world_size
    dist.all_gather_object(peaks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    if rank == 0:
        from ddp_bench_torch import result_record
        variant = ({"parameters_as_bucket_view": bool(args.bucket_view)}
                   if args.variant == "zero" else {"fsdp_unit": "block"})
        record = result_record(torch, args, times, loss_value, impl=f"pytorch-{args.variant}",
                               **variant)
        record["peak_rss_mb"] = [kb / 1024 for kb in peaks]
        print(json.dumps(record), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, args):
    """Runs one rank; a variant that cannot run ends the rank with CANNOT_RUN and one line."""
    try:
        worker(rank, args)
    except CannotRun as e:
        # Every rank says it: the launcher stops the others as soon as the first one exits.
        if e.__cause__ is not None:
            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(f"zero_bench_torch: {args.variant} cannot run (rank {rank}): {e}", file=sys.stderr,
              flush=True)
        sys.exit(CANNOT_RUN)


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.variant == "fsdp":
        # Fail before starting any rank where the module itself does not load.
        try:
            import_fsdp()
        except CannotRun as e:
            print(f"zero_bench_torch: fsdp cannot run: {e}", file=sys.stderr)
            sys.exit(CANNOT_RUN)
    import torch.multiprocessing as mp
    try:
        mp.spawn(spawned, args=(args,), nprocs=args.world_size, join=True)
    except mp.ProcessExitedException as e:
        sys.exit(e.exit_code if e.exit_code == CANNOT_RUN else 1)


if __name__ == "__main__":
    main()
