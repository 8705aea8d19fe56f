#!/usr/bin/env bash
# Builds the CUDA programs and packs them for a GPU host that has no package registry and none of
# our Debian libraries: only the NVIDIA driver, the CUDA runtime libraries and (for the comparison)
# Python with PyTorch. A short GPU window then goes to measurements, not to set-up.
#
# The pack (a folder, and the same as OUT.tar.gz):
#   bin/      test_cuda, meshtrain, gpu_train_bench, attention_bench, stripped
#   lib/      every library they load that is not CUDA's or the C runtime's (found with ldd):
#             OpenBLAS with libgfortran and libquadmath, libgomp, OpenSSL, toml++, xxhash,
#             cpp-httplib, brotli ...; lib/cxx/ the C++ runtime, for hosts whose own is older
#   bench/python/, tests/python/gpt_torch.py   the PyTorch side of the two benchmarks
#   configs/demo.toml                          for a short `meshtrain train` on cuda
#   scripts/gpu-check.sh                       what runs on the GPU host (docs/gpu.md)
#   BUILD_INFO                                 commit, compiler, CUDA toolkit, libraries packed
# CUDA's own libraries (cudart, cuBLASLt, NCCL: hundreds of MB) are not packed: gpu-check.sh finds
# the host's.
#
# Usage: scripts/gpu-bundle.sh [--build DIR] [--out DIR] [--arch LIST] [--native] [--no-build]
#   --build DIR  build folder (default build-gpu); configured for CUDA, Release
#   --arch LIST  CUDA architectures, as CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200; 80 for
#                A100, "80;90" for both)
#   --out DIR    the pack (default build-gpu/bundle); replaced if present
#   --native     tune for this machine's CPU (MESHTRAIN_NATIVE=ON; faster to build where a native
#                build is already cached, but the GPU host's CPU must have the same instructions)
#   --no-build   pack what DIR already holds
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu"
out="build-gpu/bundle"
native=OFF
arch=90
do_build=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --native) native=ON; shift ;;
    --no-build) do_build=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

programs=(test_cuda meshtrain gpu_train_bench attention_bench)

if [[ $do_build == 1 ]]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DMESHTRAIN_NATIVE="$native" "${launcher[@]}" >/dev/null
  cmake --build "$build" --target "${programs[@]}" -j "${JOBS:-$(nproc)}"
fi
for p in "${programs[@]}"; do
  [[ -x $build/$p ]] || { echo "gpu-bundle: $build/$p is missing (build it, or drop --no-build)" >&2; exit 1; }
done
grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.' "$build/CMakeCache.txt" ||
  { echo "gpu-bundle: $build was not configured with CUDA" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/bench/python" "$out/tests/python" "$out/configs" "$out/scripts"
for p in "${programs[@]}"; do
  strip -o "$out/bin/$p" "$build/$p"
done

# The libraries to pack: whatever ldd resolves, less the driver's and CUDA's (the host's must
# match its driver) and the C runtime's (the host's dynamic loader must match its own libc).
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-ml|libnvrtc|libcudnn)\.so'
missing=0
while read -r name path; do
  [[ $name =~ $skip ]] && continue
  if [[ $path == "not found" ]]; then
    echo "gpu-bundle: ldd cannot find $name" >&2
    missing=1
    continue
  fi
  # The C++ runtime apart: gpu-check.sh uses it only where the host's is older than ours.
  if [[ $name =~ ^(libstdc\+\+|libgcc_s)\.so ]]; then
    mkdir -p "$out/lib/cxx"
    cp -L "$path" "$out/lib/cxx/$name"
  else
    cp -L "$path" "$out/lib/$name"
  fi
done < <(for p in "${programs[@]}"; do ldd "$build/$p"; done |
  awk '$2 == "=>" { print $1, ($3 == "not" ? "not found" : $3) }' | sort -u)
[[ $missing == 0 ]] || { echo "gpu-bundle: unresolved libraries (see above)" >&2; exit 1; }

cp bench/python/*.py "$out/bench/python/"
cp tests/python/gpt_torch.py "$out/tests/python/"
cp configs/demo.toml "$out/configs/"
cp scripts/gpu-check.sh "$out/scripts/"

nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), MESHTRAIN_NATIVE=$(sed -n 's/^MESHTRAIN_NATIVE:BOOL=//p' "$build/CMakeCache.txt")"
  echo "nvcc: $("$nvcc" --version | grep -m1 -o 'release [0-9.]*, V[0-9.]*')"
  echo "CUDA architectures: $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "libraries loaded from the host: $(for p in "${programs[@]}"; do ldd "$build/$p"; done |
    awk '$2 == "=>" { print $1 }' | grep -E '^lib(cudart|cublas|cublasLt|nccl|cudnn)\.so' | sort -u | xargs)"
  echo "libraries packed: $(cd "$out/lib" && find . -type f | sed 's|^\./||' | sort | xargs)"
} >"$out/BUILD_INFO"

tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1), $(du -h "$out.tar.gz" | cut -f1) gzipped)"
echo "on the GPU host: tar xzf $(basename "$out").tar.gz && bash $(basename "$out")/scripts/gpu-check.sh"
