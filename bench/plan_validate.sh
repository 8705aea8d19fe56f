#!/usr/bin/env bash
# The planner against measurement: for 11 layouts this build trains on one host (DDP and ZeRO-1,
# -2, -3 at 2 and 4 ranks; a 2-stage pipeline and tensor parallelism over 2 ranks; 2 pipelines of
# 2 stages on 4 ranks; dist.backend = shm, 1 thread per rank, GPTs of 3.3 M and 10.8 M
# parameters on the demo data), the memory per rank and the step time `meshtrain plan --predict`
# gives after `meshtrain plan --calibrate`, beside what the runs measure.
#
# Usage: bench/plan_validate.sh [BUILD] [--rounds R] [--steps N] [--warmup W] [--layouts "a b"]
#                                [--docs FILE]
#   --rounds R   runs every layout R times (default 3), the order rotating by one layout per
#                round; the table gives the medians and the range of the step-time errors
#   --docs FILE  rewrites the table between the plan_validate markers of FILE (docs/planner.md)
# Each layout is calibrated just before it runs, with its own rank count, so that calibration and
# run see the same machine under the same load. Measured memory: each rank's peak resident memory
# with the shared-memory buckets counted at its share (bench/python/plan_validate.py says how);
# measured step time: the median step_s of rank 0 after the warm-up. One JSON line per layout,
# then the Markdown table.
set -euo pipefail
COMMAND="bench/plan_validate.sh${*:+ $*}"
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ARGS=()
DOCS=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps | --warmup | --layouts | --rounds) ARGS+=("$1" "$2"); shift 2 ;;
    --docs) DOCS=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "plan_validate: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
if [[ ! -x $BUILD/meshtrain || ! -x $BUILD/meshrun ]]; then
  echo "plan_validate: $BUILD/meshtrain or $BUILD/meshrun is missing; build them first" \
    "(ninja -C $BUILD meshtrain meshrun)" >&2
  exit 2
fi
BENCH_NAME=plan_validate
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
prepare_demo_data
[[ -n $DOCS ]] && ARGS+=(--docs "$DOCS" --command "$COMMAND")
exec /usr/bin/python3 bench/python/plan_validate.py --build "$BUILD" --data "$DATA" "${ARGS[@]}"
