"""Training throughput (or time to a test accuracy) of the PyTorch ResNet
(tests/python/resnet_torch.py, meshtrain's ResNet in torch.nn) on Fashion-MNIST on the CPU: the
bar that meshtrain's ResNet is measured against (bench/resnet_bench.sh).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/resnet_bench_torch.py
      [--model small] [--world-size 1] [--threads 1] [--batch-size 64] [--steps 30]
      [--warmup 3] [--lr 0.05] [--momentum 0.9] [--weight-decay 5e-4] [--seed 0]
      [--data-dir /usr/share/datasets/fashion-mnist] [--port 29541]
      [--to-accuracy A --max-epochs E] [--schedule constant|cosine] [--warmup-steps N]
      [--nesterov 0|1]
The data and its treatment are meshtrain's (data/image_batches.h): pixels normalised with the
training set's mean 0.2860 and std 0.3530; training images padded by 4 zero pixels, cropped back
to 28 x 28 at a random offset and mirrored with probability 1/2; each epoch a seeded shuffle,
rank r taking every world-size-th image of it. The optimizer is torch.optim.SGD with momentum,
weight decay on the convolution and fc weights only (meshtrain's rule: tensors of dim >= 2), a
constant learning rate, no gradient clipping. --world-size > 1 spawns that many local processes
with DistributedDataParallel on gloo (buffers broadcast from rank 0 each forward, DDP's default)
and plain BatchNorm2d: each rank normalises over its own batch, since PyTorch's SyncBatchNorm runs
only on CUDA devices.

Throughput: warm-up plus timed steps, each step forward, loss, backward, SGD, zero_grad; a step's
time includes building its batch (data_ms_median says how much of it that is). Rank 0 prints:
  {"impl": "pytorch" | "pytorch-ddp", "backend", "batch_norm", "torch_version", "blas",
   "blas_libs", "world_size", "threads", "model", "batch_size" (per rank), "steps", "warmup",
   "step_ms_median", "step_ms_min", "step_ms_max", "data_ms_median", "images_per_step" (global),
   "images_per_s" (images_per_step / rank 0's median step time), "final_loss"}
--to-accuracy A: trains epoch by epoch, evaluating the whole test split after each (rank 0), until
the test accuracy reaches A or --max-epochs pass; prints {"mode": "to_accuracy", ...,
"reached", "epochs", "accuracy" (per epoch), "train_s" (summed step times), "wall_s" (from the
first step to the last evaluation, evaluations included)}.
"""
import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MEAN, STD = 0.2860, 0.3530


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--nesterov", type=int, default=0)
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--to-accuracy", type=float, default=0.0)
    ap.add_argument("--max-epochs", type=int, default=30)
    return ap.parse_args()


