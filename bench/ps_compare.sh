#!/usr/bin/env bash
# Parameter server: meshtrain's (parallel.mode = "parameter_server", consistency "sync") against
# PyTorch's RPC parameter server on the same host, the same GPT and the same work per step.
#
# Usage: bench/ps_compare.sh [BUILD] [--workers W] [--servers S] [--steps N] [--warmup K]
#                            [--rounds R] [--sides "meshtrain torch"] [--blas-core NAME|native]
#                            [--help]
# Defaults: BUILD build, 2 workers, 1 server, 40 steps of which the first 5 are not timed,
# 3 rounds, both sides. Builds nothing: BUILD must hold meshrun and meshtrain already.
# Each round runs, one after the other (which side goes first alternates from round to round):
#   meshtrain  meshrun --nproc-per-node W+S --ps-servers S -- meshtrain train on
#              configs/demo.toml (4 layers, n_embd 128, 4 heads, block 128, batch 8 per worker,
#              vocab 257, AdamW lr 2e-3), 1 thread per rank, parallel.ps.consistency=sync, on the
#              demo data: the last S ranks hold the parameters and the AdamW state, the first W
#              push gradients and pull parameters every step. Its figure is the median step_s of
#              rank 0's metrics.jsonl over the steps after the first K.
#   torch      bench/python/ps_bench_torch.py: the same GPT, W worker and S server processes of
#              1 thread joined by torch.distributed.rpc (TensorPipe, rendezvous over TCP on
#              127.0.0.1, TensorPipe's default transports), the servers holding the
#              parameters split by bytes and their AdamW state; every step averages the
#              gradients of all W workers and runs one AdamW step (the batch-update
#              parameter server of PyTorch's RPC tutorials); median step time of worker 0 over
#              the steps after the first K, on random tokens of the same shape.
# Neither side clips gradients (a global norm over several servers is not part of PyTorch's
# pattern, so meshtrain runs with optim.grad_clip=0 here).
# --blas-core sets OPENBLAS_CORETYPE (which kernels OpenBLAS runs) for both sides; "native" unsets
# it. --sides torch measures PyTorch alone (no meshtrain build needed).
# Output: one JSON line per measurement ({"side": "meshtrain_ps" | "torch_rpc_ps", "round",
# "workers", "servers", "steps", "median_step_s", "steps_per_s", "tokens_per_s", "blas", ...}),
# then which BLAS each side ran, a table row and one summary JSON line:
#   {"summary": "ps_compare", "workers", "servers", "rounds", "meshtrain_steps_per_s",
#    "torch_steps_per_s" (medians over rounds), "ratio" (meshtrain / torch),
#    "ratio_per_round" [median, min, max], "meshtrain_blas", "torch_blas"}
set -euo pipefail
NAME=ps_compare
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "$NAME: $1" >&2; exit "${2:-1}"; }
BUILD=build
if [[ $# -gt 0 && $1 != -* ]]; then
  BUILD=$1
  shift
fi
WORKERS=2
SERVERS=1
STEPS=40
WARMUP=5
ROUNDS=3
SIDES="meshtrain torch"
BLAS_CORE=""
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value" 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --workers) need_value "$@"; WORKERS=$2; shift 2 ;;
    --servers) need_value "$@"; SERVERS=$2; shift 2 ;;
    --steps) need_value "$@"; STEPS=$2; shift 2 ;;
    --warmup) need_value "$@"; WARMUP=$2; shift 2 ;;
    --rounds) need_value "$@"; ROUNDS=$2; shift 2 ;;
    --sides) need_value "$@"; SIDES=$2; shift 2 ;;
    --blas-core) need_value "$@"; BLAS_CORE=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" 2 ;;
  esac
done
for v in WORKERS SERVERS STEPS ROUNDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,} must be a positive integer, not '${!v}'" 2
done
[[ $WARMUP =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer, not '$WARMUP'" 2
((STEPS > WARMUP)) || die "--steps ($STEPS) must exceed --warmup ($WARMUP)" 2
RUN_MT=0 RUN_TORCH=0
for s in $SIDES; do
  case $s in
    meshtrain) RUN_MT=1 ;;
    torch) RUN_TORCH=1 ;;
    *) die "unknown side $s in --sides; the sides are: meshtrain torch" 2 ;;
  esac
