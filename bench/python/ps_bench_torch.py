"""Parameter-server training throughput of the PyTorch GPT (tests/python/gpt_torch.py) with
PyTorch's RPC framework on the CPU: the bar that meshtrain's parameter server
(parallel.mode = "parameter_server", consistency "sync") is measured against
(bench/ps_compare.sh).

Command line (run with the system interpreter that has python3-torch):
  python3 bench/python/ps_bench_torch.py
      [--workers 2] [--servers 1] [--pattern batch-update|dist-optimizer] [--threads 1]
      [--n-layer 4] [--n-embd 128] [--n-head 4] [--block-size 128] [--batch-size 8]
      [--vocab-size 257] [--steps 30] [--warmup 3] [--lr 2e-3] [--weight-decay 0.1]
      [--seed 0] [--port 0] [--rpc-timeout 120] [--timeout 600]
Starts --workers + --servers local processes (ranks 0..W-1 workers, the last S ranks servers,
as meshrun --ps-servers lays out a job), joined by torch.distributed.rpc on the TensorPipe
backend with its default options: the rendezvous over TCP on 127.0.0.1 (--port 0: a free port),
the transport TensorPipe's own choice (shared memory between the processes of one host). Every
process runs with --threads intra-op threads (TensorPipe's own threads are not counted). The
servers own the GPT's parameters, split by parameter into S contiguous ranges in the model's
parameter order, balanced by bytes, and the AdamW state of their range (betas
0.9/0.95, eps 1e-8, weight decay on dim >= 2 parameters only). Each worker trains on its own
random token batches of [batch_size, block_size]. No gradient clipping: a global norm would need
the servers to agree on it every step, which neither PyTorch pattern does (ps_compare.sh turns
clipping off on meshtrain's side too).

Patterns (both from PyTorch's own tutorials):
  batch-update (the default; the one ps_compare.sh measures) is the batch-updating parameter
    server of the tutorial "Implementing Batch RPC Processing Using Asynchronous Executions"
    (the synchronous variant of "Implementing a Parameter Server Using Distributed RPC
    Framework"), spread over S servers. Each worker keeps a local replica of the model for its
    forward and backward, then calls every server's update_and_fetch with the gradients of that
    server's parameters (rpc_async, one call per server, all in flight together). A server is an
    RRef-held object whose update_and_fetch is an @rpc.functions.async_execution static method:
    under a lock it adds the gradient into .grad and counts; the W-th arrival divides by W, runs
    AdamW once and completes the torch.futures.Future every caller of this step holds, with the
    updated parameters, which the workers copy into their replica. So every global step applies
    the average gradient of all W workers, one optimizer step, as meshtrain's sync mode does.
  dist-optimizer uses the APIs of "Implementing a Parameter Server Using Distributed RPC
    Framework" and the distributed autograd / DistributedOptimizer documentation: inside a
    torch.distributed.autograd context each worker fetches every server's parameters by RPC (the
    fetch is recorded in the distributed autograd graph), runs the model on them locally
    (torch.nn.utils.stateless.functional_call), dist_autograd.backward sends each gradient back
    to its server, and DistributedOptimizer(torch.optim.AdamW, parameter RRefs) steps on every
    server with that worker's gradient alone. Two departures from the tutorial, so that each
    process does the work its meshtrain counterpart does: the tutorial keeps the whole model on
    one server and runs its forward there (the trainers send their inputs), and here the
    parameters are split over S servers and the workers compute. DistributedOptimizer cannot
    average over workers: each server applies W separate updates per global step as they arrive
    (asynchronous, what meshtrain calls consistency "async"), so it is not the peer of the sync
    comparison; it is there to show what the documented API costs. Two DistributedOptimizers
    (with and without weight decay) keep the dim >= 2 rule, as DistributedOptimizer takes no
    parameter groups.

The first --warmup steps are not timed. A step's time is worker 0's wall time from its forward to
its parameters being updated (meshtrain's step_s on rank 0 counts the same span). Worker 0 prints
one JSON line:
  {"side": "torch_rpc_ps", "workers", "servers", "steps", "median_step_s", "steps_per_s",
   "blas", "pattern", "consistency", "torch_version", "blas_libs", "threads", "config": {...},
   "warmup", "step_s_min", "step_s_max", "worker_median_step_s" (every worker's),
   "server_bytes" (parameter bytes per server), "tokens_per_step" (global: W x batch x block),
   "tokens_per_s", "final_loss" (worker 0's last)}
On an error (or after --timeout seconds) it prints one line "ps_bench_torch: ..." on stderr, ends
every process it started and exits non-zero.
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "ps_bench_torch"


def parse_args():
    sys.path.insert(0, HERE)
    from train_bench_torch import add_model_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--pattern", choices=("batch-update", "dist-optimizer"), default="batch-update")
    ap.add_argument("--port", type=int, default=0, help="TCP port of the RPC rendezvous (0: free)")
    ap.add_argument("--rpc-timeout", type=float, default=120.0,
                    help="seconds one RPC may take before it fails")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds the whole run may take before every process is ended")
    add_model_args(ap, steps=30)
    # configs/demo.toml's learning rate (the scheduling around it does not change a step's work).
    ap.set_defaults(lr=2e-3, grad_clip=0.0)
    args = ap.parse_args()
    if args.workers < 1 or args.servers < 1:
        ap.error("--workers and --servers must be at least 1")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    if args.grad_clip > 0:
        ap.error("--grad-clip is not supported: the servers apply no global clipping")
    return args


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(args):
    """The GPT every process builds identically (same seed): the servers take their parameter
    ranges from it, the workers use it as their replica / module structure."""
    import torch
    import gpt_torch

    torch.manual_seed(args.seed)
    cfg = gpt_torch.GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                              n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    model = gpt_torch.GPT(cfg)
    model.reset_parameters(seed=args.seed)
    return model


def split_by_bytes(named_sizes, servers):
    """Contiguous ranges of the parameter order, one per server, each ending at the parameter
    that crosses the next multiple of total / servers bytes (every server gets at least one
    parameter when there are enough). Returns a list of name lists."""
    total = sum(b for _, b in named_sizes)
    parts = [[] for _ in range(servers)]
    acc = 0
    j = 0
    for i, (name, b) in enumerate(named_sizes):
        left = len(named_sizes) - i
        # Move on when this server has its share, or when the servers still empty need the rest.
        if parts[j] and j + 1 < servers and (acc >= total * (j + 1) / servers
                                             or left <= servers - 1 - j):
            j += 1
        parts[j].append(name)
        acc += b
    return parts


def server_name(j):
    return f"ps{j}"


def worker_name(i):
    return f"worker{i}"


def adamw(torch, named_params, args):
    """torch.optim.AdamW over one server's parameters, weight decay on dim >= 2 only."""
    decay = [p for _, p in named_params if p.dim() >= 2]
    plain = [p for _, p in named_params if p.dim() < 2]
    groups = [g for g in ({"params": decay, "weight_decay": args.weight_decay},
                          {"params": plain, "weight_decay": 0.0}) if g["params"]]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


