#!/usr/bin/env bash
# all_to_all_v_compare.sh: meshtrain's all_to_all_v next to PyTorch's gloo all_to_all_single with
# the same uneven, fixed splits (input_split_sizes / output_split_sizes), in one invocation, on one
# host, CPU only: meshtrain shm (what "auto" picks on one host) and tcp over loopback
# (comm_bench --op all_to_all_v), and PyTorch gloo (bench/python/all_to_all_v_bench_torch.py,
# with the system interpreter that has python3-torch). Runs are interleaved (every peer once per
# round, rounds repeated) so that a burst of load on a shared machine hits all of them alike;
# each figure is the median of the rounds. Every run checks its result element by element.
#
#   bench/all_to_all_v_compare.sh [BUILD_DIR]
#       (env: WORLD=2 ROUNDS=5 ITERS=20 WARMUP=5 MIN=1048576 MAX=16777216 PY=/usr/bin/python3)
#
# Prints a table and one JSON line per size:
#   {"op": "all_to_all_v", "ranks", "bytes" (sent per rank, own block included), "mt_shm_us",
#    "mt_tcp_us", "gloo_us" (medians of the rounds), "shm_vs_gloo", "tcp_vs_gloo" (gloo time over
#    meshtrain time: above 1 is meshtrain faster), "rounds", "ok"}
# and the BLAS library each side loaded (neither calls it for this operation; recorded so that
# runs compare like for like).
set -euo pipefail

BUILD=${1:-build}
WORLD=${WORLD:-2}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN=${MIN:-1048576}
MAX=${MAX:-16777216}
PY=${PY:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
RESULTS="$OUT/results.jsonl"
touch "$RESULTS"
export OMP_NUM_THREADS=1

[[ -x "$BUILD/comm_bench" ]] || { echo "all_to_all_v_compare: $BUILD/comm_bench not built" >&2; exit 1; }
"$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  { echo "all_to_all_v_compare: $PY has no torch with gloo (python3-torch)" >&2; exit 1; }

common=(--min-bytes "$MIN" --max-bytes "$MAX" --iters "$ITERS" --warmup "$WARMUP")

# Runs one peer and appends its JSON lines, tagged with its label, to the results.
run_peer() {
  local label=$1; shift
  local log="$OUT/log"
  if ! "$@" >"$log" 2>&1; then
    echo "all_to_all_v_compare: $label failed:" >&2
    tail -5 "$log" >&2
    return 0
  fi
  sed -n 's/^# comm_bench .* blas=\(.*\)$/{"mt_blas":"\1"}/p' "$log" >>"$RESULTS"
  grep '^{' "$log" | sed "s/^{/{\"peer\":\"$label\",/" >>"$RESULTS" || true
}

echo "all_to_all_v_compare: $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $WORLD ranks, $ROUNDS rounds" >&2
port=29541
for round in $(seq "$ROUNDS"); do
  run_peer mt-shm "$BUILD/comm_bench" --op all_to_all_v --backend shm --world-size "$WORLD" "${common[@]}"
  run_peer gloo "$PY" "$HERE/python/all_to_all_v_bench_torch.py" --world-size "$WORLD" --port "$port" "${common[@]}"
  run_peer mt-tcp "$BUILD/comm_bench" --op all_to_all_v --backend tcp --world-size "$WORLD" "${common[@]}"
  port=$((port + 1))  # a fresh port per round: the last round's may linger in TIME_WAIT
done

"$PY" - "$RESULTS" "$WORLD" <<'PY'
import json, statistics, sys
runs, mt_blas, torch_info, bad = {}, set(), set(), set()
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "mt_blas" in j:
        mt_blas.add(j["mt_blas"]); continue
    if "torch_version" in j:
        torch_info.add(f"PyTorch {j['torch_version']}, BLAS {j['blas']}")
    if not j.get("ok", False):
        bad.add((j["peer"], j["bytes"]))
    runs.setdefault((j["bytes"], j["peer"]), []).append(j["time_us"])
world = int(sys.argv[2])
sizes = sorted({k[0] for k in runs})
med = {k: statistics.median(v) for k, v in runs.items()}
print(f"meshtrain BLAS: {'; '.join(sorted(mt_blas)) or '?'}")
print(f"{'; '.join(sorted(torch_info)) or 'PyTorch: ?'}")
print(f"\nall_to_all_v f32, {world} ranks, uneven fixed splits: median time per call (us)")
print(f"{'bytes/rank':>10} {'mt-shm':>9} {'mt-tcp':>9} {'gloo':>9} {'shm/gloo':>9} {'tcp/gloo':>9}")
lines = []
for b in sizes:
    shm, tcp, gloo = (med.get((b, p)) for p in ("mt-shm", "mt-tcp", "gloo"))
    r = lambda m: round(gloo / m, 3) if m and gloo else None
    f = lambda v: f"{v:9.1f}" if v else "        -"
    g = lambda v: f"{v:9.2f}" if v else "        -"
    print(f"{b:>10} {f(shm)} {f(tcp)} {f(gloo)} {g(r(shm))} {g(r(tcp))}")
    lines.append({"op": "all_to_all_v", "ranks": world, "bytes": b, "mt_shm_us": shm,
                  "mt_tcp_us": tcp, "gloo_us": gloo, "shm_vs_gloo": r(shm), "tcp_vs_gloo": r(tcp),
                  "rounds": len(runs.get((b, "gloo"), [])),
                  "ok": not any(k[1] == b for k in bad)})
print()
for l in lines:
    print(json.dumps(l))
for peer, b in sorted(bad):
    print(f"WARNING: {peer} gave a wrong result at {b} bytes")
PY
