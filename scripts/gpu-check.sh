#!/usr/bin/env bash
# Runs on the GPU host, from a pack made by scripts/gpu-bundle.sh: the device tests, the same tests
# under compute-sanitizer (memcheck, then racecheck), then attention_bench (the flash attention
# kernels beside PyTorch's SDPA) and gpu_train_bench (a training step beside PyTorch). Every
# output goes to a results folder; each stage runs even when one before it failed, and the exit
# status is non-zero when any did.
#
# Library paths: our programs need the pack's lib/ and the host's CUDA libraries (cudart, cuBLASLt,
# NCCL, cuDNN: found in the usual toolkit folders, the loader cache, or PyTorch's nvidia/
# packages; cuDNN loads its engine libraries from its own folder). That
# LD_LIBRARY_PATH is given to our programs only: PyTorch brings its own libraries, so
# the benchmarks start Python through a wrapper that restores the host's LD_LIBRARY_PATH.
# The pack's C++ runtime (lib/cxx/) is used only when the host's is too old for our programs.
#
# Usage: bash PACK/scripts/gpu-check.sh [--results DIR] [--bin DIR] [options]
#   --results DIR           where everything goes (default gpu-results-<UTC time> here)
#   --bin DIR               the programs (default PACK/bin)
#   --test-timeout S        seconds for test_cuda (default 1800); likewise --memcheck-timeout,
#   --racecheck-timeout S   --racecheck-timeout and --bench-timeout (each benchmark)
#   --racecheck-filter F    gtest filter for racecheck (default all tests)
#   --memcheck-filter F     gtest filter for memcheck (default all tests)
#   --bench-args "ARGS"     gpu_train_bench's arguments (default
#                           "--config gpt2 --fused-epilogues both --atomic-dq both --loop both")
#   --attention-args "ARGS" attention_bench's arguments (default "--shapes all")
#   --no-sanitizers         skip memcheck and racecheck
# PYTHON names the interpreter with torch (default: python3, else /usr/bin/python3).
set -uo pipefail

pack=$(cd "$(dirname "$0")/.." && pwd)
bin=$pack/bin
results=gpu-results-$(date -u +%Y%m%dT%H%M%SZ)
test_timeout=1800 memcheck_timeout=1800 racecheck_timeout=1800 bench_timeout=1800
racecheck_filter='*'
memcheck_filter='*'
bench_args="--config gpt2 --fused-epilogues both --atomic-dq both --loop both"
attention_args="--shapes all"
sanitizers=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --results) results=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --test-timeout) test_timeout=$2; shift 2 ;;
    --memcheck-timeout) memcheck_timeout=$2; shift 2 ;;
    --racecheck-timeout) racecheck_timeout=$2; shift 2 ;;
    --bench-timeout) bench_timeout=$2; shift 2 ;;
    --racecheck-filter) racecheck_filter=$2; shift 2 ;;
    --memcheck-filter) memcheck_filter=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --attention-args) attention_args=$2; shift 2 ;;
    --no-sanitizers) sanitizers=0; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$results"
results=$(cd "$results" && pwd)
summary=$results/summary.txt
: >"$summary"
failed=0
say() { echo "$*" | tee -a "$summary"; }

for p in test_cuda gpu_train_bench attention_bench; do
  [[ -x $bin/$p ]] || { say "gpu-check: $bin/$p is missing"; exit 1; }
done

# --- The host ------------------------------------------------------------------------------------
host_ld=${LD_LIBRARY_PATH-}
host_ld_set=${LD_LIBRARY_PATH+1}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores$(grep -q avx512f /proc/cpuinfo || echo ', no AVX-512')"
  [[ -f $pack/BUILD_INFO ]] && sed 's/^/build: /' "$pack/BUILD_INFO"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,power.limit \
      --format=csv,noheader | sed 's/^/gpu: /'
  else
    echo "gpu: nvidia-smi not found"
  fi
} >"$results/system.txt" 2>&1
nvidia-smi >"$results/nvidia-smi.txt" 2>&1

# The interpreter with torch, in the host's own environment.
python=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import torch' >/dev/null 2>&1; then
    python=$(command -v "$c")
    break
  fi
done
if [[ -n $python ]]; then
  "$python" - >>"$results/system.txt" 2>&1 <<'EOF'
