#!/usr/bin/env python3
"""The planner against measurement: bench/plan_validate.sh runs this (see its --help).

For each layout: `meshtrain plan --calibrate` with the layout's rank count (so the calibration
and the run see the same machine and the same load), `meshtrain plan --predict` for the run's
config on that calibration, then the run itself under meshrun while every worker's memory is
sampled. One JSON line per layout, then a Markdown table of predicted against measured.

Measured memory of a rank: the peak over samples (every 20 ms) of its anonymous and file-backed
resident memory plus its proportional share of the shared memory it maps (RssAnon + RssFile from
/proc/PID/status, Pss_Shmem from /proc/PID/smaps_rollup). The shm backend's buckets are mapped by
every rank of the host, so a plain RSS would count each bucket once per rank although the host
holds it once; the raw peak RSS (VmHWM) is reported beside it. The table takes the rank with the
most, as the planner predicts the rank with the most. smaps_rollup is read only every
ROLLUP_INTERVAL_S per rank: the kernel walks the rank's page tables to answer it, and at every
20 ms sample that took about 45% of a core away from the run (ddp-2 on 2 cores: 0.85 s per step
against 0.65 s unobserved); status is cheap, and the shared part's share it needs is steady.
Measured step time: the median step_s of rank 0's metrics.jsonl after the warm-up steps.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

# name, ranks, zero stage, (n_layer, n_embd, n_head, block_size, batch_size), extra --set keys
LAYOUTS = [
    ("ddp-2", 2, 0, (6, 384, 6, 256, 4), []),
    ("zero1-2", 2, 1, (6, 384, 6, 256, 4), []),
    ("zero2-2", 2, 2, (6, 384, 6, 256, 4), []),
    ("zero3-2", 2, 3, (6, 384, 6, 256, 4), []),
    ("ddp-4", 4, 0, (4, 256, 8, 128, 4), []),
    ("zero1-4-accum2", 4, 1, (4, 256, 8, 128, 4), ["train.grad_accum_steps=2"]),
    ("zero2-4-ckpt", 4, 2, (4, 256, 8, 128, 4), ["model.activation_checkpointing=all"]),
    ("zero3-4", 4, 3, (4, 256, 8, 128, 4), []),
    # Pipeline and tensor parallelism: 4 micro-batches of 1 sequence through 2 stages (1F1B),
    # each block's matrices split over 2 ranks, and 2 pipelines of 2 stages side by side.
    ("pp-2", 2, 0, (6, 384, 6, 256, 4), ["parallel.pp=2", "parallel.micro_batches=4"]),
    ("tp-2", 2, 0, (6, 384, 6, 256, 4), ["parallel.tp=2"]),
    ("pp2-dp2", 4, 0, (4, 256, 8, 128, 4), ["parallel.pp=2", "parallel.micro_batches=4"]),
]


def die(msg):
    print(f"plan_validate: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        die(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def workers(root):
    """The meshtrain processes under the launcher `root` (any depth)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for c in children(pid):
            try:
                with open(f"/proc/{c}/comm") as f:
                    if f.read().strip() == "meshtrain":
                        found.append(c)
            except OSError:
                continue
            todo.append(c)
    return found


# Seconds between two reads of a rank's smaps_rollup (see the module's docstring).
ROLLUP_INTERVAL_S = 1.0


def sample(pid, with_rollup):
    """(private bytes, Pss_Shmem or None, RssShmem, VmHWM) of a process, or None once it is gone;
    Pss_Shmem only when with_rollup."""
    rollup = None
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        if with_rollup:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                rollup = f.read()
    except OSError:
        return None

    def kib(text, key):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        return int(m.group(1)) * 1024 if m else 0

    return (kib(status, "RssAnon") + kib(status, "RssFile"),
            kib(rollup, "Pss_Shmem") if rollup is not None else None, kib(status, "RssShmem"),
            kib(status, "VmHWM"))


def measure(cmd, log_path, ranks, deadline_s):
    """Runs cmd (meshrun ...), sampling its workers; per pid (peak own bytes, VmHWM).

    A rank's own memory in a sample is its private resident memory plus its resident shared
    memory times its share of it; the share (Pss_Shmem / RssShmem) is the median over the samples
    taken while every rank was alive, because a rank that leaves first unmaps its view and the
    survivors' proportional share would then grow."""
    rows, hwm, last_rollup, pids = {}, {}, {}, []
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        try:
            while p.poll() is None:
                if time.monotonic() - t0 > deadline_s:
                    die(f"{' '.join(cmd)} ran past {deadline_s} s (log {log_path})")
                now = time.monotonic()
                samples = {}
                # The ranks once all have started: walking every thread's children each time
                # costs the run CPU time too.
                if len(pids) < ranks:
                    pids = workers(p.pid)
                for w in pids:
                    due = now - last_rollup.get(w, -ROLLUP_INTERVAL_S) >= ROLLUP_INTERVAL_S
                    samples[w] = sample(w, due)
                    if due:
                        last_rollup[w] = now
                samples = {w: s for w, s in samples.items() if s is not None}
                for w, s in samples.items():
                    rows.setdefault(w, []).append((s, len(samples) == ranks))
                    hwm[w] = max(hwm.get(w, 0), s[3])
                try:  # the next sample in 20 ms, or at once when the run ends
                    p.wait(timeout=0.02)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    if p.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        die(f"the run failed ({p.returncode}); last lines of its log:\n{tail}")
    if len(rows) != ranks:
        die(f"sampled {len(rows)} worker(s), expected {ranks} (log {log_path})")
    out = {}
    for w, samples in rows.items():
        shares = [s[1] / s[2] for s, all_alive in samples
                  if all_alive and s[1] is not None and s[2] > 0]
        share = statistics.median(shares) if shares else 1.0
        out[w] = (max(s[0] + share * s[2] for s, _ in samples), hwm[w])
    return out


