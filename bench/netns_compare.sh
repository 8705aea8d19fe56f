#!/usr/bin/env bash
# netns_compare.sh: meshtrain's tcp all-reduce against Gloo's between hosts that are network
# namespaces on this machine: HOSTS namespaces joined by a bridge (veth pairs, as the netns tests
# build them), one rank each. meshtrain runs comm_bench under meshrun (one agent per host, the
# store on host 0); Gloo runs gloo_allreduce --rank in each host (ring and halving-doubling over
# its tcp transport, meeting in a FileStore). Runs are interleaved round by round; each figure is
# the median of the rounds. Optional link shaping per host with tc (RATE=10gbit, DELAY=50us) makes
# the links behave like a network instead of a memory copy.
#
#   sudo bench/netns_compare.sh [BUILD_DIR]   (env: HOSTS=2 ROUNDS=3 ITERS=20 MIN=65536
#                                              MAX=67108864 RATE= DELAY=)
# Needs root and `ip netns` (iproute2); exits 2 saying so otherwise.
set -euo pipefail

BUILD=${1:-build}
HOSTS=${HOSTS:-2}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN=${MIN:-65536}
MAX=${MAX:-67108864}
RATE=${RATE:-}
DELAY=${DELAY:-}
export OMP_NUM_THREADS=1

die() {
  echo "netns_compare: $*" >&2
  exit 2
}
[[ $(id -u) -eq 0 ]] || die "needs root to create network namespaces"
command -v ip >/dev/null || die "needs ip (iproute2)"
for p in meshrun comm_bench gloo_allreduce; do
  [[ -x $BUILD/$p ]] || die "$BUILD/$p is not built (gloo_allreduce needs libgloo-dev)"
done
if [[ -n $RATE || -n $DELAY ]]; then command -v tc >/dev/null || die "RATE/DELAY need tc"; fi

prefix=mtb$(($$ % 100000))
sw=${prefix}sw
TMP=$(mktemp -d)
cleanup() {
  for ((h = 0; h < HOSTS; ++h)); do ip netns del "${prefix}h$h" 2>/dev/null || true; done
  ip netns del "$sw" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
addr() { echo "10.232.0.$(($1 + 1))"; }

ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for ((h = 0; h < HOSTS; ++h)); do
  ns=${prefix}h$h
  ip netns add "$ns"
  ip -n "$sw" link add "p$h" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "p$h" master br0 up
  ip -n "$ns" addr add "$(addr "$h")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [[ -n $RATE || -n $DELAY ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root netem ${DELAY:+delay $DELAY} ${RATE:+rate $RATE}
  fi
done

RESULTS=$TMP/results.jsonl
touch "$RESULTS"
common=(--min-bytes "$MIN" --max-bytes "$MAX" --iters "$ITERS" --warmup "$WARMUP")
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/token"

# Starts one process per host (the command comes from the function named by $2, called with the
# host index), waits for all, and keeps host 0's JSON lines tagged with the label.
run_hosts() {
  local label=$1 make_cmd=$2 pids=() ok=1
  for ((h = 0; h < HOSTS; ++h)); do
    # shellcheck disable=SC2046
    ip netns exec "${prefix}h$h" $($make_cmd "$h") >"$TMP/$label.$h.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [[ $ok != 1 ]]; then
    echo "netns_compare: $label failed:" >&2
    tail -n 5 "$TMP/$label".*.log >&2
    return 0
  fi
  grep -h '^\(\[rank 0\] \)\?{' "$TMP/$label.0.log" | sed 's/^\[rank 0\] //' |
    sed "s/^{/{\"label\":\"$label\",/" >>"$RESULTS" || true
}
meshtrain_cmd() {
  echo "$BUILD/meshrun --nnodes $HOSTS --node-rank $1 --nproc-per-node 1" \
    "--rdzv-endpoint $(addr 0):29611 --token-file $TMP/token --" \
    "$BUILD/comm_bench --backend tcp ${common[*]}"
}
gloo_ring_cmd() {
  mkdir -p "$TMP/store-ring-$round"
  echo "$BUILD/gloo_allreduce --algo ring --rank $1 --world-size $HOSTS" \
    "--store-dir $TMP/store-ring-$round --address $(addr "$1") ${common[*]}"
}
gloo_hd_cmd() {
  mkdir -p "$TMP/store-hd-$round"
  echo "$BUILD/gloo_allreduce --algo halving_doubling --rank $1 --world-size $HOSTS" \
    "--store-dir $TMP/store-hd-$round --address $(addr "$1") ${common[*]}"
}

echo "netns_compare: $HOSTS hosts, $(getconf _NPROCESSORS_ONLN) cores, $ROUNDS rounds," \
  "links ${RATE:-unshaped}${DELAY:+, delay $DELAY}" >&2
for round in $(seq "$ROUNDS"); do
  run_hosts mt-tcp meshtrain_cmd
  run_hosts gloo-ring gloo_ring_cmd
  run_hosts gloo-hd gloo_hd_cmd
done

python3 - "$RESULTS" "$HOSTS" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if not j.get("ok", False):
        print(f"WARNING: {j['label']} bytes={j['bytes']} gave a wrong result")
        continue
    runs.setdefault((j["bytes"], j["label"]), []).append(j["busbw_gbs"])
med = {k: statistics.median(v) for k, v in runs.items()}
sizes = sorted({k[0] for k in med})
print(f"\nall_reduce f32 sum, {sys.argv[2]} network-namespace hosts, tcp, busbw GB/s "
      "(median of rounds)")
print(f"{'size(B)':>10} {'mt-tcp':>9} {'gloo-ring':>9} {'gloo-hd':>9}  mt/gloo-best")
for b in sizes:
    mt = med.get((b, "mt-tcp"))
    gl = max([med.get((b, l), 0) for l in ("gloo-ring", "gloo-hd")]) or None
    cell = lambda v: f"{v:9.3f}" if v else "        -"
    ratio = f"{mt / gl:12.2f}" if mt and gl else "           -"
    print(f"{b:>10} {cell(mt)} {cell(med.get((b, 'gloo-ring')))} "
          f"{cell(med.get((b, 'gloo-hd')))}  {ratio}")
    print(json.dumps({"bytes": b, "mt_tcp_busbw": mt, "gloo_best_busbw": gl,
                      "ratio": mt / gl if mt and gl else None}), file=sys.stderr)
PY
