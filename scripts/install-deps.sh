#!/usr/bin/env bash
# Installs every Debian package meshtrain needs to build, test, demo and benchmark.
# Idempotent: packages already present are skipped by apt; `apt-get update` runs once per call.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  libopenblas-openmp-dev libopenblas0-openmp
  libssl-dev libxxhash-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libcpp-httplib-dev
  zlib1g-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev
  python3 python3-torch python3-numpy
  fortunes fortunes-min dataset-fashion-mnist
  iproute2 procps time
  clang libclang-rt-14-dev
  prometheus chromium
  libgloo-dev openmpi-bin libopenmpi-dev
  etcd-server etcd-client
  munge slurmctld slurmd slurm-client
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The manifests under deploy/k8s are rendered with `kubectl kustomize` (Debian's
# kubernetes-client) and validated with node (Debian's nodejs and npm). A machine that already has
# a kubectl with kustomize, or a node with npm, from another source keeps it: installing Debian's
# beside it would clash over the same files.
if ! kubectl kustomize --help >/dev/null 2>&1; then missing+=(kubernetes-client); fi
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Kubernetes schema validator (deploy/k8s/validate): npm packages pinned by the lock file.
validate_dir="$(cd "$(dirname "$0")/.." && pwd)/deploy/k8s/validate"
if [[ ! -d $validate_dir/node_modules/kubernetes-models ]]; then
  echo "install-deps: installing the manifest validator's npm packages"
  npm ci --prefix "$validate_dir" --no-audit --no-fund --loglevel=error
fi

# The S3-compatible server of the s3:// checkpoint tests and benchmark (tests/s3server): npm's
# s3rver, pinned by the lock file.
s3rver_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/s3server"
if [[ ! -f $s3rver_dir/node_modules/s3rver/bin/s3rver.js ]]; then
  echo "install-deps: installing the test S3 server (s3rver)"
  npm ci --prefix "$s3rver_dir" --no-audit --no-fund --loglevel=error
fi

# Debian's python3-torch must run on OpenBLAS, not the reference BLAS: select the OpenMP build
# (also when every package was already there: the benchmarks compare against PyTorch on it).
for alt in libblas.so.3 liblapack.so.3; do
  cand=$(update-alternatives --list "${alt}-x86_64-linux-gnu" 2>/dev/null | grep openblas-openmp | head -1 || true)
  cur=$(update-alternatives --query "${alt}-x86_64-linux-gnu" 2>/dev/null | sed -n 's/^Value: //p' || true)
  if [[ -n "$cand" && "$cand" != "$cur" ]]; then
    $SUDO update-alternatives --set "${alt}-x86_64-linux-gnu" "$cand" >/dev/null
  fi
done
echo "install-deps: done"