# ---- batch-update pattern -------------------------------------------------------------------

class BatchUpdateParameterServer:
    """One server's range of the parameters and their AdamW state; one optimizer step each time
    all `workers` gradients of a step have arrived, on their mean (the tutorial's
    BatchUpdateParameterServer with the model replaced by a parameter range)."""

    def __init__(self, torch, named_params, workers, args):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.workers = workers
        self.lock = threading.Lock()
        self.new_future = torch.futures.Future
        self.future_params = self.new_future()
        self.arrived = 0
        self.optimizer = adamw(torch, named_params, args)
        for p in self.params:
            p.grad = torch.zeros_like(p)

    def get_params(self):
        return self.names, [p.detach() for p in self.params]

    @staticmethod
    def _get_params(ps_rref):
        return ps_rref.local_value().get_params()

    @staticmethod
    def update_and_fetch(ps_rref, grads):
        # Decorated below: rpc.functions.async_execution needs torch.distributed.rpc imported.
        self = ps_rref.local_value()
        with self.lock:
            self.arrived += 1
            for p, g in zip(self.params, grads):
                p.grad += g
            # Keep this step's future: the W-th caller replaces self.future_params below.
            fut = self.future_params
            if self.arrived >= self.workers:
                for p in self.params:
                    p.grad /= self.workers
                self.arrived = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result([p.detach() for p in self.params])
                self.future_params = self.new_future()
        return fut


