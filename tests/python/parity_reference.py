"""Trains the PyTorch GPT (gpt_torch.py) from given initial weights on given batches and prints
the per-step losses: the reference side of meshtrain's training parity test.

Command line (run with the system interpreter that has python3-torch):
  python3 tests/python/parity_reference.py
      --weights W.safetensors       initial parameters, F32, meshtrain names (gpt_torch.py)
      --batches B.safetensors       "inputs" and "targets", I32 [S, B, T]; target -1 is ignored
      [--n-head NH]                 heads; default: the weights file's metadata "n_head"
      [--steps N]                   steps to train (default S, all batches)
      [--lr 1e-3] [--beta1 0.9] [--beta2 0.999] [--eps 1e-8]
      [--weight-decay 0.0]          AdamW decay, applied to parameters with dim >= 2 only
      [--grad-clip 0.0]             global norm clip; 0 disables
      [--decay constant|cosine|linear] [--warmup 0] [--min-lr 0.0] [--total-steps N]
                                    learning-rate schedule, as meshtrain's LrSchedule
      [--threads 1]
      [--out-weights F.safetensors] write the final parameters
Prints one JSON object on stdout:
  {"torch_version": str, "steps": N, "losses": [float] (loss of each step's forward, before
   its update), "grad_norms": [float] (before clipping), "lrs": [float],
   "param_checksum": float (sum over parameters of sum |p|, in float64, after the last step),
   "param_sums": {name: float} (sum of p per parameter, float64)}
Exit status 2 with a message on stderr for bad input.

Everything is float32 on the CPU, single-threaded by default and deterministic; AdamW is
torch.optim.AdamW's single-tensor path (foreach=False). Clipping computes the norm in float64
like meshtrain (torch.nn.utils.clip_grad_norm_ sums in float32; the difference is ~1e-7).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import gpt_torch  # noqa: E402
import st  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=0.0)
    ap.add_argument("--decay", choices=["constant", "cosine", "linear"], default="constant")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--total-steps", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out-weights")
    return ap.parse_args()


def fail(msg):
    print(f"parity_reference: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    try:
        weights, meta = st.load(args.weights)
        batches, _ = st.load(args.batches)
    except (OSError, ValueError, KeyError) as e:
        fail(str(e))
    n_head = args.n_head if args.n_head is not None else int(meta.get("n_head", 0))
    if n_head <= 0:
        fail("--n-head not given and the weights file has no n_head metadata")
    if "inputs" not in batches or "targets" not in batches:
        fail("batches file needs tensors 'inputs' and 'targets'")
    inputs, targets = batches["inputs"].long(), batches["targets"].long()
    if inputs.dim() != 3 or inputs.shape != targets.shape:
        fail(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must be [S, B, T]")
    steps = args.steps if args.steps is not None else inputs.shape[0]
    if not 0 < steps <= inputs.shape[0]:
        fail(f"--steps {steps} out of range (1..{inputs.shape[0]})")

    try:
        cfg = gpt_torch.config_from_weights(weights, n_head)
        model = gpt_torch.GPT(cfg)
        gpt_torch.load_weights(model, weights)
    except (ValueError, AssertionError, KeyError) as e:
        fail(str(e))
    if inputs.shape[2] > cfg.block_size:
        fail(f"sequence length {inputs.shape[2]} > block size {cfg.block_size}")
    if int(inputs.min()) < 0 or int(inputs.max()) >= cfg.vocab_size:
        fail("input token out of the vocabulary")

    opt = torch.optim.AdamW(gpt_torch.decay_groups(model, args.weight_decay), lr=args.lr,
                            betas=(args.beta1, args.beta2), eps=args.eps, foreach=False)
    total = args.total_steps if args.total_steps is not None else steps
    params = list(model.parameters())
    losses, norms, lrs = [], [], []
    for s in range(steps):
        lr = gpt_torch.lr_at(s, args.lr, args.min_lr, args.warmup, total, args.decay)
        for g in opt.param_groups:
            g["lr"] = lr
        _, loss = model(inputs[s], targets[s])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            norm = gpt_torch.clip_grad_norm(params, args.grad_clip)
        else:
            norm = gpt_torch.clip_grad_norm(params, float("inf"))
        opt.step()
        losses.append(loss.item())
        norms.append(norm)
        lrs.append(lr)

    named = dict(model.named_parameters())
    if args.out_weights:
        st.save(args.out_weights, {k: v.detach() for k, v in named.items()},
                metadata={"n_head": str(n_head)})
    print(json.dumps({
        "torch_version": torch.__version__,
        "steps": steps,
        "losses": losses,
        "grad_norms": norms,
        "lrs": lrs,
        "param_checksum": sum(float(p.detach().double().abs().sum()) for p in named.values()),
        "param_sums": {k: float(v.detach().double().sum()) for k, v in named.items()},
    }))


if __name__ == "__main__":
    main()
