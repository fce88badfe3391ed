#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured action for jumbo (parallelcluster/README.md). ParallelCluster
# runs it as root on every node once the node is configured (Slurm set up, /fsx mounted):
#
#   1. head node only: installs jumbo's build packages (scripts/install-deps.sh's list, mapped
#      to Ubuntu 22.04), NCCL into /fsx/jumbo/deps/nccl, and builds jumbo with the CUDA backend
#      once onto /fsx/jumbo (under a lock; skipped while the sources are unchanged), with the
#      shared libraries it needs beside it;
#   2. compute nodes install nothing (a boot counts against Slurm's resume timeout): they check
#      that /fsx/jumbo's binary finds every library, GPU nodes that the aws-ofi-nccl plugin is
#      there, and log it; `jumbo doctor` checks each node again before every job;
#   3. appends cloudwatch-agent.json to the CloudWatch agent's configuration (EMF metrics).
#
# Open MPI, libfabric and the EFA provider are the AWS EFA installer's, already on every
# ParallelCluster AMI under /opt/amazon/openmpi and /opt/amazon/efa; jumbo is built against them.
# So from install-deps.sh's list these are NOT installed here, on purpose:
#   openmpi-bin libopenmpi-dev  Ubuntu's Open MPI, built without EFA (libfabric efa provider)
#   libhdf5-openmpi-dev         depends on Ubuntu's libopenmpi-dev: parallel HDF5 is built from
#                               source against /opt/amazon/openmpi instead (into /fsx/jumbo/deps)
#   libfabric-dev               /opt/amazon/efa has libfabric and its pkg-config file
#   slurmctld slurmd slurm-client munge   ParallelCluster's own Slurm lives in /opt/slurm
#   s3rver (npm)                only the S3 tests use it
# Ubuntu 22.04's cmake (3.22) is older than CMakeLists.txt's 3.25, so cmake comes from PyPI
# (pinned) on the head node, and gcc 12 (as on Debian 12) replaces the default gcc 11.
#
# Usage: on-node-configured.sh --role head|compute --artifacts s3://BUCKET/PREFIX
#                              [--arch MARCH] [--cuda-arch SM] [--no-cuda] [--nccl-version V]
#                              [--cmake-arg ARG]... [--rebuild] [--dry-run]
#   --artifacts  the S3 prefix holding jumbo-src.tar.gz (git archive of the repository) and
#                cloudwatch-agent.json
#   --arch       -march for jumbo's CPU kernels: the compute nodes' CPU (p4d: cascadelake)
#   --cuda-arch  CMAKE_CUDA_ARCHITECTURES for the CUDA backend; default 80 (p4d's A100; p5: 90)
#   --no-cuda    a CPU-only build (no NCCL): for a cluster without GPU queues
#   --nccl-version  the libnccl2 package version, e.g. 2.23.4-1+cuda12.6; default the newest
#                built for the node's CUDA toolkit
#   --rebuild    build even if this source tarball was built before (run by hand on the head node)
#   --dry-run    print what would be done, change nothing (used by tests/cluster)
# Everything it does is logged to /var/log/jumbo-on-node-configured.log.
set -Eeuo pipefail

readonly SUPPORTED_OS=ubuntu2204 # must equal Image.Os in cluster.yaml (tests/cluster checks it)
readonly JUMBO_ROOT=${JUMBO_ROOT:-/fsx/jumbo}
readonly LOG_FILE=${JUMBO_ONC_LOG:-/var/log/jumbo-on-node-configured.log}
readonly MPI_HOME=/opt/amazon/openmpi
readonly EFA_HOME=/opt/amazon/efa
readonly CW_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
readonly CW_CONFIG=/opt/jumbo/cloudwatch-agent.json
readonly CUDA_HOME=/usr/local/cuda
# The EFA installer puts aws-ofi-nccl here (ParallelCluster AMIs); older AMIs used the second.
readonly OFI_NCCL_DIRS=(/opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib)
# NVIDIA's signed apt repository for Ubuntu 22.04 (docs.nvidia.com/cuda/cuda-installation-guide-linux,
# "Network Repo Installation for Ubuntu"): libnccl2 and libnccl-dev for each CUDA release.
readonly NVIDIA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64
readonly CMAKE_VERSION=3.31.6
readonly CMAKE_VENV=/opt/jumbo/cmake-$CMAKE_VERSION
readonly HDF5_VERSION=1.14.6
readonly HDF5_URL=https://github.com/HDFGroup/hdf5/releases/download/hdf5_$HDF5_VERSION/hdf5-$HDF5_VERSION.tar.gz
readonly HDF5_SHA256=e4defbac30f50d64e1556374aa49e574417c9e72c6b1de7a4ff88c4b1bea6e9b
readonly LOCK_WAIT_S=7200 # a build takes ~15 min; a lock older than this is someone else's crash

