"""GPipe training throughput of PyTorch 1.13's torch.distributed.pipeline.sync.Pipe on the CPU:
the peer of meshtrain's pipeline (bench/pipeline_bench.sh).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/pipeline_bench_torch.py [--stages 2] [--micro-batches 4] [--threads 1]
      [--n-layer 4] [--n-embd 128] [--n-head 4] [--block-size 128] [--batch-size 8]
      [--vocab-size 257] [--steps 20] [--warmup 3] [--lr 6e-4]
The model is tests/python/gpt_torch.py's GPT with an untied output projection (Pipe cannot share
a parameter between partitions), cut into --stages partitions of equal block counts (the
embeddings with the first, the final norm and the projection with the last), all on the CPU:
Pipe runs each partition on a worker thread of its own, so --stages partitions use --stages
cores with --threads intra-op threads each. Each step: forward of the batch in --micro-batches
chunks (GPipe), cross-entropy, backward, AdamW step, zero_grad; the first --warmup steps are not
timed. Prints one JSON line: {"impl": "pytorch-pipe", "torch_version", "stages",
"micro_batches", "threads", "config", "steps", "warmup", "step_ms_median", "tokens_per_step",
"tokens_per_s", "final_loss"}. When Pipe cannot run here it prints
"pipeline_bench_torch: pipe cannot run: REASON" on stderr and exits with status 3.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CANNOT_RUN = 3


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=257)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=6e-4)
    return ap.parse_args()


def main():
    args = parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torch.distributed.rpc as rpc
        from torch.distributed.pipeline.sync import Pipe
    except Exception as e:  # noqa: BLE001 - say why in one line
        print(f"pipeline_bench_torch: pipe cannot run: {type(e).__name__}: {e}", file=sys.stderr)
        return CANNOT_RUN
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    import gpt_torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cfg = gpt_torch.GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                              n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    gpt = gpt_torch.GPT(cfg)

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = gpt.wte, gpt.wpe

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], dtype=torch.long)
            return self.wte(idx) + self.wpe(pos)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_f = gpt.ln_f
            self.proj = nn.Linear(args.n_embd, args.vocab_size, bias=False)

        def forward(self, x):
            return self.proj(self.ln_f(x))

    blocks = list(gpt.h)
    per = [len(blocks) // args.stages + (1 if s < len(blocks) % args.stages else 0)
           for s in range(args.stages)]
    parts, at = [], 0
    for s in range(args.stages):
        layers = ([Embed()] if s == 0 else []) + blocks[at:at + per[s]]
        at += per[s]
        if s == args.stages - 1:
            layers.append(Head())
        parts.append(nn.Sequential(*layers))
    try:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29561")
        rpc.init_rpc("worker", rank=0, world_size=1)
        model = Pipe(nn.Sequential(*parts), chunks=args.micro_batches)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        B, T, V = args.batch_size, args.block_size, args.vocab_size
        gen = torch.Generator().manual_seed(1)
        times, loss_value = [], float("nan")
        for step in range(args.warmup + args.steps):
            x = torch.randint(0, V, (B, T), generator=gen)
            y = torch.randint(0, V, (B, T), generator=gen)
            t0 = time.perf_counter()
            logits = model(x).local_value()
            loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
            loss_value = loss.item()
        rpc.shutdown()
    except Exception as e:  # noqa: BLE001 - say why in one line
        print(f"pipeline_bench_torch: pipe cannot run: {type(e).__name__}: {e}".splitlines()[0],
              file=sys.stderr)
        return CANNOT_RUN
    med = statistics.median(times)
    print(json.dumps({
        "impl": "pytorch-pipe", "torch_version": torch.__version__, "stages": args.stages,
        "micro_batches": args.micro_batches, "threads": args.threads,
        "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                   "block_size": args.block_size, "batch_size": args.batch_size,
                   "vocab_size": args.vocab_size, "tie_embeddings": False},
        "steps": args.steps, "warmup": args.warmup, "step_ms_median": 1000 * med,
        "tokens_per_step": B * T, "tokens_per_s": B * T / med, "final_loss": loss_value,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
