#!/usr/bin/env bash
# Checkpoints on object storage: upload throughput of the s3:// checkpoint client against
# `curl --upload-file` of the same bytes, and how long a training step waits for the uploads,
# against a local S3-compatible server (npm's s3rver from tests/s3server, as the tests use).
#
# Usage: bench/s3_upload_bench.sh [BUILD] [-- ARGS of s3_upload_bench]
# Defaults: BUILD build; s3_upload_bench's own defaults (256 MiB, 5 rounds; parts of 64 MiB, 4 in
# flight, for files of 8 parts or more; 40 steps of ~200 ms per phase, a 128 MiB checkpoint every
# 5 steps). Builds nothing:
# BUILD must hold s3_upload_bench (cmake --build BUILD --target s3_upload_bench).
# The server is started on a free port with its data in a temporary directory, polled until it
# answers, and killed and reaped on every exit. S3_BENCH_SERVER_NICE=N runs it at nice N (a
# stand-in for a server on another machine: on a small VM the server's own CPU time competes with
# the training loop). Output: s3_upload_bench's JSON lines and table.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build}"
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
bin="$build/s3_upload_bench"
server="$repo/tests/s3server/node_modules/s3rver/bin/s3rver.js"
[[ -x $bin ]] || { echo "s3_upload_bench: $bin is missing (cmake --build $build --target s3_upload_bench)" >&2; exit 1; }
[[ -f $server ]] || { echo "s3_upload_bench: s3rver is missing (scripts/install-deps.sh)" >&2; exit 1; }

data="$(mktemp -d)"
pid=""
cleanup() {
  if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$data"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nice -n "${S3_BENCH_SERVER_NICE:-0}" node "$server" -a 127.0.0.1 -p "$port" -d "$data/s3" --configure-bucket bench >"$data/s3rver.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  grep -q "S3rver listening" "$data/s3rver.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$data/s3rver.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "S3rver listening" "$data/s3rver.log" || { echo "s3rver did not start" >&2; exit 1; }

export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
"$bin" --bucket bench --dir "$data/scratch" "$@"