# scripts/install-deps.sh's packages under their Ubuntu 22.04 names (see above for the ones left out).
apt_packages=(
  build-essential gcc-12 g++-12 pkg-config git python3 python3-venv curl ca-certificates
  zlib1g-dev libopenblas-openmp-dev
  nlohmann-json3-dev libfmt-dev libspdlog-dev
  libsentencepiece-dev sentencepiece
  libgtest-dev libgmock-dev libbenchmark-dev
  libcurl4-openssl-dev python3-h5py python3-yaml
)
# Header-only libraries: from apt where this Ubuntu release has them, else built from source
# into $JUMBO_ROOT/deps by the head node. Each: "DIR URL SHA256 [CMAKE-ARG...]", DIR being the
# tarball's top directory.
declare -A source_fallback=(
  [libtomlplusplus-dev]="tomlplusplus-3.4.0 https://github.com/marzer/tomlplusplus/archive/refs/tags/v3.4.0.tar.gz 8517f65938a4faae9ccf8ebb36631a38c1cadfb5efa85d9a72e15b9e97d25155"
  [libcli11-dev]="CLI11-2.4.2 https://github.com/CLIUtils/CLI11/archive/refs/tags/v2.4.2.tar.gz f2d893a65c3b1324c50d4e682c0cdc021dd0477ae2c048544f39eed6654b699a -DCLI11_BUILD_TESTS=OFF -DCLI11_BUILD_EXAMPLES=OFF -DCLI11_BUILD_DOCS=OFF"
)

role="" artifacts="" arch=x86-64-v3 rebuild=0 dry_run=0 cuda=1 cuda_arch=80 nccl_version=""
cmake_extra=() from_source=() tmp_dir="" lock_dir="" region=""

