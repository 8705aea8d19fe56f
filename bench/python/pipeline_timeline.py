#!/usr/bin/env python3
"""Draws one training step of a pipeline from the ranks' traces (train.trace) as text.

Usage: pipeline_timeline.py [--step N] [--width W] trace_0.json trace_1.json ...
(one trace per stage, in stage order). Each row is a stage; digits are forwards of that
micro-batch, letters backwards (a = micro-batch 0), '.' is time the stage did neither. The
window runs from the first forward on any stage to the last backward on any stage of the step,
on the trace clock (all ranks of one host share it).
"""
import argparse
import json
import string


def spans(path):
    with open(path) as f:
        d = json.load(f)
    events = d["traceEvents"] if isinstance(d, dict) else d
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "step" and e.get("ph") == "X")
    work = [e for e in events if e.get("cat") == "pipeline" and e.get("name") in ("forward", "backward")]
    return steps, work


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=int, default=-1, help="which step (index into each rank's step spans; default: the last)")
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    per_stage = [spans(p) for p in a.traces]
    rows = []
    for steps, work in per_stage:
        s0, s1 = steps[a.step]  # this stage's span of that step
        rows.append([e for e in work if s0 <= e["ts"] <= s1])
    t0 = min(e["ts"] for r in rows for e in r)
    t1 = max(e["ts"] + e["dur"] for r in rows for e in r)
    col = (t1 - t0) / a.width
    letters = string.ascii_lowercase
    print(f"{len(rows)} stages, {(t1 - t0) / 1000:.1f} ms from the first forward to the last backward; "
          f"one character = {col / 1000:.2f} ms")
    for i, r in enumerate(rows):
        line = ["."] * a.width
        busy = 0
        for e in r:
            m = int(e["args"]["micro_batch"])
            ch = str(m % 10) if e["name"] == "forward" else letters[m % 26]
            lo = int((e["ts"] - t0) / col)
            hi = max(lo + 1, int((e["ts"] + e["dur"] - t0) / col))
            lo = min(lo, a.width - 1)
            while lo < a.width - 1 and line[lo] != ".":  # a short span never hides another
                lo += 1
            for c in range(lo, min(max(hi, lo + 1), a.width)):
                if line[c] == ".":
                    line[c] = ch
            busy += e["dur"]
        print(f"stage {i} |{''.join(line)}| idle {100 * (1 - busy / (t1 - t0)):.0f}%")


if __name__ == "__main__":
    main()