def batch_update_worker(torch, rpc, args, rank, model, server_rrefs, pool):
    params = dict(model.named_parameters())
    shards = []
    for rref in server_rrefs:
        names, values = rpc.rpc_sync(rref.owner(), BatchUpdateParameterServer._get_params,
                                     args=(rref,))
        with torch.no_grad():
            for n, v in zip(names, values):
                params[n].copy_(v)
        shards.append((rref, [params[n] for n in names]))

    T = args.block_size
    times = []
    loss_value = float("nan")
    for step in range(args.warmup + args.steps):
        tokens = pool[step % len(pool)]
        t0 = time.perf_counter()
        x, y = tokens[:, :T], tokens[:, 1:]
        _, loss = model(x, y)
        loss.backward()
        futs = [rpc.rpc_async(rref.owner(), BatchUpdateParameterServer.update_and_fetch,
                              args=(rref, [p.grad for p in ps]))
                for rref, ps in shards]
        for (_, ps), fut in zip(shards, futs):
            with torch.no_grad():
                for p, v in zip(ps, fut.wait()):
                    p.copy_(v)
        for p in model.parameters():
            p.grad = None
        loss_value = loss.item()
        elapsed = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(elapsed)
    return times, loss_value


# ---- dist-optimizer pattern -----------------------------------------------------------------

_SHARD = None  # on a server: [(name, nn.Parameter)] of its range


def _fetch_shard():
    return [p for _, p in _SHARD]


def _shard_rrefs(decay):
    from torch.distributed import rpc
    return [rpc.RRef(p) for _, p in _SHARD if (p.dim() >= 2) == decay]


def _shard_names():
    return [n for n, _ in _SHARD]


def dist_optimizer_worker(torch, rpc, args, model, pool):
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer
    from torch.nn.utils.stateless import functional_call

    servers = [server_name(j) for j in range(args.servers)]
    names = [rpc.rpc_sync(s, _shard_names) for s in servers]
    decay = [r for s in servers for r in rpc.rpc_sync(s, _shard_rrefs, args=(True,))]
    plain = [r for s in servers for r in rpc.rpc_sync(s, _shard_rrefs, args=(False,))]
    opts = [DistributedOptimizer(torch.optim.AdamW, rrefs, lr=args.lr, betas=(0.9, 0.95),
                                 eps=1e-8, weight_decay=wd)
            for rrefs, wd in ((decay, args.weight_decay), (plain, 0.0)) if rrefs]

    T = args.block_size
    times = []
    loss_value = float("nan")
    for step in range(args.warmup + args.steps):
        tokens = pool[step % len(pool)]
        t0 = time.perf_counter()
        x, y = tokens[:, :T], tokens[:, 1:]
        with dist_autograd.context() as cid:
            futs = [rpc.rpc_async(s, _fetch_shard) for s in servers]
            fetched = {}
            for ns, fut in zip(names, futs):
                fetched.update(zip(ns, fut.wait()))
            _, loss = functional_call(model, fetched, (x, y))
            dist_autograd.backward(cid, [loss])
            for opt in opts:
                opt.step(cid)
        loss_value = loss.item()
        elapsed = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(elapsed)
    return times, loss_value


# ---- processes -------------------------------------------------------------------------------

