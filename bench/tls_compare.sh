#!/usr/bin/env bash
# tls_compare.sh: the tcp all-reduce with TLS (dist.tls: TLS 1.3, AES-128-GCM, mutual
# certificates) against the same all-reduce in plaintext, 1-16 MiB, two ranks:
#   loopback  comm_bench forks its two ranks on this host (MESHTRAIN_TLS* turn TLS on);
#   netns     two hosts that are network namespaces joined by a bridge (veth pairs, as
#             bench/netns_compare.sh builds them), one meshrun agent and one rank each, the
#             store on host 0 (meshrun --tls-cert/--tls-key/--tls-ca: the store is TLS too).
# The certificates come from `meshtrain tls gen-ca` / `gen-cert`. Plain and TLS runs alternate
# round by round; each figure is the median over the rounds of comm_bench's mean time. Prints a
# table and one JSON line per mode and size: {"mode","bytes","plain_us","tls_us","ratio"} with
# ratio = TLS throughput / plaintext throughput (plain_us / tls_us), and for the unshaped modes
# (both ranks on this host's cores) "plain_cpu_us"/"tls_cpu_us" (CPU of both ranks per
# all-reduce), "ceiling" (the best ratio the cores allow: plain time over (plain CPU + AES CPU) /
# cores, AES at `openssl speed`'s rate with every core at it), "vs_ceiling", and "work_ratio"
# (plain CPU / (plain CPU + AES CPU): the ratio if TLS's added work keeps the cores as busy as
# the plaintext run does).
#
#   bench/tls_compare.sh [BUILD_DIR]   (env: MODES="loopback netns" ROUNDS=5 ITERS=20 WARMUP=5
#                                       MIN=1048576 MAX=16777216 RATE= DELAY=)
# netns needs root and `ip netns`; without them it is skipped with a line saying so. RATE (e.g.
# 1gbit; tc tbf) and DELAY (e.g. 50us; tc netem) shape each netns host's link, so that the link,
# not a memory copy, limits the transfer (mode "netns-RATE").
set -euo pipefail

BUILD=${1:-build}
MODES=${MODES:-loopback netns}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN=${MIN:-1048576}
MAX=${MAX:-16777216}
RATE=${RATE:-}
DELAY=${DELAY:-}
export OMP_NUM_THREADS=1

die() {
  echo "tls_compare: $*" >&2
  exit 2
}
for p in meshtrain meshrun comm_bench; do
  [[ -x $BUILD/$p ]] || die "$BUILD/$p is not built"
