#!/usr/bin/env bash
# Installs the Debian packages jumbo builds and tests with. Idempotent and fast when nothing
# is missing: it asks dpkg first and touches apt only for what is absent.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git python3 ccache
  openmpi-bin libopenmpi-dev
  libopenblas-openmp-dev libhdf5-openmpi-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libsentencepiece-dev sentencepiece libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcurl4-openssl-dev python3-h5py python3-botocore
  libcpp-httplib-dev python3-torch
  libfabric-dev python3-yaml
  slurmctld slurmd slurm-client munge
  sudo
  iproute2 util-linux
  python3-prometheus-client openssl curl
)

# Root runs apt directly (containers, CI); anyone else goes through sudo.
as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

is_installed() {
  [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

missing=()
for package in "${packages[@]}"; do
  is_installed "$package" || missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# With the pthread OpenBLAS installed as well, Debian may select it for libblas.so.3 and
# libopenblas.so.0. Its threads fight our OpenMP loops (~30% slower), so select the OpenMP
# build whenever both are present.
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
for library in libblas.so.3 libopenblas.so.0 liblapack.so.3; do
  name="$library-$multiarch"
  want="/usr/lib/$multiarch/openblas-openmp/$library"
  update-alternatives --list "$name" >/dev/null 2>&1 || continue
  update-alternatives --list "$name" | grep -qx "$want" || continue
  current=$(update-alternatives --query "$name" | sed -n 's/^Value: //p')
  if [[ $current == "$want" ]]; then
    echo "install-deps: $library -> openblas-openmp (already)"
  else
    echo "install-deps: $library: switching ${current:-none} -> $want"
    as_root update-alternatives --set "$name" "$want"
  fi
done

# Test tools Debian does not package, from npm into the user's cache (tests find them there):
# s3rver, a local S3 API for the S3 checkpoint tests (tests/ckpt/s3.sh), and the official
# `openai` client for the serve API test (tests/serve/openai_sdk.mjs). Node and npm come
# from Debian when npm is absent.
npm_prefix=$HOME/.cache/jumbo/npm
npm_install_pinned() {
  local name=$1 version=$2
  if [[ $(cat "$npm_prefix/node_modules/$name/package.json" 2>/dev/null) == *"\"version\": \"$version\""* ]]; then
    echo "install-deps: $name@$version present ($npm_prefix)"
    return
  fi
  if ! command -v npm >/dev/null; then
    echo "install-deps: installing nodejs npm"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q
    as_root apt-get install -y -q --no-install-recommends nodejs npm
  fi
  echo "install-deps: installing $name@$version into $npm_prefix"
  mkdir -p "$npm_prefix"
  npm install --prefix "$npm_prefix" --no-audit --no-fund --save-exact "$name@$version"
}
npm_install_pinned s3rver 3.7.1
# 6.x is the last major line of openai that runs on Debian's Node 20 (7.x needs Node 22).
npm_install_pinned openai 6.49.0
# Hugging Face's own JavaScript tokenizer and Jinja renderer, the independent references for
# tokenizer.json encoding (tests/data/hf_tokenizer.sh) and chat templates (tests/data/jinja_templates.sh).
npm_install_pinned @huggingface/tokenizers 0.2.0
npm_install_pinned @huggingface/jinja 0.5.13
