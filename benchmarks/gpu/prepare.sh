#!/usr/bin/env bash
# Prepares the one-shot GPU check (benchmarks/gpu/check.sh) here, where the build tools are.
# The GPU machine has the driver, CUDA 13 (toolkit or pip wheels) and NCCL but none of
# jumbo's Debian libraries and no network, so this builds the CUDA binaries (for one
# architecture, default sm_90: H100/H200) and packs them into .gpu-bundle.tar.xz (git-ignored):
#   bin/   jumbo, test_gpu, bench_gpu_kernels, RUNPATH $ORIGIN/../lib
#   lib/   every shared library they load (RUNPATH $ORIGIN), except the C library's (glibc in
#          any part: the machine's own must serve, a second copy breaks its programs) and the
#          CUDA ones the machine has (libcuda, libcudart, libcublas*, libnccl)
#   lib/fallback/  GCC's libstdc++ and libgcc_s, which check.sh adds for the bundled
#          binaries only, and only when the machine's own are older than they need
# No LD_LIBRARY_PATH is needed for the bundle, so other commands keep the system's libraries.
# Pass that file as `carry` to the device run, then: bash benchmarks/gpu/check.sh
#   JUMBO_GPU_ARCH=80 benchmarks/gpu/prepare.sh     # an A100 instead
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
arch=${JUMBO_GPU_ARCH:-90}
build=build-gpu-sm$arch

# patchelf writes the RUNPATHs (Debian's package, as scripts/install-deps.sh installs others).
if ! command -v patchelf >/dev/null; then
  echo "prepare: installing patchelf"
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends patchelf ||
    { "${sudo[@]}" apt-get update -q && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends patchelf; }
fi

# -march=x86-64-v3: the GPU machine's CPU is not this one (no -march=native).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DJUMBO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DJUMBO_ARCH_FLAGS=-march=x86-64-v3 >/dev/null
cmake --build "$build" -j2 --target jumbo test_gpu bench_gpu_kernels

# The C library's parts: by name, and on Debian whatever its libc6 package ships.
is_glibc() {
  case $(basename "$1") in
    ld-linux* | libc.so.* | libm.so.* | libmvec.so.* | libdl.so.* | libpthread.so.* | \
      librt.so.* | libresolv.so.* | libnss_* | libnsl.so.* | libutil.so.* | libanl.so.* | \
      libBrokenLocale.so.* | libthread_db.so.* | libc_malloc_debug.so.* | libcrypt.so.*)
      return 0 ;;
  esac
  local path owner
  for path in "$1" "$(readlink -f "$1")" "${1/#\/usr\/lib\//\/lib\/}"; do
    owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
    [[ $owner == libc6 || $owner == libc6-* ]] && return 0
  done
  return 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib/fallback"
cp "$build/jumbo" "$build/tests/test_gpu" "$build/benchmarks/bench_gpu_kernels" "$stage/bin/"
missing=$(ldd "$stage"/bin/* | grep "not found" | sort -u || true)
[[ -z $missing ]] || { echo "prepare: libraries not found here: $missing" >&2; exit 1; }
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  name=$(basename "$lib")
  case $name in
    libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.*) continue ;;  # the machine's
    libstdc++.so.* | libgcc_s.so.*) cp -L "$lib" "$stage/lib/fallback/"; continue ;;
  esac
  is_glibc "$lib" || cp -L "$lib" "$stage/lib/"
done
# shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
for binary in "$stage"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$binary"; done
# shellcheck disable=SC2016
for lib in "$stage"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$lib"; done

# The bundled libraries load from the bundle through the RUNPATHs alone (no LD_LIBRARY_PATH),
# and patchelf left the binaries runnable.
for binary in "$stage"/bin/*; do
  env -u LD_LIBRARY_PATH ldd "$binary" | awk '/=> \// {print $1, $3}' |
    while read -r name path; do
      if [[ -e $stage/lib/$name && $(realpath "$path") != "$(realpath "$stage/lib/$name")" ]]; then
        echo "prepare: $(basename "$binary") loads $name from $path, not the bundle" >&2
        exit 1
      fi
    done
done
env -u LD_LIBRARY_PATH "$stage/bin/test_gpu" --gtest_list_tests >/dev/null
env -u LD_LIBRARY_PATH "$stage/bin/jumbo" --help >/dev/null

echo "$arch" >"$stage/arch"
git describe --always --dirty --abbrev=7 >"$stage/commit" 2>/dev/null || echo unknown >"$stage/commit"
tar -C "$stage" -cJf .gpu-bundle.tar.xz .
echo "prepare: .gpu-bundle.tar.xz ($(du -h .gpu-bundle.tar.xz | cut -f1)), sm_$arch," \
  "$(find "$stage/lib" -maxdepth 1 -name '*.so*' | wc -l) libraries, no glibc, RUNPATH \$ORIGIN/../lib"
