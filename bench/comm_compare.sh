#!/usr/bin/env bash
# comm_compare.sh: meshtrain's all-reduce next to the libraries users would otherwise pick, in one
# invocation, on one host: meshtrain shm (on private buffers, and on buffers from
# ProcessGroup::allocate_buffer, which ranks read in place: "mt-shm-reg", nccl-tests' -R) and tcp
# (comm_bench), Gloo's ring and halving-doubling
# over its tcp transport (gloo_allreduce), and Open MPI over shared memory (btl vader) and over
# tcp (mpi_allreduce under mpirun). Runs are interleaved (every peer once per round, rounds
# repeated) so that a burst of load on a shared machine hits all of them alike; each figure is the
# median of the rounds. Prints busbw per size, the ratios meshtrain/Gloo and meshtrain/MPI, the
# 4 KiB latency and the single-thread memcpy bandwidth (the ceiling for shared memory).
#
#   bench/comm_compare.sh [BUILD_DIR]      (env: WORLDS="2 4" ROUNDS=3 ITERS=20 MIN=4096 MAX=67108864)
# Peers whose program is missing (Gloo or Open MPI not installed) are left out of the table.
set -euo pipefail

BUILD=${1:-build}
WORLDS=${WORLDS:-"2 4"}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN=${MIN:-4096}
MAX=${MAX:-67108864}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
RESULTS="$OUT/results.jsonl"
touch "$RESULTS"
export OMP_NUM_THREADS=1

[[ -x "$BUILD/comm_bench" ]] || { echo "comm_compare: $BUILD/comm_bench not built" >&2; exit 1; }
have_gloo=0; [[ -x "$BUILD/gloo_allreduce" ]] && have_gloo=1
have_mpi=0; [[ -x "$BUILD/mpi_allreduce" ]] && command -v mpirun >/dev/null && have_mpi=1
[[ $have_gloo == 1 ]] || echo "comm_compare: gloo_allreduce not built (libgloo-dev missing); Gloo left out" >&2
[[ $have_mpi == 1 ]] || echo "comm_compare: mpi_allreduce or mpirun missing (Open MPI); MPI left out" >&2

common=(--min-bytes "$MIN" --max-bytes "$MAX" --iters "$ITERS" --warmup "$WARMUP")
mpirun_base=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)

# Runs one peer and appends its JSON lines, tagged with the round, to the results.
run_peer() {
  local label=$1 world=$2; shift 2
  local log="$OUT/log"
  if ! "$@" >"$log" 2>&1; then
    echo "comm_compare: $label (world $world) failed:" >&2
    tail -5 "$log" >&2
    return 0
  fi
  sed -n 's/^# comm_bench .*memcpy=\([0-9.]*\) GB\/s.*/{"memcpy_gbs":\1}/p' "$log" >>"$RESULTS"
  grep '^{' "$log" | sed "s/^{/{\"label\":\"$label\",/" >>"$RESULTS" || true
}

echo "comm_compare: $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg), worlds $WORLDS, $ROUNDS rounds" >&2
for round in $(seq "$ROUNDS"); do
  for world in $WORLDS; do
    run_peer mt-shm "$world" "$BUILD/comm_bench" --backend shm --world-size "$world" "${common[@]}"
    run_peer mt-shm-reg "$world" "$BUILD/comm_bench" --backend shm --registered --world-size "$world" "${common[@]}"
    if [[ $have_mpi == 1 ]]; then
      run_peer mpi-sm "$world" "${mpirun_base[@]}" -np "$world" --mca btl self,vader \
        "$BUILD/mpi_allreduce" --label mpi-sm "${common[@]}"
    fi
    if [[ $have_gloo == 1 ]]; then
      run_peer gloo-ring "$world" "$BUILD/gloo_allreduce" --algo ring --world-size "$world" "${common[@]}"
      run_peer gloo-hd "$world" "$BUILD/gloo_allreduce" --algo halving_doubling --world-size "$world" "${common[@]}"
    fi
    run_peer mt-tcp "$world" "$BUILD/comm_bench" --backend tcp --world-size "$world" "${common[@]}"
    if [[ $have_mpi == 1 ]]; then
      run_peer mpi-tcp "$world" "${mpirun_base[@]}" -np "$world" --mca btl self,tcp \
        --mca btl_tcp_if_include lo "$BUILD/mpi_allreduce" --label mpi-tcp "${common[@]}"
    fi
  done
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
runs, memcpy = {}, []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "memcpy_gbs" in j:
        memcpy.append(j["memcpy_gbs"]); continue
    if not j.get("ok", False):
        print(f"WARNING: {j['label']} ranks={j['ranks']} bytes={j['bytes']} gave a wrong result")
        continue
    runs.setdefault((j["ranks"], j["bytes"], j["label"]), []).append(j)
# The round with the median time (the lower of the middle two for an even count) stands for each.
best = {}
for key, js in runs.items():
    t = statistics.median_low([j["time_us"] for j in js])
    best[key] = next(j for j in js if j["time_us"] == t)
labels = [l for l in ["mt-shm", "mt-shm-reg", "mpi-sm", "gloo-ring", "gloo-hd", "mt-tcp", "mpi-tcp"]
          if any(k[2] == l for k in best)]
def bw(w, b, l):
    j = best.get((w, b, l)); return j["busbw_gbs"] if j else None
def ratio(a, b):
    return f"{a / b:6.2f}" if a and b else "     -"
def fmt(v):
    return f"{v:9.3f}" if v is not None else "        -"
worlds = sorted({k[0] for k in best})
sizes = sorted({k[1] for k in best})
if memcpy:
    print(f"single-thread memcpy: {statistics.median(memcpy):.2f} GB/s (median of {len(memcpy)})")
for w in worlds:
    print(f"\nall_reduce f32 sum, {w} ranks, busbw GB/s (median of rounds)")
    head = f"{'size(B)':>10} " + " ".join(f"{l:>9}" for l in labels)
    head += "  shm/gloo shm/mpi-sm reg/mpi-sm tcp/gloo tcp/mpi-tcp"
    print(head)
    for b in sizes:
        row = f"{b:>10} " + " ".join(fmt(bw(w, b, l)) for l in labels)
        gloo = max([x for x in (bw(w, b, "gloo-ring"), bw(w, b, "gloo-hd")) if x] or [0]) or None
        row += (f"  {ratio(bw(w, b, 'mt-shm'), gloo):>8} {ratio(bw(w, b, 'mt-shm'), bw(w, b, 'mpi-sm')):>10}"
                f" {ratio(bw(w, b, 'mt-shm-reg'), bw(w, b, 'mpi-sm')):>10}"
                f" {ratio(bw(w, b, 'mt-tcp'), gloo):>8} {ratio(bw(w, b, 'mt-tcp'), bw(w, b, 'mpi-tcp')):>11}")
        print(row)
    small = sizes[0]
    lat = "  ".join(f"{l} {best[(w, small, l)]['time_us']:.1f}" for l in labels if (w, small, l) in best)
    print(f"latency of a {small} B all_reduce (us): {lat}")
PY
