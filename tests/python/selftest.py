"""Checks of the PyTorch reference tools themselves: the safetensors reader/writer, the GPT's
parameter names, shapes and causality, and parity_reference.py end to end.

Usage: python3 tests/python/selftest.py   (exit status 0 when every check passes)
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import gpt_torch  # noqa: E402
import st  # noqa: E402


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def test_safetensors_round_trip(tmp):
    path = os.path.join(tmp, "a.safetensors")
    tensors = {
        "f32": torch.randn(3, 4),
        "i32": torch.arange(-5, 5, dtype=torch.int32).reshape(2, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "f16": torch.randn(2, 2).to(torch.float16),
        "i64": torch.tensor([1 << 40, -3]),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5),
    }
    st.save(path, tensors, metadata={"n_head": 4})
    back, meta = st.load(path)
    check(list(back) == list(tensors), f"names/order differ: {list(back)}")
    for k, t in tensors.items():
        check(back[k].dtype == t.dtype and back[k].shape == t.shape, f"{k}: dtype/shape")
        check(torch.equal(back[k], t), f"{k}: values differ")
    check(meta == {"n_head": "4"}, f"metadata {meta}")
    # The layout itself: length prefix, aligned JSON header, offsets into the data.
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    check(n % 8 == 0, "header not padded to 8 bytes")
    header = json.loads(blob[8:8 + n])
    begin, end = header["f32"]["data_offsets"]
    check(header["f32"]["dtype"] == "F32" and header["f32"]["shape"] == [3, 4], "f32 entry")
    raw = blob[8 + n + begin:8 + n + end]
    check(struct.unpack("<12f", raw) == tuple(tensors["f32"].reshape(-1).tolist()), "f32 bytes")
    # Malformed files are refused.
    for bad in (blob[:4], struct.pack("<Q", 1 << 40) + blob[8:], blob[:-1]):
        p = os.path.join(tmp, "bad.safetensors")
        open(p, "wb").write(bad)
        try:
            st.load(p)
        except ValueError:
            continue
        raise AssertionError("a malformed file was accepted")


def test_gpt_names_and_shapes():
    cfg = gpt_torch.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=6)
    model = gpt_torch.GPT(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    V, T, C = 11, 8, 6
    expect = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,),
              "ln_f.bias": (C,)}
    for i in range(2):
        p = f"h.{i}."
        expect.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,),
        })
    check(shapes == expect, f"parameters differ: {sorted(set(shapes) ^ set(expect))}")
    check(list(shapes)[:2] == ["wte.weight", "wpe.weight"], "parameter order")

    # Causal: changing the last token leaves the logits of earlier positions unchanged.
    idx = torch.randint(0, V, (2, T))
    logits, _ = model(idx)
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % V
    logits2, _ = model(idx2)
    check(torch.equal(logits[:, :-1], logits2[:, :-1]), "attention is not causal")
    check(not torch.equal(logits[:, -1], logits2[:, -1]), "last position ignores its token")
    # Near-uniform predictions at initialisation; ignored targets do not count.
    targets = torch.randint(0, V, (2, T))
    _, loss = model(idx, targets)
    check(abs(loss.item() - math.log(V)) < 0.1, f"initial loss {loss.item()} far from ln V")
    masked = targets.clone()
    masked[:, T // 2:] = -1
    _, half = model(idx, masked)
    logits_flat = logits[:, :T // 2].reshape(-1, V)
    manual = torch.nn.functional.cross_entropy(logits_flat, targets[:, :T // 2].reshape(-1))
    check(abs(half.item() - manual.item()) < 1e-6, "ignore_index=-1 not honoured")


def run_reference(args):
    out = subprocess.run([sys.executable, os.path.join(HERE, "parity_reference.py")] + args,
                         capture_output=True, text=True)
    check(out.returncode == 0, f"parity_reference failed: {out.stderr}")
    return json.loads(out.stdout)


def test_parity_reference(tmp):
    cfg = gpt_torch.GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
    model = gpt_torch.GPT(cfg)
    model.reset_parameters(seed=0)
    weights = os.path.join(tmp, "w.safetensors")
    st.save(weights, {k: v.detach() for k, v in model.named_parameters()},
            metadata={"n_head": "2"})
    g = torch.Generator().manual_seed(1)
    one = torch.randint(0, 13, (1, 2, 9), generator=g, dtype=torch.int32)
    seq = one.repeat(6, 1, 1)  # the same batch six times: the loss must fall
    batches = os.path.join(tmp, "b.safetensors")
    st.save(batches, {"inputs": seq[:, :, :8].contiguous(), "targets": seq[:, :, 1:].contiguous()})
    final = os.path.join(tmp, "final.safetensors")
    args = ["--weights", weights, "--batches", batches, "--lr", "1e-2", "--weight-decay", "0.1",
            "--grad-clip", "1.0", "--warmup", "2", "--decay", "cosine", "--min-lr", "1e-3",
            "--out-weights", final]
    a = run_reference(args)
    b = run_reference(args)
    check(a == b, "two runs differ")
    check(a["steps"] == 6 and len(a["losses"]) == 6, "step count")
    check(all(math.isfinite(x) for x in a["losses"]), "non-finite loss")
    check(a["losses"][-1] < a["losses"][0] - 0.1, f"loss did not fall: {a['losses']}")
    check(abs(a["lrs"][0] - 5e-3) < 1e-12 and abs(a["lrs"][1] - 1e-2) < 1e-12, "warm-up lrs")
    check(abs(a["losses"][0] - math.log(13)) < 0.1, "first loss is not the initial model's")
    back, meta = st.load(final)
    check(meta.get("n_head") == "2", "final weights metadata")
    for k, v in back.items():
        check(abs(float(v.double().sum()) - a["param_sums"][k]) < 1e-9, f"{k}: param sum")
    check(not torch.equal(back["wte.weight"], model.wte.weight.detach()), "weights unchanged")


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        test_safetensors_round_trip(tmp)
        test_gpt_names_and_shapes()
        test_parity_reference(tmp)
    print("selftest: all checks passed")


if __name__ == "__main__":
    main()
