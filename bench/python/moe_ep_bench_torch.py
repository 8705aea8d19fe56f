"""Expert-parallel training throughput of a PyTorch mixture-of-experts GPT on the CPU: the bar
that meshtrain's parallel.ep is measured against (bench/moe_ep_bench.sh).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/moe_ep_bench_torch.py
      [--world-size 2] [--threads 1] [--n-layer 4] [--n-embd 128] [--n-head 4]
      [--block-size 128] [--batch-size 8] [--vocab-size 257] [--experts 4] [--top-k 2]
      [--expert-hidden 256] [--aux-loss-weight 0.01] [--z-loss-weight 0.001]
      [--router-balance none|batch]
      [--steps 30] [--warmup 3] [--lr 6e-4] [--weight-decay 0.1] [--grad-clip 1.0] [--seed 0]
      [--port 29541]
The model is tests/python/gpt_torch.py's GPT with every block's MLP replaced by a dropless
mixture of experts, as meshtrain's model.moe: a bias-free f32 router, softmax gating, top-k
(top-2 gates divided by their sum), the Switch load-balancing loss and the router z-loss, each
expert the GPT's MLP at --expert-hidden. The experts are shared out over the ranks (expert
parallelism as DeepSpeed-MoE and Tutel run it on one host): each rank sorts its tokens by expert,
exchanges the per-expert counts with all_to_all_single, sends the rows to the experts' ranks with
torch.distributed.nn.functional.all_to_all_single (differentiable: backward sends the gradients
back), runs its local experts, and returns the outputs the same way. Everything but the experts
is averaged by DistributedDataParallel (the experts left out of it); each expert's gradient,
which already sums every rank's tokens, is divided by the world size. Global gradient clipping
adds the experts' squares over the ranks. One JSON line on rank 0, as ddp_bench_torch.py's.
--router-balance batch balances each batch's choice as meshtrain's model.moe.router_balance =
"batch" does (per-expert offsets, one cut per expert per sweep, in torch ops on the host).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    sys.path.insert(0, HERE)
    from train_bench_torch import add_model_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2, choices=(1, 2))
    ap.add_argument("--expert-hidden", type=int, default=0, help="0: 4 x n_embd")
    ap.add_argument("--aux-loss-weight", type=float, default=0.01)
    ap.add_argument("--z-loss-weight", type=float, default=0.001)
    ap.add_argument("--router-balance", default="none", choices=("none", "batch"))
    add_model_args(ap, steps=30)
    return ap.parse_args()


def add_experts(torch, model, args, rank, world):
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single as a2a

    E, K, W = args.experts, args.top_k, world
    local = E // W
    hidden = args.expert_hidden or 4 * args.n_embd

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(args.n_embd, hidden)
            self.c_proj = nn.Linear(hidden, args.n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    def balanced_choice(scores):
        # meshtrain's nn::balance_batch: sweeps over the experts, each expert's offset set to the
        # cut where its even share of the tokens choose it, the others fixed; the most even kept.
        n = scores.shape[0]
        s = scores.double()
        share = n * K / E
        target = int(round(share))
        slack = max(1.0, 0.02 * share)
        offset = torch.zeros(E, dtype=torch.float64)
        best, best_spread = offset.clone(), float("inf")
        for _ in range(32):
            count = torch.bincount((s + offset).topk(K, dim=-1).indices.reshape(-1), minlength=E)
            spread = (count.double() - share).abs().max().item()
            if spread < best_spread:
                best, best_spread = offset.clone(), spread
            if spread <= slack:
                break
            for e in range(E):
                adj = s + offset
                adj[:, e] = float("-inf")
                need = (adj.topk(K, dim=-1).values[:, K - 1] - s[:, e]).sort().values
                if target == 0:
                    offset[e] = need[0] - 1.0
                elif target >= n:
                    offset[e] = need[n - 1] + 1.0
                else:
                    offset[e] = 0.5 * (need[target - 1] + need[target])
        return scores + best.to(scores.dtype)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(args.n_embd, E, bias=False)
            self.experts = nn.ModuleList([Expert() for _ in range(local)])
            self.aux = None

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, shape[-1])
            N = x.shape[0]
            logits = self.router(x)
            probs = torch.softmax(logits, dim=-1)
            if args.router_balance == "batch":
                top_e = balanced_choice(probs.detach()).topk(K, dim=-1).indices
                top_p = probs.gather(1, top_e)
            else:
                top_p, top_e = probs.topk(K, dim=-1)
            gates = top_p / top_p.sum(-1, keepdim=True) if K == 2 else top_p
            # Switch's load balancing over the choices, and ST-MoE's z-loss.
            f = torch.bincount(top_e.reshape(-1), minlength=E).to(x.dtype) / (N * K)
            balance = E * (f * probs.mean(0)).sum()
            z = torch.logsumexp(logits, dim=-1).pow(2).mean()
            self.aux = args.aux_loss_weight * balance + args.z_loss_weight * z
            flat_e = top_e.reshape(-1)
            order = torch.argsort(flat_e, stable=True)
            token = order // K
            rows = x.index_select(0, token)
            counts = torch.bincount(flat_e, minlength=E)
            # Counts per (destination rank, its local expert), then the rows themselves.
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)
            send_split = counts.view(W, local).sum(1).tolist()
            recv_split = recv_counts.view(W, local).sum(1).tolist()
            got = a2a(rows.new_empty(sum(recv_split), shape[-1]), rows, recv_split, send_split)
            # Received: per source rank, its rows for each local expert in turn.
            rc = recv_counts.view(W, local)
            pieces = list(got.split(rc.reshape(-1).tolist()))
            outs = [None] * len(pieces)
            for j, expert in enumerate(self.experts):
                idx = [s * local + j for s in range(W)]
                y = expert(torch.cat([pieces[i] for i in idx]))
                for i, part in zip(idx, y.split([pieces[i].shape[0] for i in idx])):
                    outs[i] = part
            back = a2a(rows.new_empty(rows.shape[0], shape[-1]), torch.cat(outs), send_split,
                       recv_split)
            weighted = back * gates.reshape(-1).index_select(0, order).unsqueeze(1)
            out = torch.zeros_like(x).index_add(0, token, weighted)
            return out.reshape(shape)

    moes = []
    for block in model.h:
        block.mlp = MoE()
        moes.append(block.mlp)
    model.reset_parameters(seed=args.seed + rank)
    return moes


def worker(rank, args):
    sys.path.insert(0, HERE)
    from ddp_bench_torch import result_record, setup_rank
    from train_bench_torch import timed_steps

    # The dense GPT, the gloo group and the rank's batches as every data-parallel peer makes them;
    # then every block's MLP becomes experts.
    torch, gpt_torch, model, pool = setup_rank(rank, args)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    moes = add_experts(torch, model, args, rank, args.world_size)
    experts = [n for n, _ in model.named_parameters() if ".experts." in n]
    expert_params = [p for n, p in model.named_parameters() if ".experts." in n]
    dense_params = [p for n, p in model.named_parameters() if ".experts." not in n]
    # The dense parameters start alike on every rank; the experts are each rank's own.
    with torch.no_grad():
        for p in dense_params:
            dist.broadcast(p, 0)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, experts + [n for n, b in model.named_buffers() if b.dtype == torch.bool])
    ddp = DistributedDataParallel(model, broadcast_buffers=False)
    opt = torch.optim.AdamW(gpt_torch.decay_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    world = float(args.world_size)

    def forward(x, y):
        logits, loss = ddp(x, y)
        aux = sum(m.aux for m in moes)
        return logits, loss + aux

    def clip(max_norm):
        for p in expert_params:
            if p.grad is not None:
                p.grad.div_(world)
        sq = torch.zeros(1)
        for p in expert_params:
            if p.grad is not None:
                sq += p.grad.pow(2).sum()
        dist.all_reduce(sq)
        for p in dense_params:
            if p.grad is not None:
                sq += p.grad.pow(2).sum()
        norm = sq.sqrt().item()
        if norm > max_norm:
            for p in dense_params + expert_params:
                if p.grad is not None:
                    p.grad.mul_(max_norm / (norm + 1e-6))

    times, loss_value = timed_steps(torch, args, pool, forward, opt, clip=clip)
    if rank == 0:
        print(json.dumps(result_record(torch, args, times, loss_value, impl="pytorch-moe-ep",
                                       experts=args.experts, top_k=args.top_k,
                                       expert_hidden=args.expert_hidden or 4 * args.n_embd,
                                       ep=args.world_size)), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