def step_time(metrics, warmup):
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    rows = [r for r in rows if "step_s" in r and "event" not in r and r.get("step", 0) > warmup]
    if not rows:
        die(f"no timed steps after the warm-up in {metrics}")
    return statistics.median(r["step_s"] for r in rows), len(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default="data/fortunes")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default="", help="space-separated subset of the names")
    ap.add_argument("--docs", default="", help="rewrite the table between the markers here")
    ap.add_argument("--command", default="", help="the command line the docs name")
    a = ap.parse_args()
    names = [l[0] for l in LAYOUTS]
    chosen = a.layouts.split() if a.layouts else names
    for n in chosen:
        if n not in names:
            die(f"unknown layout {n}; the layouts are: {' '.join(names)}")
    layouts = [l for l in LAYOUTS if l[0] in chosen]
    records = []
    with tempfile.TemporaryDirectory(prefix="plan_validate.") as tmp:
        for rnd in range(a.rounds):
            # The order rotates by one layout per round, so that none always runs first or last.
            k = rnd % len(layouts)
            for layout in layouts[k:] + layouts[:k]:
                r = run_layout(a, tmp, rnd, layout)
                print(json.dumps(r), flush=True)
                records.append(r)
    results = summarize(records, [l[0] for l in layouts])
    table = markdown(results, a.rounds)
    print(table)
    if a.docs:
        rewrite_docs(a.docs, table, a.command)


def summarize(records, order):
    """Per layout: the medians over rounds, and the range of the per-round errors."""
    out = []
    for name in order:
        rs = [r for r in records if r["layout"] == name]
        m = dict(rs[0])
        for key in ("predicted_mib", "measured_mib", "peak_rss_mib", "predicted_step_s",
                    "measured_step_s"):
            m[key] = statistics.median(r[key] for r in rs)
        m["memory_error"] = m["predicted_mib"] / m["measured_mib"] - 1
        m["time_error"] = m["predicted_step_s"] / m["measured_step_s"] - 1
        m["time_error_range"] = (min(r["time_error"] for r in rs), max(r["time_error"] for r in rs))
        m["rounds"] = len(rs)
        out.append(m)
    return out