done
TMP=$(mktemp -d)
prefix=mtt$(($$ % 100000))
cleanup() {
  for h in 0 1; do ip netns del "${prefix}h$h" 2>/dev/null || true; done
  ip netns del "${prefix}sw" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

"$BUILD/meshtrain" tls gen-ca --out "$TMP/pki" >/dev/null
for h in 0 1; do
  "$BUILD/meshtrain" tls gen-cert --ca "$TMP/pki/ca.pem" --host "10.233.0.$((h + 1))" \
    --host 127.0.0.1 --name "node$h" --out "$TMP/pki" >/dev/null
done
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/token"
common=(--backend tcp --op all_reduce --min-bytes "$MIN" --max-bytes "$MAX" --iters "$ITERS"
  --warmup "$WARMUP")
RESULTS=$TMP/results.jsonl
touch "$RESULTS"

keep() {  # keep rank 0's JSON lines of log $2 tagged with mode $1 and tls $3
  grep -h '^\(\[rank 0\] \)\?{' "$2" | sed 's/^\[rank 0\] //' |
    sed "s/^{/{\"mode\":\"$1\",\"tls\":$3,/" >>"$RESULTS" || true
}

loopback_run() {  # $1: 0 plain, 1 TLS
  local log=$TMP/loopback.$1.log
  if [[ $1 == 1 ]]; then
    MESHTRAIN_TLS=1 MESHTRAIN_TLS_CERT=$TMP/pki/node0.pem MESHTRAIN_TLS_KEY=$TMP/pki/node0.key \
      MESHTRAIN_TLS_CA=$TMP/pki/ca.pem "$BUILD/comm_bench" "${common[@]}" --world-size 2 >"$log" 2>&1
  else
    "$BUILD/comm_bench" "${common[@]}" --world-size 2 >"$log" 2>&1
  fi || { echo "tls_compare: loopback tls=$1 failed:" >&2; tail -n 5 "$log" >&2; return 0; }
  keep loopback "$log" "$1"
}

netns_setup() {
  ip netns add "${prefix}sw"
  ip -n "${prefix}sw" link add br0 type bridge
  ip -n "${prefix}sw" link set br0 up
  for h in 0 1; do
    local ns=${prefix}h$h
    ip netns add "$ns"
    ip -n "${prefix}sw" link add "p$h" type veth peer name eth0 netns "$ns"
    ip -n "${prefix}sw" link set "p$h" master br0 up
    ip -n "$ns" addr add "10.233.0.$((h + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [[ -n $DELAY ]]; then  # netem (a kernel module this VM lacks) for a delay
      ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$DELAY" ${RATE:+rate $RATE}
    elif [[ -n $RATE ]]; then  # a token bucket for the rate alone
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 512kb latency 50ms
    fi
  done
}

netns_run() {  # $1: 0 plain, 1 TLS
  local pids=() ok=1 port=$((29700 + RANDOM % 200))
  for h in 0 1; do
    local tls=()
    [[ $1 == 1 ]] && tls=(--tls-cert "$TMP/pki/node$h.pem" --tls-key "$TMP/pki/node$h.key"
      --tls-ca "$TMP/pki/ca.pem")
    ip netns exec "${prefix}h$h" env MESHTRAIN_COMM_ADDR="10.233.0.$((h + 1))" \
      "$BUILD/meshrun" --nnodes 2 --node-rank "$h" --nproc-per-node 1 \
      --rdzv-endpoint "10.233.0.1:$port" --token-file "$TMP/token" "${tls[@]}" -- \
      "$BUILD/comm_bench" "${common[@]}" >"$TMP/netns.$1.$h.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [[ $ok != 1 ]]; then
    echo "tls_compare: netns tls=$1 failed:" >&2
    tail -n 5 "$TMP"/netns."$1".*.log >&2
    return 0
  fi
  keep "netns${RATE:+-$RATE}${DELAY:+-$DELAY}" "$TMP/netns.$1.0.log" "$1"
}

run_modes=()
for m in $MODES; do
  if [[ $m == netns ]]; then
    if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
      echo "tls_compare: skipping netns (needs root and ip)" >&2
      continue
    fi
    netns_setup
  fi
  run_modes+=("$m")
done

echo "tls_compare: $(getconf _NPROCESSORS_ONLN) cores, $ROUNDS rounds, modes ${run_modes[*]}," \
  "$(openssl version 2>/dev/null || echo OpenSSL)" >&2
# The AES-128-GCM rate of one core while every core runs it (records of 16 KiB, as TLS seals
# them, in cache: the most favourable rate), for the CPU ceiling below.
aes_rate() {
  local pids=() i
  for i in $(seq "$(getconf _NPROCESSORS_ONLN)"); do
    openssl speed -mr -elapsed -seconds 2 -bytes 16384 -evp aes-128-gcm >"$TMP/aes.$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  grep -h '^+F:' "$TMP"/aes.* | awk -F: 'NR == 1 || $4 < m { m = $4 } END { print m + 0 }'
}
AES_BYTES_PER_S=$(aes_rate)
echo "tls_compare: AES-128-GCM $(awk -v r="$AES_BYTES_PER_S" 'BEGIN { printf "%.2f", r / 1e9 }')" \
  "GB/s per core with every core at it (openssl speed)" >&2
for round in $(seq "$ROUNDS"); do
  for m in "${run_modes[@]}"; do
    # Alternate which goes first, so that neither always runs on a warmer machine.
    if ((round % 2)); then order="0 1"; else order="1 0"; fi
    for t in $order; do "${m}_run" "$t"; done
  done
done

python3 - "$RESULTS" "$AES_BYTES_PER_S" "$(getconf _NPROCESSORS_ONLN)" <<'PY'
import json, statistics, sys
aes = float(sys.argv[2])
cores = int(sys.argv[3])
runs = {}
cpu = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if not j.get("ok", False):
        print(f"WARNING: {j['mode']} tls={j['tls']} bytes={j['bytes']} gave a wrong result")
        continue
    runs.setdefault((j["mode"], j["bytes"], j["tls"]), []).append(j["time_us"])
    if "cpu_us" in j:
        cpu.setdefault((j["mode"], j["bytes"], j["tls"]), []).append(j["cpu_us"])
med = {k: statistics.median(v) for k, v in runs.items()}
med_cpu = {k: statistics.median(v) for k, v in cpu.items()}


def ceiling(mode, b, plain_us):
    """The best TLS/plain ratio this host allows when both ranks share its cores (loopback, and
    namespaces on one host): TLS does the plaintext run's CPU work (med_cpu: every thread of both
    ranks per all-reduce) plus sealing every byte a rank sends and opening every byte it receives
    (a ring all-reduce of 2 ranks sends and receives the buffer's size each), at the AES rate
    measured with every core at it, and `cores` cores cannot do that work faster than
    (plain CPU + AES CPU) / cores."""
    c = med_cpu.get((mode, b, 0))
    if c is None or aes <= 0 or mode.startswith("netns-"):
        return None
    aes_us = 2 * 2 * b / aes * 1e6  # 2 ranks x (seal + open) x b bytes
    return plain_us / max(plain_us, (c + aes_us) / cores)


def work_ratio(mode, b):
    """plain CPU / (plain CPU + AES CPU): the ratio TLS reaches if its added work runs as
    efficiently as the plaintext run's own (the same share of the cores busy: a ring's steps
    wait on each other whatever they compute)."""
    c = med_cpu.get((mode, b, 0))
    if c is None or aes <= 0 or mode.startswith("netns-"):
        return None
    return c / (c + 2 * 2 * b / aes * 1e6)


print("\ntcp all_reduce f32 sum, 2 ranks, median time per all-reduce (us) over rounds")
print(f"{'mode':>9} {'size(B)':>10} {'plain_us':>10} {'tls_us':>10} {'plain_GB/s':>10} "
      f"{'tls_GB/s':>9} {'tls/plain':>9} {'plain_cpu':>9} {'ceiling':>7} {'work':>5}")
for mode in sorted({k[0] for k in med}):
    for b in sorted({k[1] for k in med if k[0] == mode}):
        p, t = med.get((mode, b, 0)), med.get((mode, b, 1))
        if p is None or t is None:
            continue
        ratio = p / t
        ceil = ceiling(mode, b, p)
        c = med_cpu.get((mode, b, 0))
        print(f"{mode:>9} {b:>10} {p:10.1f} {t:10.1f} {b / p / 1e3:10.3f} {b / t / 1e3:9.3f} "
              f"{ratio:9.2f} {c if c is not None else float('nan'):9.1f} "
              f"{ceil if ceil is not None else float('nan'):7.2f} "
              f"{work_ratio(mode, b) if work_ratio(mode, b) is not None else float('nan'):5.2f}")
        out = {"mode": mode, "bytes": b, "plain_us": round(p, 1), "tls_us": round(t, 1),
               "ratio": round(ratio, 3), "rounds": len(runs[(mode, b, 0)])}
        if c is not None:
            out["plain_cpu_us"] = round(c, 1)
            out["tls_cpu_us"] = round(med_cpu.get((mode, b, 1), float("nan")), 1)
        if ceil is not None:
            out["ceiling"] = round(ceil, 3)
            out["vs_ceiling"] = round(ratio / ceil, 3)
        work = work_ratio(mode, b)
        if work is not None:
            out["work_ratio"] = round(work, 3)
        print(json.dumps(out))
PY