import sys, torch
print(f"python: {sys.executable} {sys.version.split()[0]}")
print(f"torch: {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'})")
EOF
else
  echo "python: no interpreter with torch (python3, /usr/bin/python3; or set PYTHON)" >>"$results/system.txt"
fi

# The host's CUDA libraries for our programs: the first folder that has each one.
cuda_dirs=()
for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu; do
  [[ -d $d ]] && cuda_dirs+=("$d")
done
while read -r d; do cuda_dirs+=("$d"); done < <(ldconfig -p 2>/dev/null |
  awk '/lib(cudart|cublasLt|nccl|cudnn)\.so/ { sub(/\/[^\/]*$/, "", $NF); print $NF }' | sort -u)
if [[ -n $python ]]; then
  while read -r d; do cuda_dirs+=("$d"); done < <("$python" -c '
import glob, os, nvidia
for root in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(root, "*", "lib"))): print(d)' 2>/dev/null)
fi
ours=$pack/lib
for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do
  found=
  for d in "${cuda_dirs[@]}"; do
    if [[ -e $d/$lib ]]; then found=$d; break; fi
  done
  if [[ -n $found ]]; then
    echo "cuda library: $found/$lib -> $(readlink -f "$found/$lib")" >>"$results/system.txt"
    [[ :$ours: == *:$found:* ]] || ours=$ours:$found
  else
    echo "cuda library: $lib not found" >>"$results/system.txt"
  fi
done
ldconfig -p 2>/dev/null | awk '/libcudnn\.so/ { print "host cudnn: " $NF }' >>"$results/system.txt"
# The host's C++ runtime unless it is too old for our programs.
if [[ -d $pack/lib/cxx ]] &&
  LD_LIBRARY_PATH=$ours "$bin/gpu_train_bench" --help 2>&1 | grep -q 'GLIBCXX\|CXXABI'; then
  ours=$ours:$pack/lib/cxx
  echo "c++ runtime: the pack's (the host's is older)" >>"$results/system.txt"
fi
echo "LD_LIBRARY_PATH for our programs: $ours" >>"$results/system.txt"
LD_LIBRARY_PATH=$ours ldd "$bin/test_cuda" >"$results/ldd-test_cuda.txt" 2>&1
cat "$results/system.txt"

# gpu_train_bench's Python child gets the host's environment back.
wrapper=$results/python-host-env
{
  echo '#!/bin/sh'
  echo '# The PyTorch side of gpu_train_bench runs with the host'"'"'s LD_LIBRARY_PATH, not the pack'"'"'s.'
  if [[ -n $host_ld_set ]]; then
    printf 'export LD_LIBRARY_PATH=%q\n' "$host_ld"
  else
    echo 'unset LD_LIBRARY_PATH'
  fi
  printf 'exec %q "$@"\n' "${python:-python3}"
} >"$wrapper"
chmod +x "$wrapper"