def run_layout(a, tmp, rnd, layout):
    """Calibrates, predicts and runs one layout; its JSON record."""
    name, ranks, zero, (L, C, H, T, B), extra = layout
    meshtrain = os.path.join(a.build, "meshtrain")
    meshrun = os.path.join(a.build, "meshrun")
    d = os.path.join(tmp, f"{name}.{rnd}")
    os.makedirs(d)
    cal = os.path.join(d, "cluster.toml")
    cal_out = run([meshtrain, "plan", "--calibrate", "--ranks", str(ranks),
                   "--calibrate-out", cal])
    cfg = os.path.join(d, "run.toml")
    sets = [f"model.n_layer={L}", f"model.n_embd={C}", f"model.n_head={H}",
            f"model.block_size={T}", "model.vocab_size=257", f"data.batch_size={B}",
            f"data.dir={a.data}", "data.val_batches=1", "train.threads=1",
            f"train.steps={a.steps}", "train.eval_interval=0", "train.sample_tokens=0",
            "train.save_weights=false", f"train.out_dir={d}/run", "train.log_interval=1",
            "ckpt.interval=0", "ckpt.resume=false", "dist.backend=shm",
            f"parallel.zero_stage={zero}"] + extra
    # The run's config as a file, for the planner to read as the trainer does.
    with open(cfg, "w") as f:
        section = {}
        for s in sets:
            k, v = s.split("=", 1)
            sec, key = k.split(".")
            section.setdefault(sec, []).append((key, v))
        for sec, kv in section.items():
            f.write(f"[{sec}]\n")
            for key, v in kv:
                if re.fullmatch(r"-?[0-9.e+-]+|true|false", v):
                    f.write(f"{key} = {v}\n")
                else:
                    f.write(f'{key} = "{v}"\n')
    pred_out = run([meshtrain, "plan", "--model-config", cfg, "--cluster", cal,
                    "--predict"])
    pred = json.loads([l for l in pred_out.splitlines() if l.startswith("{")][-1])
    if pred["ranks"] != ranks:
        die(f"{name}: predicted for {pred['ranks']} ranks, not {ranks}")
    cmd = [meshrun, "--nproc-per-node", str(ranks), "--", meshtrain, "train",
           "--config", cfg]
    peaks = measure(cmd, os.path.join(d, "run.log"), ranks, deadline_s=600)
    with open(os.path.join(d, "run.log")) as f:
        log = f.read()
    want = f"ZeRO-{zero} " if zero else None
    start = re.search(r"meshtrain: GPT[^\n]*", log)
    if start is None or (want and want not in start.group(0)) or (
            not want and "ZeRO-" in start.group(0)):
        die(f"{name}: the run did not train with ZeRO stage {zero}: "
            f"{start.group(0) if start else 'no start line'}")
    # A pipeline or tensor-parallel layout must have trained as one (the engine's description).
    for key, text in (("parallel.pp=", "pipeline "), ("parallel.tp=", "tensor parallelism over ")):
        if any(e.startswith(key) for e in extra) and text not in start.group(0):
            die(f"{name}: the run did not train with {key[:-1]}: {start.group(0)}")
    step_s, steps = step_time(os.path.join(d, "run", "metrics.jsonl"), a.warmup)
    own = max(v[0] for v in peaks.values())
    hwm = max(v[1] for v in peaks.values())
    gemm = re.search(r"([0-9.]+) GFLOP/s per rank", cal_out)
    ew = re.search(r"elementwise_gbps ([0-9.e+-]+)", cal_out)
    r = {"layout": name, "round": rnd, "planner_layout": pred["layout"], "ranks": ranks,
         "zero_stage": zero, "model": {"n_layer": L, "n_embd": C, "n_head": H,
                                       "block_size": T, "batch_size": B},
         "extra": extra, "calibrated_gflops_per_rank": float(gemm.group(1)),
         "predicted_mib": pred["memory_bytes"] / 2**20,
         "predicted_process_mib": pred["process_bytes"] / 2**20,
         "measured_mib": own / 2**20, "peak_rss_mib": hwm / 2**20,
         "memory_error": pred["memory_bytes"] / own - 1,
         "predicted_step_s": pred["step_s"], "measured_step_s": step_s,
         "predicted_terms_s": {k: pred[k] for k in ("gemm_s", "elementwise_s", "optimizer_s",
                                                     "bubble_s", "tp_comm_s", "pp_comm_s",
                                                     "dp_exposed_s") if k in pred},
         "calibrated_elementwise_gbps": float(ew.group(1)) if ew else None,
         "timed_steps": steps, "time_error": pred["step_s"] / step_s - 1}
    return r


def markdown(results, rounds):
    out = [f"Medians over {rounds} round(s); the step-time error's range over the rounds in "
           "brackets.", "",
           "| layout | ranks | model (L, C, T, B) | predicted MiB | measured MiB | error "
           "| peak RSS MiB | predicted step s | measured step s | error |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["model"]
        out.append(
            f"| {r['layout']} ({r['planner_layout']}) | {r['ranks']} | {m['n_layer']}, "
            f"{m['n_embd']}, {m['block_size']}, {m['batch_size']} | {r['predicted_mib']:.0f} | "
            f"{r['measured_mib']:.0f} | {100 * r['memory_error']:+.1f}% | "
            f"{r['peak_rss_mib']:.0f} | {r['predicted_step_s']:.3f} | "
            f"{r['measured_step_s']:.3f} | {100 * r['time_error']:+.0f}% "
            f"[{100 * r['time_error_range'][0]:+.0f}, {100 * r['time_error_range'][1]:+.0f}] |")
    if results:
        mem = [abs(r["memory_error"]) for r in results]
        tim = [abs(r["time_error"]) for r in results]
        out.append("")
        out.append(f"Largest memory error {100 * max(mem):.1f}% (median {100 * statistics.median(mem):.1f}%); "
                   f"largest step-time error {100 * max(tim):.0f}% (median {100 * statistics.median(tim):.0f}%).")
    return "\n".join(out) + "\n"


BEGIN = "<!-- plan_validate: begin (bench/plan_validate.sh --docs rewrites this block) -->"
END = "<!-- plan_validate: end -->"


def rewrite_docs(path, table, command):
    text = open(path).read()
    if BEGIN not in text or END not in text:
        die(f"{path} has no block between '{BEGIN}' and '{END}'")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = f"{BEGIN}\n```\n$ {command}\n```\n\n{table}{END}"
    with open(path + ".tmp", "w") as f:
        f.write(head + block + tail)
    os.replace(path + ".tmp", path)
    print(f"plan_validate: rewrote the table in {path}")


if __name__ == "__main__":
    main()
