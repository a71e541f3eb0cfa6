#!/usr/bin/env bash
# The CPU backend built for Arm (aarch64 Linux) on an x86-64 machine and run under emulation:
# the library, the CLI and the CPU test binary, cross-compiled by zig's clang (pip package
# ziglang) against the arm64 glibc of Debian's libc6-arm64-cross, run by qemu-user.
#
#     bash scripts/arm_check.sh            # build in build/arm64, then the CLI check and the tests
#
# Needs (installed here if missing and allowed): python3 -m pip install ziglang; apt-get install
# qemu-user libc6-arm64-cross; GoogleTest's sources (/usr/src/googletest, Debian's
# libgtest-dev), cross-built once into build/arm64-gtest. On aarch64 the CPU backend runs its
# NEON kernel set (src/cpu/kernels_neon.cpp, D-86): the script checks that the dispatch took it,
# runs the CLI and the whole CPU test binary on it, then the kernel-set cases again on the
# portable set (FLASHATTN_KERNEL=automatic,cpu=portable), as ctest's cpu_kernels_portable does.
# Emulation says nothing of speed; it checks that every path builds and computes the right
# results there.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build/arm64"
GTEST="$ROOT/build/arm64-gtest"
SYSROOT=/usr/aarch64-linux-gnu
ZIG_TARGET=aarch64-linux-gnu.2.36

need() {  # a tool or file, and how to get it
  [ -e "$1" ] || command -v "$1" >/dev/null 2>&1 || { echo "arm_check: missing $1 ($2)"; exit 2; }
}
python3 -c "import ziglang" 2>/dev/null || python3 -m pip install -q ziglang
need qemu-aarch64 "apt-get install qemu-user"
need "$SYSROOT/lib/ld-linux-aarch64.so.1" "apt-get install libc6-arm64-cross"
need /usr/src/googletest/CMakeLists.txt "apt-get install libgtest-dev"

# The compilers and the CMake toolchain file (generated: the paths are this checkout's).
mkdir -p "$OUT/toolchain"
for tool in cc c++; do
  printf '#!/bin/sh\nexec python3 -m ziglang %s -target %s "$@"\n' "$tool" "$ZIG_TARGET" >"$OUT/toolchain/zig-$tool"
  chmod +x "$OUT/toolchain/zig-$tool"
done
cat >"$OUT/toolchain/aarch64.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER $OUT/toolchain/zig-cc)
set(CMAKE_CXX_COMPILER $OUT/toolchain/zig-c++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;$SYSROOT)
set(CMAKE_FIND_ROOT_PATH $GTEST/install)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
EOF
TOOLCHAIN="$OUT/toolchain/aarch64.cmake"

echo "== GoogleTest for aarch64"
if [ ! -f "$GTEST/install/lib/libgtest.a" ]; then
  cmake -S /usr/src/googletest -B "$GTEST/build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$GTEST/install" >"$OUT/gtest.log" 2>&1
  cmake --build "$GTEST/build" >>"$OUT/gtest.log" 2>&1
  cmake --install "$GTEST/build" >>"$OUT/gtest.log" 2>&1
fi

echo "== flashattn (CPU backend) for aarch64"
cmake -S "$ROOT" -B "$OUT/build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DCMAKE_BUILD_TYPE=Release \
  -DFLASHATTN_CUDA=OFF -DFLASHATTN_SHARED_LIBSTDCXX=OFF -DCMAKE_PREFIX_PATH="$GTEST/install" >"$OUT/build.log" 2>&1
cmake --build "$OUT/build" >>"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
grep -E "warning:" "$OUT/build.log" | sort -u | head -n 20 || true

run() { LD_LIBRARY_PATH="$OUT/build" qemu-aarch64 -L "$SYSROOT" "$@"; }
TESTS="$OUT/build/tests/flashattn_tests_cpu"
echo "== the kernel sets the dispatch takes (aarch64, emulated; the test fails unless they are NEON)"
run "$TESTS" --gtest_brief=1 --gtest_filter="CpuKernels.DispatchTakesTheFastestAllowedSet"
echo "== the CLI on an example (aarch64, emulated)"
run "$OUT/build/tools/flashattn" run --device cpu --check --causal --seqlen-q 300 --head-dim 64
run "$OUT/build/tools/flashattn" run --device cpu --check --kvcache --paged --page-size 16 --heads 8 --kv-heads 2 \
  --seqlen-q 1 --seqlen-k 700 --append 1 --rotary neox
echo "== the CPU tests (aarch64, emulated)"
# Left out: ThreadStartFailureIsARuntimeError limits the address space (RLIMIT_AS), which under
# qemu-user is the emulator's, and qemu aborts before the library can report the failure.
run "$TESTS" --gtest_brief=1 \
  --gtest_filter="-Reliability.ThreadStartFailureIsARuntimeError" 2>&1 | tee "$OUT/tests.log" | tail -n 5
status="${PIPESTATUS[0]}"
[ "$status" = 0 ] || exit "$status"
echo "== the kernel-set cases on the portable set (aarch64, emulated; FLASHATTN_KERNEL=automatic,cpu=portable)"
FLASHATTN_KERNEL=automatic,cpu=portable run "$TESTS" --gtest_brief=1 \
  --gtest_filter="Cpu/DenseSweep.*:Cpu/KVCachePaging.*:Cpu/KVCacheSplits.*:Cpu/NanQuery.*:Threads.*:CpuKernels.Dispatch*" \
  2>&1 | tee "$OUT/tests-portable.log" | tail -n 4
exit "${PIPESTATUS[0]}"
