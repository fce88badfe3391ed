#!/usr/bin/env bash
# Prepares the one-shot GPU check (benchmarks/gpu/check.sh) here, where the build tools are.
# The GPU machine has the CUDA toolkit and driver but none of jumbo's Debian libraries and no
# network, so this builds the CUDA binaries (for one architecture, default sm_90: H100/H200)
# and packs them with every shared library they load, except glibc and the CUDA libraries
# the machine has (libcudart, libcublasLt, libnccl), into .gpu-bundle.tar.xz (git-ignored).
# Pass that file as `carry` to the device run, then: bash benchmarks/gpu/check.sh
#   JUMBO_GPU_ARCH=80 benchmarks/gpu/prepare.sh     # an A100 instead
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
arch=${JUMBO_GPU_ARCH:-90}
build=build-gpu-sm$arch
# -march=x86-64-v3: the GPU machine's CPU is not this one (no -march=native).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DJUMBO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DJUMBO_ARCH_FLAGS=-march=x86-64-v3 >/dev/null
cmake --build "$build" -j2 --target jumbo test_gpu bench_gpu_kernels

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/jumbo" "$build/tests/test_gpu" "$build/benchmarks/bench_gpu_kernels" "$stage/bin/"
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;  # glibc
    libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.*) ;;  # the machine's own
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
echo "$arch" >"$stage/arch"
git rev-parse --short HEAD >"$stage/commit" 2>/dev/null || echo unknown >"$stage/commit"
tar -C "$stage" -cJf .gpu-bundle.tar.xz .
echo "prepare: .gpu-bundle.tar.xz ($(du -h .gpu-bundle.tar.xz | cut -f1)), sm_$arch, $(ls "$stage/lib" | wc -l) libraries"