# A CUDA tool: on PATH, in the toolkit's folders, or in the Python environment's nvidia/ packages.
find_tool() {
  local name=$1 c
  command -v "$name" && return
  for c in ${CUDA_HOME:+$CUDA_HOME/bin/$name} /usr/local/cuda/bin/"$name" \
    /usr/local/cuda/"$name"/"$name" /usr/local/cuda-13*/bin/"$name" /opt/nvidia/*/bin/"$name"; do
    [[ -x $c ]] && { echo "$c"; return; }
  done
  [[ -n $python ]] && "$python" -c '
import glob, os, sys, nvidia
for root in nvidia.__path__:
    for c in sorted(glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True)):
        if os.access(c, os.X_OK) and os.path.isfile(c): print(c); sys.exit()' "$name" 2>/dev/null
}
sanitizer=$(find_tool compute-sanitizer | head -1)
cuobjdump=$(find_tool cuobjdump | head -1)

# --- Stages --------------------------------------------------------------------------------------
# stage NAME TIMEOUT CMD...: output to NAME.log; one line in the summary.
stage() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "==> $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$results/$name.log" 2>&1
  local rc=$?
  tail -n 5 "$results/$name.log"
  local verdict=ok
  if [[ $rc == 124 || $rc == 137 ]]; then
    verdict="timed out after ${limit}s"
  elif [[ $rc != 0 ]]; then
    verdict="failed (exit $rc)"
  fi
  [[ $verdict == ok ]] || failed=1
  say "$name: $verdict in $((SECONDS - start))s"
}

stage test_cuda "$test_timeout" env LD_LIBRARY_PATH="$ours" "$bin/test_cuda" \
  --gtest_output=xml:"$results/test_cuda.xml"
grep -E '^\[  (PASSED|SKIPPED|FAILED) *\] [0-9]+ test' "$results/test_cuda.log" | sed 's/^/  test_cuda /' |
  tee -a "$summary"
# Skipped is not passed: name them (on one GPU: the two-GPU test and the no-device checks).
skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \(' "$results/test_cuda.log")
if [[ $skipped -gt 5 ]]; then
  say "  test_cuda: $skipped tests skipped: no usable GPU? (test_cuda.log says why)"
  failed=1
else
  grep -E '^\[  SKIPPED \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \(' "$results/test_cuda.log" | sed 's/^/  /' |
    tee -a "$summary"
fi

if [[ $sanitizers == 1 && -z $sanitizer ]]; then
  say "memcheck, racecheck: compute-sanitizer not found"
  failed=1
elif [[ $sanitizers == 1 ]]; then
  "$sanitizer" --version 2>&1 | tail -1 | sed 's/^/compute-sanitizer: /' | tee -a "$summary"
  stage memcheck "$memcheck_timeout" env LD_LIBRARY_PATH="$ours" "$sanitizer" --tool memcheck \
    --error-exitcode 99 "$bin/test_cuda" --gtest_filter="$memcheck_filter"
  grep -E 'ERROR SUMMARY' "$results/memcheck.log" | sed 's/^=* */  memcheck /' | tee -a "$summary"
  # API errors are reported with the host frames of the call: name the library that made each.
  awk '/Program hit .* on CUDA API call to/ { api = $0; getline; lib = "";
         while ($0 ~ /Host Frame|Saved host backtrace/) { if (lib == "" && $0 ~ /Host Frame/ && $0 !~ /libcuda(rt)?\.so/) lib = $0; if (getline <= 0) break }
         sub(/^=* */, "", api); sub(/^=* */, "", lib); print "  memcheck " api " <- " lib }' \
    "$results/memcheck.log" | sort | uniq -c | tee -a "$summary"
  stage racecheck "$racecheck_timeout" env LD_LIBRARY_PATH="$ours" "$sanitizer" --tool racecheck \
    --error-exitcode 99 "$bin/test_cuda" --gtest_filter="$racecheck_filter"
  grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$results/racecheck.log" | sed 's/^=* */  racecheck /' |
    tee -a "$summary"
fi

# The attention kernels as the device runs them (when the host has cuobjdump): the flash kernels'
# instructions and registers, to study away from the GPU.
if [[ -n $cuobjdump ]]; then
  "$cuobjdump" -sass "$bin/test_cuda" 2>/dev/null |
    awk '/Function : .*attention_forward_kernel/ { on = 1 } on { print } on && /\.{10}/ { exit }' \
      >"$results/attention_forward_kernel.sass"
  "$cuobjdump" -sass "$bin/test_cuda" 2>/dev/null |
    awk '/Function : .*flash_/ { on = 1 } /Function : / && !/flash_/ { on = 0 } on { print }' \
      >"$results/flash_attention.sass"
  "$cuobjdump" -res-usage "$bin/test_cuda" 2>/dev/null | grep -A1 'flash_' \
    >"$results/flash_attention.res-usage"
fi

# shellcheck disable=SC2086 # the arguments are a list
stage attention_bench "$bench_timeout" env LD_LIBRARY_PATH="$ours" "$bin/attention_bench" \
  $attention_args --python "$wrapper"
grep '^{' "$results/attention_bench.log" >"$results/attention_bench.jsonl"
sed -n '/causal, bf16;/,$p' "$results/attention_bench.log" | tee -a "$summary"

# shellcheck disable=SC2086 # the arguments are a list
stage gpu_train_bench "$bench_timeout" env LD_LIBRARY_PATH="$ours" "$bin/gpu_train_bench" \
  $bench_args --python "$wrapper"
grep '^{' "$results/gpu_train_bench.log" >"$results/gpu_train_bench.jsonl"
sed -n '/B=[0-9]* T=[0-9]*, /,$p' "$results/gpu_train_bench.log" | tee -a "$summary"

echo
echo "gpu-check: results in $results"
exit $failed