log() { printf '%s on-node-configured: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
warn() { log "WARNING: $*"; }
die() {
  log "ERROR: $*"
  exit 1
}
# Runs a command, or only shows it under --dry-run.
run() {
  log "+ $*"
  ((dry_run)) || "$@"
}

usage() { sed -n '/^# Usage:/,/^# Everything/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

parse_args() {
  while (($#)); do
    case $1 in
      --role | --artifacts | --arch | --cuda-arch | --nccl-version | --cmake-arg)
        (($# >= 2)) || die "$1 needs a value"
        case $1 in
          --role) role=$2 ;;
          --artifacts) artifacts=${2%/} ;;
          --arch) arch=$2 ;;
          --cuda-arch) cuda_arch=$2 ;;
          --nccl-version) nccl_version=$2 ;;
          --cmake-arg) cmake_extra+=("$2") ;;
        esac
        shift 2
        ;;
      --rebuild) rebuild=1 && shift ;;
      --no-cuda) cuda=0 && shift ;;
      --dry-run) dry_run=1 && shift ;;
      -h | --help) usage && exit 0 ;;
      *) die "unknown argument '$1' (--help lists them)" ;;
    esac
  done
  # ParallelCluster's node facts, when present: the role if none was given, and the Region.
  if [[ -r /etc/parallelcluster/cfnconfig ]]; then
    local node_type
    node_type=$(sed -n 's/^cfn_node_type=//p' /etc/parallelcluster/cfnconfig | tr -d "\"'")
    region=$(sed -n 's/^cfn_region=//p' /etc/parallelcluster/cfnconfig | tr -d "\"'")
    if [[ -z $role ]]; then
      case $node_type in
        HeadNode) role="head" ;;
        ComputeFleet) role="compute" ;;
      esac
    fi
  fi
  [[ $role == head || $role == compute ]] || die "--role must be head or compute (got '${role}')"
  [[ $artifacts == s3://?* ]] || die "--artifacts must be an s3:// prefix (got '${artifacts}')"
  [[ $arch =~ ^[a-z0-9_.-]+$ ]] || die "--arch '$arch' is not a -march value"
  [[ $cuda_arch =~ ^[0-9]+(\;[0-9]+)*$ ]] || die "--cuda-arch '$cuda_arch': expected e.g. 80 or '80;90'"
  [[ -z $nccl_version || $nccl_version =~ ^[0-9.]+-[0-9]+\+cuda[0-9.]+$ ]] ||
    die "--nccl-version '$nccl_version': expected a libnccl2 version such as 2.23.4-1+cuda12.6"
}

on_error() {
  local rc=$? line=$1 cmd=$2
  log "ERROR: line $line: '$cmd' exited $rc; full log: $LOG_FILE"
}

cleanup() {
  [[ -z $lock_dir ]] || rm -rf "$lock_dir"
  [[ -z $tmp_dir ]] || rm -rf "$tmp_dir"
}

check_os() {
  local id="" version=""
  if [[ -r /etc/os-release ]]; then
    # shellcheck source=/dev/null
    id=$(. /etc/os-release && echo "${ID:-}")
    # shellcheck source=/dev/null
    version=$(. /etc/os-release && echo "${VERSION_ID:-}")
  fi
  if [[ "$id${version//./}" != "$SUPPORTED_OS" ]]; then
    if ((dry_run)); then
      warn "this is $id $version, not $SUPPORTED_OS (dry run: going on)"
    else
      die "this is $id $version; the script installs for Image.Os $SUPPORTED_OS only"
    fi
  fi
}

s3_get() { # s3_get S3_URL FILE
  local args=(s3 cp --only-show-errors)
  [[ -z $region ]] || args+=(--region "$region")
  run aws "${args[@]}" "$1" "$2"
}

# fetch URL SHA256 FILE: download once, verify the checksum every time.
fetch() {
  local url=$1 sum=$2 file=$3
  if [[ ! -f $file ]]; then
    run curl -fsSL --retry 5 --retry-delay 5 -o "$file.part" "$url"
    run mv "$file.part" "$file"
  fi
  ((dry_run)) || echo "$sum  $file" | sha256sum -c --quiet - || die "$file: checksum differs from $sum"
}

# ---------------------------------------------------------------- 1. packages, every node

install_packages() {
  export DEBIAN_FRONTEND=noninteractive
  # The AMI's own apt jobs (unattended upgrades at boot) may hold the lock for a while.
  local apt=(apt-get -q -o DPkg::Lock::Timeout=600 -o Acquire::Retries=5)
  run "${apt[@]}" update
  local package
  for package in "${!source_fallback[@]}"; do
    if ((dry_run)); then
      log "$package: from apt if this release has it, else from source on the head node"
    elif apt-cache show "$package" >/dev/null 2>&1; then
      apt_packages+=("$package")
    else
      log "$package: not in this release's archive; the head node builds it from source"
      from_source+=("$package")
    fi
  done
  run "${apt[@]}" install -y --no-install-recommends "${apt_packages[@]}"
  # A dependency must not bring Ubuntu's Open MPI: two libmpi.so.40 would fight at run time.
  if ((!dry_run)) && dpkg-query -W -f='${Status}\n' openmpi-bin libopenmpi-dev 2>/dev/null | grep -q 'install ok installed'; then
    die "apt installed Ubuntu's Open MPI (openmpi-bin/libopenmpi-dev); jumbo must use $MPI_HOME only"
  fi
  select_openblas_openmp
}

# As scripts/install-deps.sh: the pthread OpenBLAS fights jumbo's OpenMP loops (~30% slower).
select_openblas_openmp() {
  ((!dry_run)) || return 0
  local multiarch library name want
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
  for library in libblas.so.3 libopenblas.so.0 liblapack.so.3; do
    name=$library-$multiarch
    want=/usr/lib/$multiarch/openblas-openmp/$library
    update-alternatives --list "$name" 2>/dev/null | grep -qx "$want" || continue
    run update-alternatives --set "$name" "$want"
  done
}

check_efa() {
  ((!dry_run)) || return 0
  [[ -x $MPI_HOME/bin/mpicc ]] ||
    die "$MPI_HOME/bin/mpicc missing: expected the AWS EFA installer's Open MPI (ParallelCluster AMI)"
  efa_pkgconfig >/dev/null || die "no libfabric.pc under $EFA_HOME: expected the AWS EFA installer"
  if [[ $role == compute ]]; then
    # For the log only: jumbo doctor does the real checks before every run.
    "$EFA_HOME/bin/fi_info" -p efa -t FI_EP_RDM 2>&1 | head -n 4 || warn "fi_info found no EFA device"
  fi
}

efa_pkgconfig() {
  local dir
  for dir in "$EFA_HOME/lib/pkgconfig" "$EFA_HOME/lib64/pkgconfig"; do
    [[ -f $dir/libfabric.pc ]] && echo "$dir" && return 0
  done
  return 1
}

first_dir() { # first_dir DIR...: the first that exists (lib or lib64 differs between distributions)
  local dir
  for dir in "$@"; do [[ -d $dir ]] && echo "$dir" && return 0; done
  echo "$1"
}

# ---------------------------------------------------------------- NCCL and the CUDA toolkit

# The CUDA toolkit's version, "12.4" (ParallelCluster's official AMIs ship the toolkit at
# /usr/local/cuda; NCCL they do not).
cuda_version() {
  local v=""
  [[ -r $CUDA_HOME/version.json ]] &&
    v=$(sed -n 's/.*"cuda" *: *{[^}]*"version" *: *"\([0-9]*\.[0-9]*\).*/\1/p' "$CUDA_HOME/version.json" | head -n 1)
  [[ -n ${v:-} || ! -x $CUDA_HOME/bin/nvcc ]] ||
    v=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  echo "${v:-unknown}"
}

check_cuda_toolkit() {
  ((cuda)) || return 0
  ((!dry_run)) || return 0
  [[ -x $CUDA_HOME/bin/nvcc ]] ||
    die "no CUDA toolkit at $CUDA_HOME (nvcc): ParallelCluster's official AMIs have one; on a custom AMI install it, or build CPU-only with --no-cuda"
}

# NCCL into $JUMBO_ROOT/deps/nccl, once, for every node: libnccl2 and libnccl-dev from NVIDIA's
# repository, downloaded by apt (signature and hashes checked) and unpacked, not installed, so
# the compute nodes need nothing of their own.
install_nccl() {
  ((cuda)) || return 0
  local prefix=$JUMBO_ROOT/deps/nccl
  if [[ -f $prefix/.installed ]]; then
    log "NCCL present ($prefix: $(cat "$prefix/.installed"))"
    return 0
  fi
  local apt=(apt-get -q -o DPkg::Lock::Timeout=600 -o Acquire::Retries=5)
  if ((dry_run)) || ! apt-cache policy 2>/dev/null | grep -q 'developer.download.nvidia.com/compute/cuda/repos/ubuntu2204'; then
    fetch_unchecked "$NVIDIA_REPO/cuda-keyring_1.1-1_all.deb" "$tmp_dir/cuda-keyring.deb"
    run dpkg -i "$tmp_dir/cuda-keyring.deb"
    run "${apt[@]}" update
  fi
  local version=$nccl_version cuda_v
  cuda_v=$(cuda_version)
  if [[ -z $version ]] && ((!dry_run)); then
    # The newest NCCL built for this toolkit's major.minor, else for an older minor of the
    # same major (CUDA's minor-version compatibility).
    version=$(apt-cache madison libnccl2 | awk '{print $3}' | awk -F+cuda -v want="$cuda_v" '
      { split($2, v, "."); split(want, w, ".") }
      v[1] == w[1] && v[2] + 0 <= w[2] + 0 { print }' | sort -V | tail -n 1)
    [[ -n $version ]] || die "no libnccl2 for CUDA $cuda_v in $NVIDIA_REPO (apt-cache madison libnccl2); pass --nccl-version"
  fi
  log "NCCL ${version:-newest for CUDA $cuda_v} into $prefix"
  local work=$tmp_dir/nccl
  run mkdir -p "$work" "$prefix"
  (
    run cd "$work"
    run "${apt[@]}" download "libnccl2=${version:-VERSION}" "libnccl-dev=${version:-VERSION}"
    local deb
    for deb in "$work"/*.deb; do run dpkg -x "$deb" "$prefix/root"; done
  )
  run ln -sfn root/usr/include "$prefix/include"
  run ln -sfn "root/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)" "$prefix/lib"
  ((dry_run)) || [[ -e $prefix/lib/libnccl.so.2 ]] || die "$prefix/lib/libnccl.so.2 missing after unpacking libnccl2 $version"
  ((dry_run)) || echo "libnccl2 $version" >"$prefix/.installed"
}

# fetch_unchecked URL FILE: for the one file whose integrity apt checks afterwards (the
# repository's keyring package is verified by dpkg's signature of what it then installs).
fetch_unchecked() {
  run curl -fsSL --retry 5 --retry-delay 5 -o "$2" "$1"
}

ofi_nccl_dir() {
  local dir
  for dir in "${OFI_NCCL_DIRS[@]}"; do
    [[ -e $dir/libnccl-net.so || -e $dir/libnccl-net-ofi.so ]] && echo "$dir" && return 0
  done
  return 1
}

# The shared libraries of the binary that the compute nodes lack (the apt packages installed on
# the head node only), copied beside it: every library ldd resolves, except the C library,
# the EFA installer's (/opt/amazon), CUDA's driver and toolkit, and NCCL (deps/nccl).
bundle_libraries() {
  local binary=$1 dir=$2 name path
  run mkdir -p "$dir"
  ((!dry_run)) || return 0
  while read -r name path; do
    case $name in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*.so.* | libcuda.so.* | libnvidia-*) continue ;;
    esac
    case $path in
      /opt/amazon/* | "$CUDA_HOME"* | /usr/local/cuda* | "$JUMBO_ROOT"/deps/* | "") continue ;;
    esac
    cp -L "$path" "$dir/$name"
  done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
  log "bundled $(ls "$dir" | wc -l) libraries into $dir"
}

# ---------------------------------------------------------------- compute nodes: check only

# Nothing is installed on a compute node: it reads what the head node built. This logs
# what a job will find; jumbo doctor decides before each job.
check_compute_node() {
  ((!dry_run)) || { log "would check $JUMBO_ROOT/bin/jumbo's libraries with $JUMBO_ROOT/env.sh"; return 0; }
  if [[ ! -x $JUMBO_ROOT/bin/jumbo || ! -r $JUMBO_ROOT/env.sh ]]; then
    warn "$JUMBO_ROOT/bin/jumbo or env.sh is missing: did the head node's build fail? (its $LOG_FILE)"
    return 0
  fi
  local missing
  # shellcheck source=/dev/null
  missing=$(. "$JUMBO_ROOT/env.sh" && ldd "$JUMBO_ROOT/bin/jumbo" | grep 'not found' | tr -s ' \t' ' ')
  [[ -z $missing ]] && log "$JUMBO_ROOT/bin/jumbo: every library resolves" ||
    warn "$JUMBO_ROOT/bin/jumbo: unresolved libraries here: $missing"
  if [[ -e /dev/nvidia0 ]]; then
    ofi_nccl_dir >/dev/null || warn "GPU node without aws-ofi-nccl (${OFI_NCCL_DIRS[*]}): NCCL would use sockets between nodes"
  fi
}

# ---------------------------------------------------------------- 2. the build, head node only

# Holds the build lock until exit. flock(2) on the shared file; should /fsx be mounted without
# flock support, an atomic mkdir is the lock instead (with the holder written inside it).
acquire_build_lock() {
  local lock=$JUMBO_ROOT/.build.lock rc=0
  if ((dry_run)); then
    log "would lock $lock"
    return 0
  fi
  exec 9>>"$lock"
  flock -E 75 -w "$LOCK_WAIT_S" 9 || rc=$?
  case $rc in
    0) log "holding $lock" && return 0 ;;
    75) die "$lock still held after ${LOCK_WAIT_S}s; is another build running? (ps, $LOG_FILE)" ;;
  esac
  exec 9>&-
  warn "flock on $lock failed (is /fsx mounted without flock?); using a lock directory"
  local dir=$lock.d waited=0
  until mkdir "$dir" 2>/dev/null; do
    if [[ -n $(find "$dir" -maxdepth 0 -mmin +$((LOCK_WAIT_S / 60)) 2>/dev/null) ]]; then
      warn "removing stale $dir ($(cat "$dir/holder" 2>/dev/null || echo unknown holder))"
      rm -rf "$dir"
      continue
    fi
    ((waited < LOCK_WAIT_S)) || die "$dir still held after ${LOCK_WAIT_S}s: $(cat "$dir/holder" 2>/dev/null)"
    sleep 10
    waited=$((waited + 10))
  done
  lock_dir=$dir
  echo "$(hostname) pid $$ since $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$dir/holder"
}

install_cmake() {
  if [[ -x $CMAKE_VENV/bin/cmake ]]; then
    log "cmake $CMAKE_VERSION present ($CMAKE_VENV)"
    return 0
  fi
  run python3 -m venv "$CMAKE_VENV"
  run "$CMAKE_VENV/bin/pip" install --quiet --disable-pip-version-check "cmake==$CMAKE_VERSION"
}

build_hdf5() {
  local prefix=$JUMBO_ROOT/deps/hdf5-$HDF5_VERSION
  if [[ -f $prefix/.installed ]]; then
    log "parallel HDF5 $HDF5_VERSION present ($prefix)"
  else
    local tarball=$JUMBO_ROOT/downloads/hdf5-$HDF5_VERSION.tar.gz work=$tmp_dir/hdf5
    fetch "$HDF5_URL" "$HDF5_SHA256" "$tarball"
    run mkdir -p "$work"
    run tar -xzf "$tarball" -C "$work"
    # mpicc from the EFA installer: HDF5's MPI-IO then talks to the same libmpi as jumbo.
    (
      run cd "$work/hdf5-$HDF5_VERSION"
      run env CC="$MPI_HOME/bin/mpicc" ./configure --prefix="$prefix" --enable-parallel \
        --enable-hl --enable-shared --disable-fortran --disable-cxx --disable-tests --silent
      run make -s -j "$(nproc)"
      run make -s install
    )
    run touch "$prefix/.installed"
  fi
  run ln -sfn "hdf5-$HDF5_VERSION" "$JUMBO_ROOT/deps/hdf5"
}

# build_from_source PACKAGE: the source_fallback entry of PACKAGE, installed into deps/DIR.
# Prints nothing; the caller adds deps/DIR to CMAKE_PREFIX_PATH.
build_from_source() {
  local dir url sum cmake_args
  read -r dir url sum cmake_args <<<"${source_fallback[$1]}"
  local prefix=$JUMBO_ROOT/deps/$dir
  if [[ -f $prefix/.installed ]]; then
    log "$1: $dir present ($prefix)"
    return 0
  fi
  local tarball=$JUMBO_ROOT/downloads/$dir.tar.gz work=$tmp_dir/$dir
  fetch "$url" "$sum" "$tarball"
  run mkdir -p "$work"
  run tar -xzf "$tarball" -C "$work"
  # shellcheck disable=SC2086 # cmake_args: several words on purpose
  run "$CMAKE_VENV/bin/cmake" -S "$work/$dir" -B "$work/build" -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_BUILD_TYPE=Release $cmake_args
  run "$CMAKE_VENV/bin/cmake" --install "$work/build"
  run touch "$prefix/.installed"
}

# Each source tarball builds into releases/<sha>; `src` then points at the newest good build, so
# jobs already running keep the binary they started with.
build_jumbo() {
  run mkdir -p "$JUMBO_ROOT/releases" "$JUMBO_ROOT/deps" "$JUMBO_ROOT/downloads" \
    "$JUMBO_ROOT/bin" "$JUMBO_ROOT/runs"
  # slurm/train_jumbo.sh's defaults (slurm/common.sh): $JUMBO_ROOT/runs/<run> for metrics and
  # EMF, $JUMBO_ROOT/checkpoints/<run>. Every user's jobs create their directories there.
  run mkdir -p "$JUMBO_ROOT/checkpoints"
  run chmod 1777 "$JUMBO_ROOT/runs" "$JUMBO_ROOT/checkpoints" # sticky, like /tmp
  # The S3-linked directory is root's; checkpoints under it are exported to S3 (README).
  if ((dry_run)) || [[ -d /fsx/data ]]; then
    run mkdir -p /fsx/data/ckpt
    run chmod 1777 /fsx/data/ckpt
  fi
  acquire_build_lock

  local tarball=$JUMBO_ROOT/downloads/jumbo-src.tar.gz sha=dry-run
  s3_get "$artifacts/jumbo-src.tar.gz" "$tarball.part"
  run mv "$tarball.part" "$tarball"
  ((dry_run)) || sha=$(sha256sum "$tarball" | cut -c1-12)
  local release=$JUMBO_ROOT/releases/$sha

  if [[ -f $release/.build-ok ]] && ((!rebuild)); then
    log "jumbo $sha already built ($release); --rebuild to build it again"
  else
    install_cmake
    install_nccl
    build_hdf5
    local package prefix_path=""
    if ((dry_run)); then from_source=("${!source_fallback[@]}"); fi
    for package in "${from_source[@]}"; do
      build_from_source "$package"
      prefix_path+="${prefix_path:+;}$JUMBO_ROOT/deps/${source_fallback[$package]%% *}"
    done
    run rm -rf "$release"
    run mkdir -p "$release"
    run tar -xzf "$tarball" -C "$release"
    ((dry_run)) || [[ -f $release/CMakeLists.txt ]] ||
      die "jumbo-src.tar.gz has no CMakeLists.txt at its top (make it with: git archive --format=tar.gz -o jumbo-src.tar.gz HEAD)"
    local efa_pc="$EFA_HOME/lib/pkgconfig"
    ((dry_run)) || efa_pc=$(efa_pkgconfig)
    # MPI, HDF5 and NCCL by path so that nothing else on the node can be picked instead.
    local cuda_args=(-DJUMBO_CUDA=OFF)
    if ((cuda)); then
      cuda_args=(-DJUMBO_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch"
        "-DCMAKE_CUDA_COMPILER=$CUDA_HOME/bin/nvcc" "-DNCCL_INCLUDE_DIR=$JUMBO_ROOT/deps/nccl/include"
        "-DNCCL_LIBRARY=$JUMBO_ROOT/deps/nccl/lib/libnccl.so")
    fi
    run env PATH="$MPI_HOME/bin:$JUMBO_ROOT/deps/hdf5/bin:$CMAKE_VENV/bin:$PATH" \
      PKG_CONFIG_PATH="$efa_pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" CC=gcc-12 CXX=g++-12 \
      "$CMAKE_VENV/bin/cmake" -S "$release" -B "$release/build" -DCMAKE_BUILD_TYPE=Release \
      -DJUMBO_TESTS=OFF -DJUMBO_BENCHMARKS=OFF "-DJUMBO_ARCH_FLAGS=-march=$arch" \
      -DMPI_C_COMPILER="$MPI_HOME/bin/mpicc" -DHDF5_ROOT="$JUMBO_ROOT/deps/hdf5" \
      -DCMAKE_PREFIX_PATH="$prefix_path" "${cuda_args[@]}" "${cmake_extra[@]}"
    run "$CMAKE_VENV/bin/cmake" --build "$release/build" -j "$(nproc)"
    bundle_libraries "$release/build/jumbo" "$release/lib"
    check_binary "$release/build/jumbo"
    run touch "$release/.build-ok"
  fi

  # Swap the links by rename, so a reader sees the old release or the new one, never neither.
  run ln -sfn "releases/$sha" "$JUMBO_ROOT/src.new"
  run mv -Tf "$JUMBO_ROOT/src.new" "$JUMBO_ROOT/src"
  run ln -sfn ../src/build/jumbo "$JUMBO_ROOT/bin/jumbo"
  write_env_file
  log "jumbo: $JUMBO_ROOT/bin/jumbo -> $release/build/jumbo"
}

# Not run here (MPI_Init as root on a node without EFA); only every library must resolve and
# libmpi must be the EFA installer's.
check_binary() {
  local binary=$1 libs
  ((!dry_run)) || return 0
  libs=$(LD_LIBRARY_PATH=$(runtime_library_path) ldd "$binary")
  log "$(grep -E 'libmpi|libfabric|libhdf5|openblas' <<<"$libs" | tr -s ' \t' ' ')"
  ! grep -q 'not found' <<<"$libs" || die "$binary: unresolved libraries: $(grep 'not found' <<<"$libs" | tr -s ' \t' ' ')"
  grep -q "libmpi.so.* => $MPI_HOME/" <<<"$libs" || die "$binary does not use $MPI_HOME's libmpi"
  if ((cuda)); then
    grep -q "libnccl.so.2 => $JUMBO_ROOT/deps/nccl/" <<<"$libs" || die "$binary does not use $JUMBO_ROOT/deps/nccl's libnccl"
  fi
}

# The library path of every node, in order: the EFA installer's Open MPI and libfabric,
# aws-ofi-nccl (the network plugin NCCL dlopens by name), NCCL, CUDA's runtime libraries,
# parallel HDF5, then the libraries bundled with the binary.
runtime_library_path() {
  local dirs=() ofi
  dirs+=("$(first_dir "$MPI_HOME/lib" "$MPI_HOME/lib64")" "$(first_dir "$EFA_HOME/lib" "$EFA_HOME/lib64")")
  if ((cuda)); then
    ofi=$(ofi_nccl_dir) || ofi=${OFI_NCCL_DIRS[0]}
    dirs+=("$ofi" "$JUMBO_ROOT/deps/nccl/lib" "$CUDA_HOME/lib64")
  fi
  dirs+=("$JUMBO_ROOT/deps/hdf5/lib" "$JUMBO_ROOT/src/lib")
  (IFS=:; echo "${dirs[*]}")
}

# For logins and jobs: slurm/train_jumbo.sh takes JUMBO_HOME (the sources, holding
# build/jumbo), JUMBO_ROOT, PATH and LD_LIBRARY_PATH from the environment sbatch passes on.
write_env_file() {
  log "writing $JUMBO_ROOT/env.sh (LD_LIBRARY_PATH=$(runtime_library_path))"
  if ((cuda && !dry_run)) && ! ofi_nccl_dir >/dev/null; then
    warn "no aws-ofi-nccl in ${OFI_NCCL_DIRS[*]} on this node; GPU nodes need it (jumbo doctor checks)"
  fi
  ((!dry_run)) || return 0
  cat >"$JUMBO_ROOT/env.sh.new" <<EOF
# Written by parallelcluster/on-node-configured.sh: jumbo, Open MPI and libfabric (EFA installer),
# aws-ofi-nccl, NCCL, CUDA.
export JUMBO_HOME=$JUMBO_ROOT/src
export JUMBO_ROOT=$JUMBO_ROOT
export PATH=$JUMBO_ROOT/bin:$MPI_HOME/bin:$EFA_HOME/bin\${PATH:+:\$PATH}
export LD_LIBRARY_PATH=$(runtime_library_path)\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
  mv -f "$JUMBO_ROOT/env.sh.new" "$JUMBO_ROOT/env.sh"
}

# ---------------------------------------------------------------- 3. CloudWatch agent, every node

# Metrics are never worth a failed node: problems here are warnings, the node comes up anyway.
install_cloudwatch_config() {
  if ((!dry_run)) && [[ ! -x $CW_CTL ]]; then
    warn "no CloudWatch agent ($CW_CTL): is Monitoring.Logs.CloudWatch.Enabled false? EMF metrics stay local"
    return 0
  fi
  run mkdir -p "$(dirname "$CW_CONFIG")"
  s3_get "$artifacts/cloudwatch-agent.json" "$CW_CONFIG.part" || {
    warn "could not fetch $artifacts/cloudwatch-agent.json"
    return 0
  }
  if [[ $role == compute ]]; then
    # /fsx is shared: if every node tailed the EMF files, each line would reach CloudWatch once
    # per node. The head node tails them; compute nodes only offer the EMF endpoint (tcp 25888)
    # for log.emf_address.
    log "compute node: keeping only logs.metrics_collected.emf from cloudwatch-agent.json"
    ((dry_run)) || python3 - "$CW_CONFIG.part" <<'EOF' || { warn "cannot edit cloudwatch-agent.json"; return 0; }
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config.get("logs", {}).pop("logs_collected", None)
json.dump(config, open(path, "w"), indent=2)
EOF
  fi
  run mv -f "$CW_CONFIG.part" "$CW_CONFIG"
  # append-config adds to ParallelCluster's own agent configuration; -s restarts the agent.
  run "$CW_CTL" -a append-config -m ec2 -c "file:$CW_CONFIG" -s ||
    warn "amazon-cloudwatch-agent-ctl append-config failed; see /opt/aws/amazon-cloudwatch-agent/logs/"
}

main() {
  parse_args "$@"
  if ((!dry_run)); then
    mkdir -p "$(dirname "$LOG_FILE")"
    exec > >(tee -a "$LOG_FILE") 2>&1
  fi
  trap 'on_error "$LINENO" "$BASH_COMMAND"' ERR
  trap cleanup EXIT
  tmp_dir=$(mktemp -d /tmp/jumbo-onc.XXXXXX)
  log "start: role=$role artifacts=$artifacts arch=$arch jumbo_home=$JUMBO_ROOT dry_run=$dry_run"
  check_os
  check_efa
  if [[ $role == head ]]; then
    install_packages
    check_cuda_toolkit
    build_jumbo
  else
    check_compute_node
  fi
  install_cloudwatch_config
  log "done"
}

# Sourcing the file (tests) defines the functions without running anything.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
