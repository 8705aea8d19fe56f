# shellcheck shell=bash
# Shell helpers shared by the training benchmarks that run meshtrain on the demo data
# (bench/ddp_bench.sh, zero_bench.sh, tp_bench.sh, pipeline_bench.sh, plan_validate.sh). Sourced,
# not run. The sourcing script sets
# BENCH_NAME (prefix of its messages), BUILD (absolute build directory), PY (the interpreter with
# python3-torch), WARMUP, STEPS_A and STEPS_B, and runs from the repository root.

# check_cases "ALL" "CHOSEN": exits 2 with one line when a case of --cases is not one of ALL.
check_cases() {
  local c
  for c in $2; do
    if [[ " $1 " != *" $c "* ]]; then
      echo "$BENCH_NAME: unknown case $c in --cases; the cases are: $1" >&2
      exit 2
    fi
  done
}

# --blas-core NAME|native: which kernels OpenBLAS runs, for every case ("" leaves the environment
# alone, "native" lets OpenBLAS pick the kernels for this CPU itself).
apply_blas_core() {
  case $1 in
    "") ;;
    native) unset OPENBLAS_CORETYPE ;;
    *) export OPENBLAS_CORETYPE=$1 ;;
  esac
}

# The demo dataset (the text of Debian's fortunes package), prepared as scripts/demo.sh does.
DATA=data/fortunes
prepare_demo_data() {
  [[ -f $DATA/train_000000.bin ]] && return 0
  local src=/usr/share/games/fortunes
  if [[ ! -d $src ]]; then
    echo "$BENCH_NAME: $src is missing; run scripts/install-deps.sh (package fortunes)" >&2
    exit 2
  fi
  mkdir -p data
  find -L "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort |
    xargs cat > data/fortunes.txt
  "$BUILD/meshtrain" data prepare --input data/fortunes.txt --out "$DATA" --val-fraction 0.05
}

# model: n_layer n_embd n_head block_size batch_size
config_shape() {
  case $1 in
    a) echo "4 128 4 128 8" ;;
    b) echo "6 384 6 256 4" ;;
    *) echo "$BENCH_NAME: unknown config $1" >&2; exit 2 ;;
  esac
}
config_steps() { [[ $1 == b ]] && echo "$STEPS_B" || echo "$STEPS_A"; }

# meshtrain train arguments for config $1 writing into directory $2.
train_args() {
  local layers embd heads block batch
  read -r layers embd heads block batch <<< "$(config_shape "$1")"
  echo train --config configs/demo.toml \
    --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads" \
    --set model.block_size="$block" --set model.vocab_size=257 --set data.batch_size="$batch" \
    --set data.dir="$DATA" --set data.val_batches=1 \
    --set train.threads=1 --set train.steps="$(config_steps "$1")" --set train.eval_interval=0 \
    --set train.sample_tokens=0 --set train.save_weights=false --set train.out_dir="$2" \
    --set ckpt.interval=0 --set ckpt.resume=false
}

# Turns the metrics.jsonl files of one meshtrain measurement into a JSON line.
# summarize [--lockstep] [--comm] [--rss-log LOG] CASE CONFIG ROUND TOKENS_PER_STEP METRICS...
#   --lockstep  (two independent runs) adds their lock-step ceiling and step-time spread;
#   --comm      adds the median exposed communication of the first run (rank 0);
#   --rss-log   adds each rank's peak RSS from the "[rank N] peak_rss_kb=K" lines of a meshrun log
#               and, where the log has it, the memory at rest meshtrain reports after a step.
summarize() {
  local lockstep=0 comm=0 rss_log=""
  while [[ $1 == --* ]]; do
    case $1 in
      --lockstep) lockstep=1; shift ;;
      --comm) comm=1; shift ;;
      --rss-log) rss_log=$2; shift 2 ;;
      *) echo "$BENCH_NAME: summarize: unknown option $1" >&2; exit 2 ;;
    esac
  done
  "$PY" - "$BENCH_NAME" "$WARMUP" "$lockstep" "$comm" "$rss_log" "$@" << 'EOF'
import json, re, statistics, sys
name, warmup, lockstep, comm, rss_log = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
case, config, rnd, tokens_per_step = sys.argv[6:10]
tokens_per_step = int(tokens_per_step)
runs = []
by_step = []
for path in sys.argv[10:]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "event" not in r and "step_s" in r and r.get("step", 0) > warmup]
    if not rows:
        sys.exit(f"{name}: no timed steps in {path}")
    by_step.append({r["step"]: r["step_s"] for r in rows})
    step = statistics.median(r["step_s"] for r in rows)
    comm_s = statistics.median(r.get("comm_s", 0.0) for r in rows)
    runs.append({"step_s": step, "comm_s": comm_s, "steps": len(rows),
                 "tokens_per_s": tokens_per_step / step})
out = {"case": case, "config": config, "round": int(rnd), "impl": "meshtrain",
       "tokens_per_step": tokens_per_step, "runs": len(runs),
       "step_ms_median": [r["step_s"] * 1e3 for r in runs],
       "tokens_per_s": sum(r["tokens_per_s"] for r in runs)}
if lockstep == "1" and len(by_step) == 2:
    # What any lock-step scheme could reach on this host: a synchronous step lasts as long as the
    # slower rank's, so pair the two independent runs step by step and take the slower of each
    # pair (the runs start together, so step k of both ran at about the same time).
    common = sorted(set(by_step[0]) & set(by_step[1]))
    slower = [max(by_step[0][k], by_step[1][k]) for k in common]
    out["lockstep_tokens_per_s"] = 2 * tokens_per_step / statistics.median(slower)
    out["step_cv"] = [statistics.pstdev(d.values()) / statistics.mean(d.values())
                      for d in by_step]
if comm == "1":
    out["comm_ms_median"] = runs[0]["comm_s"] * 1e3
    out["exposed_comm_fraction"] = runs[0]["comm_s"] / runs[0]["step_s"]
if rss_log:
    peaks = {}
    for line in open(rss_log, errors="replace"):
        m = re.match(r"\[rank (\d+)\] peak_rss_kb=(\d+)\s*$", line)
        if m:
            peaks[int(m.group(1))] = int(m.group(2))
    if not peaks:
        sys.exit(f"{name}: no peak_rss_kb lines in {rss_log}")
    out["peak_rss_mb"] = [peaks[r] / 1024 for r in sorted(peaks)]
    # The training state rank 0 holds between steps, as meshtrain counts it (when it says).
    for line in open(rss_log, errors="replace"):
        m = re.search(r"memory at rest after step \d+: ([0-9.]+) MiB per rank", line)
        if m:
            out["at_rest_mib"] = float(m.group(1))
            break
print(json.dumps(out))
EOF
}

# The JSON line a PyTorch peer printed last in OUT, tagged with the case, config and round.
# torch_row CASE CONFIG ROUND OUT
torch_row() {
  "$PY" -c 'import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
r["model"] = r.pop("config")
r.update(case=sys.argv[2], config=sys.argv[3], round=int(sys.argv[4]))
print(json.dumps(r))' "$4" "$1" "$2" "$3"
}

# What ran the matrix products in the meshtrain runs whose logs are given, as meshtrain's start
# line reports it: "GEMM oneDNN 2.6.3 brg:avx512_core" (train.gemm = "onednn"), or "BLAS " and
# the kernels OpenBLAS chose (or OPENBLAS_CORETYPE forced).
meshtrain_blas() {
  cat "$@" 2> /dev/null | grep -o '; \(BLAS\|GEMM\) [^;]*' | head -n 1 | sed 's/^; //' || true
}