done
((RUN_MT + RUN_TORCH > 0)) || die "--sides names no side" 2

cd "$(dirname "$0")/.."
PY=/usr/bin/python3
if ((RUN_MT)); then
  [[ -x $BUILD/meshrun && -x $BUILD/meshtrain ]] ||
    die "$BUILD has no meshrun and meshtrain; build them first or pass the build directory" 2
  BUILD=$(cd "$BUILD" && pwd)
  # (--help read whole first: grep -q closing the pipe early would fail it under pipefail).
  MESHRUN_HELP=$("$BUILD/meshrun" --help 2>&1 || true)
  [[ $MESHRUN_HELP == *--ps-servers* ]] ||
    die "this meshrun does not support --ps-servers (no parameter server in $BUILD yet);\
 --sides torch measures PyTorch alone" 2
fi
if ((RUN_TORCH)); then
  "$PY" -c 'import torch.distributed.rpc as r; assert r.is_available()' 2> /dev/null ||
    die "$PY has no torch with torch.distributed.rpc (python3-torch)" 2
fi
# Read by train_bench_common.sh.
# shellcheck disable=SC2034
BENCH_NAME=$NAME STEPS_A=$STEPS STEPS_B=$STEPS
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
apply_blas_core "$BLAS_CORE"
read -r LAYERS EMBD HEADS BLOCK BATCH <<< "$(config_shape a)"

