#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU: builds the CUDA targets, then, each step
# printed before it runs and the first failure ending the script,
#   1. test_cuda: the device tests (runtime, caching allocator, every kernel against the CPU,
#      the tiny GPT trained on cuda against the CPU, DDP over a one-rank nccl group, the Trainer
#      with train.device = "cuda") and the device-free dispatch tests;
#   2. a short `meshtrain train` on cuda (50 steps of the demo model);
#   3. the benchmark on the tiny model (seconds), flash attention's kernels against PyTorch's SDPA
#      (seconds), then GPT-2 124M against PyTorch eager and torch.compile (minutes).
# Usage: bash bench/gpu_first_run.sh [BUILD_DIR] [extra gpu_train_bench flags...]
# Each part can also be run alone with the commands it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
shift || true
step() {
  echo
  echo "==> $*"
}

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "(nvidia-smi missing)"

step "cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=ON"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=ON >/dev/null
step "ninja -C $build test_cuda meshtrain gpu_train_bench attention_bench"
ninja -C "$build" test_cuda meshtrain gpu_train_bench attention_bench

step "$build/test_cuda"
"$build/test_cuda" --gtest_brief=1

data=data/fortunes
if [[ ! -f $data/train_000000.bin ]]; then
  data=$(mktemp -d)/data
  text=$(dirname "$data")/text.txt
  for i in $(seq 0 20000); do echo "line $((i % 97)) of the text, word $(((i * 7) % 31))."; done >"$text"
  step "$build/meshtrain data prepare --input $text --out $data"
  "$build/meshtrain" data prepare --input "$text" --out "$data"
fi
run=$(mktemp -d)/run
step "$build/meshtrain train --config configs/demo.toml --set train.device=cuda ..."
"$build/meshtrain" train --config configs/demo.toml --set data.dir="$data" \
  --set train.device=cuda --set train.steps=50 --set train.eval_interval=25 \
  --set train.log_interval=10 --set train.out_dir="$run" --set ckpt.interval=0

step "$build/gpu_train_bench --config tiny --no-compile $*"
"$build/gpu_train_bench" --config tiny --no-compile "$@"
step "$build/attention_bench --shapes all"
"$build/attention_bench" --shapes all
step "$build/gpu_train_bench --config gpt2 $*"
"$build/gpu_train_bench" --config gpt2 "$@"
