#!/usr/bin/env bash
# The main job: prepares the embedded default dataset (the text of Debian's fortunes package) on
# first run, then trains the demo GPT and prints a generated sample.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
DATA=data/fortunes
if [[ ! -f $DATA/train_000000.bin ]]; then
  src=/usr/share/games/fortunes
  if [[ ! -d $src ]]; then
    echo "demo: $src is missing; run scripts/install-deps.sh (package fortunes)" >&2
    exit 2
  fi
  mkdir -p data
  # Plain-text fortune files only (not the .dat indexes or .u8 symlinks), in a fixed order.
  find -L "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort |
    xargs cat > data/fortunes.txt
  "$BUILD/meshtrain" data prepare --input data/fortunes.txt --out "$DATA" --val-fraction 0.05
fi
shift || true
# Two data-parallel ranks on this host, launched the way torchrun would.
NPROC=${MESHTRAIN_DEMO_NPROC:-2}
"$BUILD/meshrun" --nproc-per-node "$NPROC" -- "$BUILD/meshtrain" train --config configs/demo.toml "$@"