TMP=$(mktemp -d)
CHILD=""
# Ends the side that is running (meshrun forwards SIGTERM to its ranks, ps_bench_torch.py ends its
# processes), SIGKILL after 10 s, reaps it, removes the scratch directory.
cleanup() {
  local rc=$?
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2> /dev/null; then
    kill -TERM "$CHILD" 2> /dev/null || true
    for _ in $(seq 100); do
      kill -0 "$CHILD" 2> /dev/null || break
      sleep 0.1
    done
    kill -KILL "$CHILD" 2> /dev/null || true
  fi
  if [[ -n $CHILD ]]; then wait "$CHILD" 2> /dev/null || true; fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
RESULTS=$TMP/results.jsonl

# run_child LOG CMD...: runs CMD in the background (so that a signal reaches the trap at once) and
# waits for it; its status is the command's.
run_child() {
  local log=$1 rc=0
  shift
  "$@" > "$log" 2>&1 &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}

fail() {
  echo "$NAME: the $1 side failed in round $2; last lines of its log:" >&2
  tail -n 15 "$3" >&2
  exit 1
}

if ((RUN_MT)); then
  prepare_demo_data > "$TMP/prepare.log" 2>&1 || fail "data preparation" 0 "$TMP/prepare.log"
fi

run_meshtrain() {  # round
  local d=$TMP/mt-$1
  # The demo config at config (a)'s shape with train_bench_common.sh's settings (1 thread, no
  # eval, no samples, no checkpoints); the parameter-server keys spelled out besides --ps-servers.
  # shellcheck disable=SC2046
  run_child "$d.log" "$BUILD/meshrun" --nproc-per-node $((WORKERS + SERVERS)) \
    --ps-servers "$SERVERS" -- "$BUILD/meshtrain" $(train_args a "$d") \
    --set parallel.mode=parameter_server --set parallel.ps.servers="$SERVERS" \
    --set parallel.ps.consistency=sync --set optim.grad_clip=0 ||
    fail meshtrain "$1" "$d.log"
  "$PY" - "$d/metrics.jsonl" "$1" "$WORKERS" "$SERVERS" "$WARMUP" $((WORKERS * BATCH * BLOCK)) \
    "$(meshtrain_blas "$d.log")" << 'EOF' | tee -a "$RESULTS"
import json, statistics, sys
path, rnd, workers, servers, warmup, tokens, blas = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError as e:
    sys.exit(f"ps_compare: no metrics from meshtrain: {e}")
times = [r["step_s"] for r in rows
         if "event" not in r and "step_s" in r and r.get("step", 0) > int(warmup)]
if not times:
    sys.exit(f"ps_compare: no timed steps in {path}")
med = statistics.median(times)
print(json.dumps({"side": "meshtrain_ps", "round": int(rnd), "workers": int(workers),
                  "servers": int(servers), "steps": len(times), "median_step_s": med,
                  "steps_per_s": 1 / med, "tokens_per_s": int(tokens) / med,
                  "blas": blas or "?"}))
EOF
}

run_torch() {  # round
  local d=$TMP/torch-$1
  run_child "$d.log" "$PY" bench/python/ps_bench_torch.py --workers "$WORKERS" \
    --servers "$SERVERS" --threads 1 --steps $((STEPS - WARMUP)) --warmup "$WARMUP" \
    --n-layer "$LAYERS" --n-embd "$EMBD" --n-head "$HEADS" --block-size "$BLOCK" \
    --batch-size "$BATCH" --vocab-size 257 --timeout 600 || fail torch "$1" "$d.log"
  "$PY" -c 'import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
if not lines:
    sys.exit("ps_compare: ps_bench_torch.py printed no result")
r = json.loads(lines[-1])
r["round"] = int(sys.argv[2])
r.pop("blas_libs", None)
print(json.dumps(r))' "$d.log" "$1" | tee -a "$RESULTS"
}

for ((round = 1; round <= ROUNDS; ++round)); do
  if ((round % 2 == 1)); then order="mt torch"; else order="torch mt"; fi
  for side in $order; do
    if [[ $side == mt ]] && ((RUN_MT)); then run_meshtrain "$round"; fi
    if [[ $side == torch ]] && ((RUN_TORCH)); then run_torch "$round"; fi
  done
done

"$PY" - "$RESULTS" "$WORKERS" "$SERVERS" "$ROUNDS" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
workers, servers, rounds = map(int, sys.argv[2:5])
side = {s: [r for r in rows if r["side"] == s] for s in ("meshtrain_ps", "torch_rpc_ps")}
med = {s: statistics.median(r["steps_per_s"] for r in rs) if rs else None
       for s, rs in side.items()}
blas = {s: rs[0]["blas"] if rs else None for s, rs in side.items()}
by_round = {s: {r["round"]: r["steps_per_s"] for r in rs} for s, rs in side.items()}
per = sorted(v / by_round["torch_rpc_ps"][k] for k, v in by_round["meshtrain_ps"].items()
             if k in by_round["torch_rpc_ps"])
mt, pt = med["meshtrain_ps"], med["torch_rpc_ps"]
ratio = mt / pt if mt and pt else None
print()
print(f"meshtrain BLAS: {blas['meshtrain_ps'] or '-'}")
tv = side["torch_rpc_ps"][0]["torch_version"] if side["torch_rpc_ps"] else "-"
print(f"PyTorch {tv} BLAS: {blas['torch_rpc_ps'] or '-'}")
print(f"Medians over {rounds} rounds, steps/s (one step: every worker's batch, one update).")
print("| workers | servers | meshtrain steps/s | PyTorch RPC steps/s | meshtrain/PyTorch "
      "| per round |")
print("|---|---|---|---|---|---|")
f = lambda x, fmt: format(x, fmt) if x is not None else "-"
pr = f"{statistics.median(per):.2f}x ({per[0]:.2f}-{per[-1]:.2f})" if per else "-"
print(f"| {workers} | {servers} | {f(mt, '.3f')} | {f(pt, '.3f')} | "
      f"{f(ratio, '.2f') + 'x' if ratio else '-'} | {pr} |")
print(json.dumps({"summary": "ps_compare", "workers": workers, "servers": servers,
                  "rounds": rounds, "meshtrain_steps_per_s": mt, "torch_steps_per_s": pt,
                  "ratio": ratio,
                  "ratio_per_round": [statistics.median(per), per[0], per[-1]] if per else None,
                  "meshtrain_blas": blas["meshtrain_ps"], "torch_blas": blas["torch_rpc_ps"]}))
EOF
