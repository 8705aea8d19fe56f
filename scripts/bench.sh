#!/usr/bin/env bash
# Benchmarks (never part of the tests): GPT training throughput against PyTorch on the same
# machine and thread counts, interleaved round by round. Prints JSON lines and a table.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
echo "== training throughput: meshtrain vs PyTorch (configs a and b, 1 and 2 threads)"
"$BUILD/train_bench" --configs a b --threads 1 2 --rounds "${ROUNDS:-3}"
if [[ -x bench/comm_compare.sh ]]; then
  echo "== collectives: meshtrain vs Gloo and Open MPI"
  bash bench/comm_compare.sh "$BUILD" || echo "comm comparison failed (see above)"
fi
if [[ $(id -u) -eq 0 ]] && command -v ip >/dev/null; then
  echo "== tcp between network-namespace hosts: meshtrain vs Gloo"
  bash bench/netns_compare.sh "$BUILD" || echo "netns comparison failed (see above)"
fi
echo "== checkpoints: write throughput vs the disk, async blocking, restart time"
"$BUILD/ckpt_bench" --dir "$BUILD/ckpt_bench.tmp" --rounds "${ROUNDS:-3}"