def die_with_parent():
    """A process whose parent is killed outright must not linger (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def run(rank, args, port):
    global _SHARD, _SERVER_RREF
    die_with_parent()
    # OpenBLAS (OpenMP build) and torch's own kernels both follow the OpenMP thread count; it must
    # be set before torch's first parallel region in this process.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    sys.path.insert(0, HERE)
    import torch
    from torch.distributed import rpc

    BatchUpdateParameterServer.update_and_fetch = staticmethod(rpc.functions.async_execution(
        BatchUpdateParameterServer.__dict__["update_and_fetch"].__func__))

    torch.set_num_threads(args.threads)
    W, S = args.workers, args.servers
    is_server = rank >= W
    model = build_model(args)
    named = list(model.named_parameters())
    parts = split_by_bytes([(n, p.numel() * p.element_size()) for n, p in named], S)

    server = None
    if is_server:
        j = rank - W
        own = {n: p for n, p in named if n in set(parts[j])}
        mine = [(n, own[n]) for n in parts[j]]
        if args.pattern == "batch-update":
            server = BatchUpdateParameterServer(torch, mine, W, args)
        else:
            _SHARD = mine
        name = server_name(j)
    else:
        name = worker_name(rank)

    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                           rpc_timeout=args.rpc_timeout)
    rpc.init_rpc(name, rank=rank, world_size=W + S, rpc_backend_options=opts)

    if is_server:
        if server is not None:
            # The workers ask for the RRef of this server object (rpc.RRef of a local value: the
            # server is its owner, as in the tutorial).
            _SERVER_RREF = rpc.RRef(server)
            _SERVER_READY.set()
        # A server only answers RPCs; the graceful shutdown waits for every worker to finish.
        rpc.shutdown(graceful=True, timeout=args.timeout)
        return

    B, T = args.batch_size, args.block_size
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    pool = [torch.randint(0, args.vocab_size, (B, T + 1), generator=gen) for _ in range(8)]
    if args.pattern == "batch-update":
        rrefs = [rpc.rpc_sync(server_name(j), _server_rref) for j in range(S)]
        times, loss_value = batch_update_worker(torch, rpc, args, rank, model, rrefs, pool)
    else:
        times, loss_value = dist_optimizer_worker(torch, rpc, args, model, pool)

    # Every worker's median reaches worker 0 through its own RPC endpoint.
    _MEDIANS[rank] = statistics.median(times)
    if rank != 0:
        rpc.rpc_sync(worker_name(0), _report_median, args=(rank, _MEDIANS[rank]))
    else:
        deadline = time.monotonic() + args.rpc_timeout
        while len(_MEDIANS) < W and time.monotonic() < deadline:
            time.sleep(0.01)
        from train_bench_torch import blas_report
        blas, libs = blas_report(torch)
        median = statistics.median(times)
        sizes = {n: p.numel() * p.element_size() for n, p in named}
        tokens_per_step = W * B * T
        print(json.dumps({
            "side": "torch_rpc_ps",
            "workers": W,
            "servers": S,
            "steps": args.steps,
            "median_step_s": median,
            "steps_per_s": 1.0 / median,
            "blas": blas,
            "pattern": args.pattern,
            "consistency": "sync" if args.pattern == "batch-update" else "async",
            "torch_version": torch.__version__,
            "blas_libs": libs,
            "threads": args.threads,
            "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                       "block_size": T, "batch_size": B, "vocab_size": args.vocab_size},
            "warmup": args.warmup,
            "step_s_min": min(times),
            "step_s_max": max(times),
            "worker_median_step_s": [_MEDIANS.get(r) for r in range(W)],
            "server_bytes": [sum(sizes[n] for n in part) for part in parts],
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens_per_step / median,
            "final_loss": loss_value,
        }), flush=True)
    rpc.shutdown(graceful=True, timeout=args.timeout)


_SERVER_RREF = None
_SERVER_READY = threading.Event()
_MEDIANS = {}


def _server_rref():
    # init_rpc returns on every rank once all have joined: a worker's request can come before
    # this server's main thread has wrapped its object.
    if not _SERVER_READY.wait(60):
        raise RuntimeError("the server object was not ready in 60 s")
    return _SERVER_RREF


def _report_median(rank, median):
    _MEDIANS[rank] = median


def spawn_target(rank, args, port):
    """The process body: a failure becomes one line on stderr and exit status 1."""
    try:
        run(rank, args, port)
    except Exception as e:  # noqa: BLE001
        if os.environ.get("PS_BENCH_TRACEBACK"):
            traceback.print_exc()
        role = f"worker {rank}" if rank < args.workers else f"server {rank - args.workers}"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"{NAME}: {role} failed: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
        os._exit(1)


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import multiprocessing as std_mp
    port = args.port or free_port()
    ctx = std_mp.get_context("spawn")
    procs = [ctx.Process(target=spawn_target, args=(r, args, port), daemon=False)
             for r in range(args.workers + args.servers)]

    def end_all():
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.terminate()
        limit = time.monotonic() + 5
        for p in procs:
            if p.pid is not None:
                p.join(max(0.0, limit - time.monotonic()))
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
                p.join()

    def on_signal(signum, _frame):
        end_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        while True:
            codes = [p.exitcode for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # The process printed its own line; the others would wait on it forever.
                end_all()
                if not any(procs[r].exitcode == 1 for r in failed):
                    print(f"{NAME}: process {failed[0]} ended with status {codes[failed[0]]}",
                          file=sys.stderr)
                sys.exit(1)
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                end_all()
                print(f"{NAME}: did not finish within --timeout {args.timeout:g} s",
                      file=sys.stderr)
                sys.exit(1)
            time.sleep(0.05)
    finally:
        end_all()


if __name__ == "__main__":
    main()
