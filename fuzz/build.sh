#!/usr/bin/env bash
# Builds the libFuzzer targets with clang 14 (ASan + UBSan + libFuzzer) into build-fuzz/.
#
#   fuzz/build.sh [--out DIR] [--clean]
#
# The ckpt and safetensors sources are compiled directly with clang++-14 and
# -fsanitize=fuzzer-no-link,address,undefined; the main CMake build (g++) does not know about
# this. HDF5, zstd, xxhash and simdjson are the system libraries (not instrumented). Objects are
# rebuilt when their source is newer; --clean rebuilds everything (after header changes).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/build-fuzz"
clean=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --clean) clean=1; shift ;;
    *) echo "usage: fuzz/build.sh [--out DIR] [--clean]" >&2; exit 2 ;;
  esac
done
CXX="${CXX_FUZZ:-clang++-14}"
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz/build.sh: $CXX not found (clang 14 comes with the machine image)" >&2
  exit 2
fi
[ "$clean" = 1 ] && rm -rf "$out"
mkdir -p "$out/obj" "$out/bin"

hdf5_inc=/usr/include/hdf5/serial
hdf5_lib=/usr/lib/x86_64-linux-gnu/hdf5/serial
# libzip is opened with dlopen on first use (ckpt/src/torch_archive.cc): its SONAME and file,
# found as CMakeLists.txt finds them.
zip_file="$(readlink -f "$(pkg-config --variable=libdir libzip)/libzip.so")"
zip_soname="$(objdump -p "$zip_file" | awk '$1 == "SONAME" {print $2}')"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=undefined -I"$repo/ckpt/include" -I"$repo/safetensors/include"
       -I"$repo/convert/include"
       -isystem "$hdf5_inc")
zip_defs=(-DCKPT_LIBZIP_SONAME="\"${zip_soname:-$(basename "$zip_file")}\""
          -DCKPT_LIBZIP_PATH="\"$zip_file\"")
libs=(-L"$hdf5_lib" -Wl,-rpath,"$hdf5_lib" -lhdf5 -lzstd -lxxhash -lsimdjson -ldeflate -ldl -lpthread)

sources=("$repo"/ckpt/src/*.cc "$repo"/safetensors/src/*.cc)
objects=()
stale=()
for src in "${sources[@]}"; do
  rel="${src#"$repo"/}"
  obj="$out/obj/${rel//\//_}.o"
  objects+=("$obj")
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then stale+=("$src:$obj"); fi
done
export CXX
export flags_str="${flags[*]} ${zip_defs[*]}"
if [ "${#stale[@]}" -gt 0 ]; then
  echo "fuzz/build.sh: compiling ${#stale[@]} source(s) with $CXX"
  for s in "${stale[@]}"; do
    printf '%s\n' "$s"
  done | xargs -P "${FUZZ_JOBS:-2}" -I{} bash -c \
    'src="${1%%:*}"; obj="${1#*:}"; $CXX $flags_str -fsanitize=fuzzer-no-link -c "$src" -o "$obj"' _ {}
fi

# fuzz_rank_file seals its inputs as the seeds' writer did (h5::SealFile); fuzz_resealed seals
# each input itself, from the same seeds.
# fuzz_deepspeed takes its fixtures' files from its seeds; fuzz_universal copies its tag
# directory (manifest and universal.h5) from tests/fuzz/universal_fixture.
harness_flags=(-DCKPT_FUZZ_SEED_DIR="\"$repo/tests/fuzz/corpus/rank_file\""
               -DCKPT_FUZZ_DEEPSPEED_SEEDS="\"$repo/tests/fuzz/corpus/deepspeed\""
               -DCKPT_FUZZ_UNIVERSAL_FIXTURE="\"$repo/tests/fuzz/universal_fixture\"")
for target in manifest rank_file resealed safetensors units torch_pickle json deepspeed universal; do
  src="$repo/fuzz/fuzz_$target.cc"
  exe="$out/bin/fuzz_$target"
  newest=1
  if [ -f "$exe" ] && [ "$src" -ot "$exe" ]; then
    newest=0
    for o in "${objects[@]}"; do [ "$o" -nt "$exe" ] && newest=1; done
  fi
  if [ "$newest" = 1 ]; then
    echo "fuzz/build.sh: linking fuzz_$target"
    "$CXX" "${flags[@]}" "${harness_flags[@]}" -fsanitize=fuzzer "$src" "${objects[@]}" \
      "${libs[@]}" -o "$exe"
  fi
done
echo "fuzz/build.sh: targets in $out/bin"
