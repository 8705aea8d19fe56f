"""The GPT-2 style model in PyTorch with meshtrain's parameter names and layouts, the reference
for the parity test and the training benchmark.

Dimensions: B batch, T time, C channels (n_embd), V vocabulary, NH heads, HS = C / NH.
Parameters (nn.Linear weights are [out_features, in_features]):
  wte.weight [V, C], wpe.weight [block_size, C],
  h.{i}.ln_1.{weight,bias} [C], h.{i}.attn.c_attn.weight [3C, C] / .bias [3C],
  h.{i}.attn.c_proj.weight [C, C] / .bias [C], h.{i}.ln_2.{weight,bias} [C],
  h.{i}.mlp.c_fc.weight [4C, C] / .bias [4C], h.{i}.mlp.c_proj.weight [C, 4C] / .bias [C],
  ln_f.{weight,bias} [C]; the output projection is tied to wte (no tensor of its own).
No dropout; LayerNorm eps 1e-5; GELU with the tanh approximation.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 257
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    # "naive" materialises the T x T scores (as meshtrain's CPU kernel does; the parity test's
    # reference); "sdpa" calls F.scaled_dot_product_attention, which picks a flash kernel on GPUs.
    attention: str = "naive"


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = cfg.n_head
        self.sdpa = cfg.attention == "sdpa"
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH = self.n_head
        HS = C // NH
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, NH, HS).transpose(1, 2)  # [B, NH, T, HS]
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.reset_parameters()

    def reset_parameters(self, seed=None):
        """GPT-2 initialisation: N(0, 0.02) weights and embeddings, zero biases, residual
        projections scaled by 1/sqrt(2 * n_layer). The parity test overwrites all of it."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                std = 0.02
                if name.endswith("c_proj.weight"):
                    std /= math.sqrt(2 * self.cfg.n_layer)
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        assert T <= self.cfg.block_size, f"sequence length {T} > block size {self.cfg.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output projection
        if targets is None:
            return logits, None
        V = logits.size(-1)
        loss = F.cross_entropy(logits.view(-1, V), targets.reshape(-1).long(), ignore_index=-1)
        return logits, loss


def config_from_weights(tensors, n_head):
    """Infers vocab, block size, width and depth from a state dict; n_head must be given."""
    V, C = tensors["wte.weight"].shape
    T = tensors["wpe.weight"].shape[0]
    layers = {int(k.split(".")[1]) for k in tensors if k.startswith("h.")}
    n_layer = max(layers) + 1 if layers else 0
    if layers != set(range(n_layer)):
        raise ValueError(f"layer indices are not contiguous: {sorted(layers)}")
    return GPTConfig(vocab_size=V, block_size=T, n_layer=n_layer, n_head=n_head, n_embd=C)


def load_weights(model, tensors):
    """Copies a {name: tensor} dict into the model; names and shapes must match exactly."""
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, p in own.items():
            t = tensors[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, model has {tuple(p.shape)}")
            p.copy_(t.to(p.dtype))


def decay_groups(model, weight_decay):
    """nanoGPT's rule: weight decay on parameters with dim >= 2 only."""
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def clip_grad_norm(params, max_norm):
    """Global gradient clipping as meshtrain does it: the norm summed in float64, parameter by
    parameter; gradients scaled by max_norm / (norm + 1e-6) when that is < 1. A non-finite norm
    leaves the gradients alone. Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    if math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total


def lr_at(step, lr, min_lr, warmup, total, decay):
    """meshtrain's LrSchedule: linear warm-up lr * (step + 1) / warmup, then constant, cosine
    or linear decay to min_lr at `total` steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if decay == "constant":
        return lr
    if step >= total:
        return min_lr
    ratio = (step - warmup) / (total - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if decay == "cosine" else 1.0 - ratio
    return min_lr + coeff * (lr - min_lr)
