"""PyTorch's gloo all_to_all_single with uneven splits: the peer that meshtrain's all_to_all_v is
measured against (bench/all_to_all_v_compare.sh), timed the way bench/comm_bench.cpp times it.

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/all_to_all_v_bench_torch.py
      [--world-size 2] [--min-bytes 1048576] [--max-bytes 16777216] [--iters 20] [--warmup 5]
      [--port 29541]
Spawns --world-size local processes on the gloo backend. For each size (doubling from
--min-bytes), every rank sends that many bytes of f32 in all, split unevenly the same way as
comm_bench --op all_to_all_v (rank r gives rank j a share weighted 1 + (r + j) % n, rounded down,
the last rank the rest), through dist.all_to_all_single with input_split_sizes and
output_split_sizes. --warmup untimed calls, a barrier, then --iters timed calls; the time is the
mean per call of the slowest rank (a MAX all-reduce). One fresh call is checked element by
element. Rank 0 prints one JSON line per size:
  {"label": "torch-gloo", "op": "all_to_all_v", "ranks", "bytes", "count", "dtype", "time_us",
   "algbw_gbs", "busbw_gbs", "ok", "torch_version", "blas"}
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def uneven_split(count, n, r):
    weights = [1 + (r + j) % n for j in range(n)]
    split = [count * w // sum(weights) for w in weights[:-1]]
    return split + [count - sum(split)]


def worker(rank, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    n = dist.get_world_size()
    blas = ""
    if rank == 0:
        sys.path.insert(0, HERE)
        from train_bench_torch import blas_report
        blas = blas_report(torch)[0]
    size = args.min_bytes
    while size <= args.max_bytes:
        count = size // 4
        send = uneven_split(count, n, rank)
        recv = [uneven_split(count, n, s)[rank] for s in range(n)]
        # Block j holds rank * n + j + 1, as in comm_bench, so the receiver can tell its origin.
        inp = torch.cat([torch.full((c,), float(rank * n + j + 1)) for j, c in enumerate(send)])
        out = torch.empty(sum(recv))

        def run():
            dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)

        for _ in range(args.warmup):
            run()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            run()
        us = (time.perf_counter() - t0) / max(1, args.iters) * 1e6
        slowest = torch.tensor([us])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        us = float(slowest[0])
        out.fill_(-1.0)
        run()
        want = torch.cat([torch.full((c,), float(s * n + rank + 1)) for s, c in enumerate(recv)])
        bad = torch.tensor([0 if torch.equal(out, want) else 1])
        dist.all_reduce(bad)
        if rank == 0:
            algbw = size / (us * 1e3)
            print(json.dumps({
                "label": "torch-gloo", "op": "all_to_all_v", "ranks": n, "bytes": size,
                "count": count, "dtype": "f32", "time_us": us, "algbw_gbs": algbw,
                "busbw_gbs": algbw * (n - 1) / n, "ok": int(bad[0]) == 0,
                "torch_version": torch.__version__, "blas": blas}), flush=True)
        size *= 2
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--port", type=int, default=29541)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