def read_idx(path):
    """An IDX file of unsigned bytes (gzip or plain) as a uint8 tensor of its dimensions."""
    import torch
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        blob = f.read()
    if blob[0] != 0 or blob[1] != 0 or blob[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    data = torch.frombuffer(bytearray(blob[4 + 4 * rank:]), dtype=torch.uint8)
    return data.reshape(dims)


def load_split(data_dir, prefix):
    def find(kind):
        for name in (f"{prefix}-{kind}-ubyte.gz", f"{prefix}-{kind}-ubyte"):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        sys.exit(f"resnet_bench_torch: no {prefix}-{kind}-ubyte(.gz) in {data_dir}")
    images = read_idx(find("images-idx3"))
    labels = read_idx(find("labels-idx1")).long()
    return images.unsqueeze(1), labels  # [N, 1, 28, 28]


def normalise(torch, images):
    return (images.float() / 255.0 - MEAN) / STD


def augment(torch, images, gen):
    """meshtrain's training transform: pad 4 zero pixels (in pixel space, so (0 - mean) / std after
    normalisation), crop 28 x 28 at a random offset, mirror with probability 1/2."""
    n, c, h, w = images.shape
    x = normalise(torch, images)
    padded = torch.full((n, c, h + 8, w + 8), -MEAN / STD)
    padded[:, :, 4:4 + h, 4:4 + w] = x
    offsets = torch.randint(0, 9, (n, 2), generator=gen).tolist()
    flips = torch.rand(n, generator=gen).lt(0.5).tolist()
    out = torch.empty_like(x)
    for i, ((dy, dx), flip) in enumerate(zip(offsets, flips)):
        crop = padded[i, :, dy:dy + h, dx:dx + w]
        out[i] = crop.flip(-1) if flip else crop
    return out


def accuracy(torch, model, images, labels):
    model.eval()
    right = 0
    with torch.no_grad():
        for begin in range(0, len(labels), 500):
            x = normalise(torch, images[begin:begin + 500])
            right += int((model(x).argmax(1) == labels[begin:begin + 500]).sum())
    model.train()
    return right / len(labels)


def worker(rank, args):
    # OpenBLAS (OpenMP build) and torch's own kernels both follow the OpenMP thread count; it must
    # be set before torch's first parallel region in this process.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    sys.path.insert(0, HERE)
    import torch
    import torch.nn.functional as F
    import resnet_torch
    from train_bench_torch import blas_report

    torch.set_num_threads(args.threads)
    ddp = args.world_size > 1
    if ddp:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.world_size)

    train_x, train_y = load_split(args.data_dir, "train")
    test_x, test_y = load_split(args.data_dir, "t10k")
    torch.manual_seed(args.seed)
    model = resnet_torch.resnet(args.model, in_channels=1, num_classes=10)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": args.weight_decay},
                           {"params": other, "weight_decay": 0.0}],
                          lr=args.lr, momentum=args.momentum, nesterov=bool(args.nesterov))
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)  # broadcasts the buffers from rank 0 each forward

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    B = args.batch_size
    per_rank = len(train_y) // args.world_size
    steps_per_epoch = per_rank // B

    def batches(epoch):
        order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(
            args.seed + epoch))[rank::args.world_size][:per_rank]
        for s in range(steps_per_epoch):
            yield order[s * B:(s + 1) * B]

    # meshtrain's schedule (optim/lr_schedule.cpp): linear warm-up to lr over warmup_steps, then
    # (cosine) a half cosine to zero at the end of --max-epochs.
    total = steps_per_epoch * args.max_epochs
    done_steps = [0]

    def lr_at(s):
        if s < args.warmup_steps:
            return args.lr * (s + 1) / args.warmup_steps
        if args.schedule == "constant":
            return args.lr
        if s >= total:
            return 0.0
        ratio = (s - args.warmup_steps) / (total - args.warmup_steps)
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * ratio))

    def step(idx):
        for g in opt.param_groups:
            g["lr"] = lr_at(done_steps[0])
        done_steps[0] += 1
        t0 = time.perf_counter()
        x, y = augment(torch, train_x[idx], gen), train_y[idx]
        t1 = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        t2 = time.perf_counter()
        return t2 - t0, t1 - t0, value

    blas, libs = blas_report(torch)
    record = {
        "impl": "pytorch-ddp" if ddp else "pytorch",
        "backend": "gloo" if ddp else None,
        "batch_norm": "BatchNorm2d per rank (SyncBatchNorm needs CUDA)" if ddp else "BatchNorm2d",
        "torch_version": torch.__version__,
        "blas": blas,
        "blas_libs": libs,
        "world_size": args.world_size,
        "threads": args.threads,
        "model": args.model,
        "batch_size": B,
        "images_per_step": B * args.world_size,
    }

    if args.to_accuracy > 0:
        accs, train_s, reached = [], 0.0, False
        start = time.perf_counter()
        for epoch in range(args.max_epochs):
            for idx in batches(epoch):
                train_s += step(idx)[0]
            acc = accuracy(torch, model, test_x, test_y) if rank == 0 else 0.0
            if ddp:
                flag = torch.tensor([acc])
                dist.broadcast(flag, 0)
                acc = round(float(flag.item()), 6)
            accs.append(acc)
            if acc >= args.to_accuracy:
                reached = True
                break
        wall = time.perf_counter() - start
        if rank == 0:
            print(json.dumps({**record, "mode": "to_accuracy", "target": args.to_accuracy,
                              "reached": reached, "epochs": len(accs), "accuracy": accs,
                              "steps_per_epoch": steps_per_epoch, "train_s": train_s,
                              "wall_s": wall}), flush=True)
    else:
        times, data_times, loss_value = [], [], float("nan")
        it = iter(())
        epoch = 0
        for s in range(args.warmup + args.steps):
            idx = next(it, None)
            if idx is None:
                it = batches(epoch)
                epoch += 1
                idx = next(it)
            elapsed, data_s, loss_value = step(idx)
            if s >= args.warmup:
                times.append(elapsed)
                data_times.append(data_s)
        median = statistics.median(times)
        if rank == 0:
            print(json.dumps({**record, "mode": "throughput", "steps": args.steps,
                              "warmup": args.warmup, "step_ms_median": median * 1e3,
                              "step_ms_min": min(times) * 1e3, "step_ms_max": max(times) * 1e3,
                              "data_ms_median": statistics.median(data_times) * 1e3,
                              "images_per_s": B * args.world_size / median,
                              "final_loss": loss_value}), flush=True)
    if ddp:
        dist.barrier()
        dist.destroy_process_group()


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.world_size == 1:
        worker(0, args)
        return
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
