# Shared by tools/*.sh: install the Debian packages the project needs (idempotent, quiet),
# then configure and build. Source it; do not run it.

CKPT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CKPT_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libhdf5-dev libzstd-dev nlohmann-json3-dev catch2 libcli11-dev libxxhash-dev libzip-dev
  libsimdjson-dev libdeflate-dev
  libopenmpi-dev openmpi-bin jq
  python3 python3-h5py python3-hdf5plugin python3-numpy python3-torch python3-zstandard
  python3-dev pybind11-dev python3-pybind11
  strace
)

ckpt_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ckpt_install_packages() {
  local missing=()
  for p in "${CKPT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  ckpt_log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ckpt_configure BUILD_DIR [cmake args...]: configures once (Ninja, RelWithDebInfo by default).
ckpt_configure() {
  local dir="$1"
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    ckpt_log "configuring $dir"
    cmake -S "$CKPT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  fi
}

# ckpt_build BUILD_DIR [-DCMAKE_ARG...] [TARGET...]: configures once with the -D arguments,
# then builds the targets (default: all), quietly.
ckpt_build() {
  local dir="$1"
  shift
  local config=() names=()
  for a in "$@"; do
    case "$a" in -D*) config+=("$a") ;; *) names+=("$a") ;; esac
  done
  ckpt_configure "$dir" "${config[@]}"
  local targets=()
  [ ${#names[@]} -gt 0 ] && targets=(--target "${names[@]}")
  ckpt_log "building $dir${names[*]:+ (${names[*]})}"
  # Progress lines are noise in CI logs; errors and warnings still show.
  local rc=0
  cmake --build "$dir" -j "$(nproc)" "${targets[@]}" 2>&1 |
    { grep -vE '^\[[0-9]+/[0-9]+\] |^ninja: (Entering|Leaving)' || true; } || rc=$?
  return "$rc"
}

# ckpt_carry_libs DIR BINARY...: copies the shared libraries the binaries load beyond the C and
# C++ runtimes (which a machine without the Debian packages has, newer) into DIR, each once, so
# that the binaries run there with LD_LIBRARY_PATH=DIR (tools/bench.sh and tools/bench/gpu.sh
# --prepare).
ckpt_carry_libs() {
  local dir="$1"
  shift
  mkdir -p "$dir"
  ldd "$@" | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/"; done
}

# mpirun as root on a small machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
