#!/usr/bin/env bash
# The one GPU job.
# Here (no GPU): `bash scripts/device_check.sh --prepare` stages in .carry/ what the GPU machine
# cannot download: the CUTLASS/CuTe headers (from the nvidia-cutlass wheel) and GoogleTest.
# There (device tool, carry [".carry"]): `bash scripts/device_check.sh STAGE...`, stages in order
# (a later call on the still-warm machine passes carry [] instead: carrying .carry again replaces
# the .carry/prefix that `build` installed):
#   build     the gpu-h200 preset (library, CLI, GPU tests; about 2 minutes on 16 cores), installed
#             into .carry/prefix; CMAKE_ARGS adds cache settings (e.g. -DFLASHATTN_HEAD_DIMS="128;256")
#   pyext     build the nanobind extension against that library (needed by bench/pytest)
#   test      the GPU sweeps (tests/gpu): automatic choice, then every kernel forced (KernelOverride);
#             TEST_FILTER (a --gtest_filter) picks a subset
#   sanitize  compute-sanitizer memcheck + racecheck on a representative subset (CLI --check),
#             automatic and with FLASHATTN_KERNEL forcing each kernel; memcheck on the bad index
#             values of the IndexFaults tests with each kernel forced; synccheck on the
#             prefill kernels (wgmma; warpspec in warpspec_sanitize)
#   warpspec_sanitize  memcheck, racecheck and synccheck of the warpspec kernel, persistent and on
#             two CTAs taking many query tiles each (also run at the end of sanitize)
#   fp8_warpspec_sanitize  memcheck, racecheck and synccheck of the warpspec kernel's FP8
#             products (D-75), as warpspec_sanitize
#   pagedsanitize  memcheck + racecheck on the paged-cache cases, memcheck on the bad index values
#             under the paged decode kernels (a subset of sanitize)
#   fp8sanitize  memcheck + racecheck on the FP8 (e4m3) sweep cases of the GPU tests (also run
#             at the end of sanitize)
#   bench     bench/bench.py prefill + decode, side by side with PyTorch SDPA (flash, cudnn), and
#             chunked prefill over a paged cache (prefill-paged-h200.json)
#   overhead  host time against GPU time of small decode calls (bench/probes/decode_overhead.py)
#   pytest    the whole pytest suite, GPU tests included (torch, CuPy, JAX, CUDA graph capture)
#   fuzz      (after pyext) tests/python/test_fuzz_gpu.py: hypothesis' random calls on CUDA tensors
#             against the CPU backend (FLASHATTN_FUZZ_GPU_EXAMPLES per test, default 300); then
#             tests/python/test_index_faults_gpu.py under compute-sanitizer memcheck: bad index
#             values in device memory through the Python API. Log: fuzz-gpu.log
#   wheel     the carried wheel (.whl/flashattn-*.whl, built on the development machine: carry
#             [".whl"]; CONTRIBUTING.md "Wheels") installed with --no-deps --no-index into a fresh
#             venv over the system's torch and numpy, then test_gpu.py, test_import_order.py and
#             test_torch.py run by that venv's python from a copy of tests/python outside the source
#             tree, without PYTHONPATH, .carry/prefix or nvcc. Needs no other stage. Log: wheel.log
#   profile   Nsight Compute on the warpspec kernel at one dense prefill point (PROFILE_ARGS, CLI
#             run flags; default 2 x 8k x 16 heads, d 128), bf16 and e4m3 side by side: speed of
#             light, pipe and issue use, scheduler, the stall reasons per issued instruction.
#             Log: profile.log; summary: profile-warpspec-h200.json (bench/probes/profile_summary.py)
#   hotspots  Nsight Compute's warp-state samples per SASS instruction of the warpspec kernel
#             (HOTSPOT_CASES: bf16 512 causal, e4m3 8k), the instructions where warps stall most
#             (bench/probes/stall_hotspots.py). Log: hotspots.log, CSV: hotspots-N.csv.gz
#   ab        two kernel overrides side by side: `flashattn bench` over the FA2 grid at AB_DIMS
#             (default 128,256) under each FLASHATTN_KERNEL value of AB (default: the warpspec grid
#             of one CTA per query tile, then the automatic choice; D-71), alternating, two rounds;
#             bench/probes/ab_summary.py prints each point's best of the rounds and the ratio
#   varlen_ab varlen prefill (CLI run, random lengths) on each prefill kernel forced in turn,
#             alternating, two rounds: best TFLOP/s per kernel. Log: varlen-ab.log
#   prefix_ab libraries built here (AB_PREFIXES: carried install prefixes, main first) under one
#             Python probe (AB_PROBE), in turn, two rounds; needs no build stage. Log: prefix-ab.log
#   build_variant, variant_ab  a second build of the same source with VARIANT_ARGS added (its CLI
#             alone, build/variant), then VARIANT_AB_CASES on both CLIs, alternating, two rounds:
#             best TFLOP/s per build and their ratio. Log: variant-ab.log
#   pagecost  decode over a paged cache (pages of 1 and 16 rows) against contiguous, CLI bench (D-61)
#   spills    Nsight Compute's local-memory (spill) instructions and sectors of the kernels ptxas
#             reports spilling, against all their instructions (bench/probes/spill_cost.py, D-49)
#   floor     the lease's read floor: torch.sum over the 32 x 4k point's K/V bytes, ours and SDPA,
#             timed as the benchmark times them (bench/probes/l2_state.py --read-floor; not default)
#   probe     bench/probes/stream_probe.cu: the decode K/V copies alone, the bandwidth floor (not default)
#   dram      Nsight Compute's DRAM bytes and time of each decode call at the 128k-token points,
#             after the benchmark's dirty flush and after a clean one (bench/probes/decode_ncu.py; not default)
# Logs, JSON and PNG go to $OUT (at most 8 files come back). Default: build test sanitize.
set -uo pipefail
OUT="${OUT:-/tmp/flashattn-out}"
PRESET="${PRESET:-gpu-h200}"
CARRY=.carry
if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf "$CARRY" && mkdir -p "$CARRY/gtest/include" "$CARRY/gtest/lib/x86_64-linux-gnu/cmake"
  cutlass="$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")"
  cp -r "$cutlass" "$CARRY/cutlass"
  cp -r /usr/include/gtest /usr/include/gmock "$CARRY/gtest/include/"
  cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$CARRY/gtest/lib/x86_64-linux-gnu/"
  cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$CARRY/gtest/lib/x86_64-linux-gnu/cmake/"
  du -sh "$CARRY"
  exit 0
fi
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test sanitize)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
PREFIX="$PWD/$CARRY/prefix"
CLI="$PREFIX/bin/flashattn"
export LD_LIBRARY_PATH="$PREFIX/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="/tmp/fa-ext/site:${PYTHONPATH:-}"
status=0

stage_build() {
  local build="build/$PRESET"
  cmake --preset "$PRESET" -DFLASHATTN_CUTLASS_INCLUDE="$PWD/$CARRY/cutlass" \
    -DCMAKE_PREFIX_PATH="$PWD/$CARRY/gtest" ${CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 &&
    cmake --build --preset "$PRESET" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; return 1; }
  grep -E "spill" "$OUT/build.log" | sort -u | head -n 20
  cmake --install "$build" --prefix "$CARRY/prefix" >/dev/null && cp "$build/tests/flashattn_tests_gpu" "$CARRY/"
}

# The sweeps run once with the automatic kernel choice and once per kernel, every call forced
# onto it where it serves the call (tests/gpu/instantiate_gpu.cpp), so every path is tested on
# the one GPU we have.
stage_test() {
  "$CARRY/flashattn_tests_gpu" --gtest_brief=1 --gtest_filter="${TEST_FILTER:-*}" 2>&1 | tee "$OUT/tests-gpu.log" | tail -n 15
  return "${PIPESTATUS[0]}"
}

# Host overhead against GPU time of small decode calls (bench/probes/decode_overhead.py).
stage_overhead() {
  local args
  for args in "--batch 1 --context 1024" "--batch 1 --context 4096" "--batch 1 --context 4096 --page-size 16" \
              "--batch 8 --context 1024" "--batch 1 --context 65536"; do
    python3 bench/probes/decode_overhead.py $args 2>&1 | tail -n 1
  done
  python3 bench/probes/decode_overhead.py --batch 1 --context 1024 --profile >"$OUT/overhead-profile.log" 2>&1
  grep -E "tottime|us$|interface|_frameworks|built-in" "$OUT/overhead-profile.log" | head -n 20
}

# The Python extension against the installed library (or the install prefix given).
stage_pyext() {
  cmake -S python -B /tmp/fa-ext -G Ninja -DFLASHATTN_PREBUILT="${1:-$PREFIX}" \
    -DPython_EXECUTABLE="$(command -v python3)" >/tmp/python-build.log 2>&1 &&
    cmake --build /tmp/fa-ext -j 16 >>/tmp/python-build.log 2>&1 || { tail -n 30 /tmp/python-build.log; return 1; }
  python3 -c "import flashattn; print(flashattn.build_info())"
}

stage_pytest() {
  python3 -m pytest -q -p no:cacheprovider tests/python 2>&1 | tee "$OUT/pytest-gpu.log" | tail -n 8
  return "${PIPESTATUS[0]}"
}

# The GPU fuzz, then the bad index values under memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING: every
# tensor its own allocation, so that memcheck sees an access past one; --report-api-errors no:
# torch's own CUDA calls are not under test, and the library turns a failed CUDA call into an
# exception, which fails the test).
stage_fuzz() {
  local log="$OUT/fuzz-gpu.log" rc=0
  echo "== pytest tests/python/test_fuzz_gpu.py" >"$log"
  python3 -m pytest -q -p no:cacheprovider --hypothesis-show-statistics tests/python/test_fuzz_gpu.py \
    >>"$log" 2>&1 || rc=1
  echo "== compute-sanitizer memcheck: pytest tests/python/test_index_faults_gpu.py" >>"$log"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_index_faults_gpu.py >>"$log" 2>&1 || rc=1
  grep -E "^== |(passed|failed|skipped|error).* in [0-9.]+s|ERROR SUMMARY" "$log"
  return $rc
}

# The wheel on a machine as a user has it: its own venv, no source tree on the path, no build
# products, no CUDA toolkit on PATH (the CUDA runtime is linked into libflashattn.so).
stage_wheel() {
  local log="$OUT/wheel.log" venv=/tmp/fa-wheel-venv work=/tmp/fa-wheel-run whl d path="" ldpath=""
  whl="$(ls -t .whl/flashattn-*.whl 2>/dev/null | head -n 1)"
  [ -n "$whl" ] || { echo "no .whl/flashattn-*.whl: carry .whl"; return 1; }
  rm -rf "$venv" "$work" && mkdir -p "$work" && cp -r tests/python "$work/tests"
  { echo "== $whl ($(du -h "$whl" | cut -f1))"
    # without ensurepip (a distribution's python3 lacking python3-venv): the system's pip
    { python3 -m venv --system-site-packages "$venv" ||
        python3 -m venv --system-site-packages --without-pip --clear "$venv"; } &&
      "$venv/bin/python" -m pip install --no-deps --no-index "$whl"; } >"$log" 2>&1 ||
    { tail -n 20 "$log"; return 1; }
  # --system-site-packages reaches the base interpreter's packages only: where python3 is itself a
  # venv (the GPU machine's torch lives in one), its site-packages go in through a .pth file.
  python3 -c "import site; print('\n'.join(site.getsitepackages()))" \
    >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")/outer-python.pth"
  local IFS=:
  for d in $PATH; do [ -x "$d/nvcc" ] || [[ "$d" == */cuda*/bin ]] || path="${path:+$path:}$d"; done
  for d in ${LD_LIBRARY_PATH:-}; do [[ "$d" == *"$CARRY/prefix"* ]] || ldpath="${ldpath:+$ldpath:}$d"; done
  unset IFS
  (
    cd "$work" || exit 1
    unset PYTHONPATH CUDA_HOME CUDA_PATH
    export PATH="$path" LD_LIBRARY_PATH="$ldpath"
    echo "nvcc on PATH: $(command -v nvcc || echo none); LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    "$venv/bin/python" - <<'PY' || exit 1
import sys

import flashattn
import torch

print("flashattn.__file__:", flashattn.__file__)
print("flashattn.build_info():", flashattn.build_info())
print("torch.cuda.get_device_name():", torch.cuda.get_device_name())
assert flashattn.__file__.startswith(sys.prefix), f"not the venv's package ({sys.prefix})"
assert flashattn.cuda_available(), "the wheel's flashattn has no CUDA"
PY
    ldd "$(dirname "$("$venv/bin/python" -c "import flashattn; print(flashattn.__file__)")")"/*.so |
      grep -E "^/|=>" | grep -v -E "linux-vdso|ld-linux"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_import_order.py \
      tests/test_torch.py
  ) >>"$log" 2>&1
  local rc=$?
  grep -E "^== |^nvcc|^flashattn|^torch.cuda|(passed|failed|skipped|error).* in [0-9.]+s" "$log"
  [ $rc -eq 0 ] || tail -n 30 "$log"
  return $rc
}

# One CLI case (the arguments after the third) under compute-sanitizer TOOL with
# FLASHATTN_KERNEL=KERNEL (empty: the automatic choice), checked against float64, logged to LOG.
sanitize_cli() {
  local log=$1 tool=$2 kernel=$3
  shift 3
  echo "== $tool${kernel:+ FLASHATTN_KERNEL=$kernel}: $*" >>"$log"
  FLASHATTN_KERNEL=$kernel compute-sanitizer --tool "$tool" --error-exitcode 9 "$CLI" run --device cuda \
    --dtype bf16 --repeat 1 --check "$@" >>"$log" 2>&1
}

# The warpspec kernel under memcheck, racecheck and synccheck (its mbarrier pipelines, Q buffers and
# named-barrier turns), on the persistent grid and on two CTAs that each take many query tiles;
# the cases are the arguments.
sanitize_warpspec_cases() {
  local log="$1" rc=0 tool kernel c
  shift
  for tool in memcheck racecheck synccheck; do
    for kernel in warpspec warpspec,grid=2; do
      for c in "$@"; do
        sanitize_cli "$log" "$tool" "$kernel" $c || rc=1
      done
    done
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sort | uniq -c
  return $rc
}

stage_warpspec_sanitize() {
  local log="$OUT/sanitizer-warpspec.log" rc=0
  : >"$log"
  sanitize_warpspec_cases "$log" \
    "--batch 2 --seqlen-q 77 --seqlen-k 130 --heads 4 --kv-heads 2 --head-dim 64 --causal" \
    "--batch 2 --seqlen-q 33 --seqlen-k 200 --heads 4 --kv-heads 1 --head-dim 128 --window 16,8 --alibi --softcap 20" \
    "--batch 2 --seqlen-q 300 --seqlen-k 333 --heads 4 --kv-heads 2 --head-dim 128 --causal" \
    "--batch 3 --seqlen-q 200 --seqlen-k 150 --heads 2 --kv-heads 1 --head-dim 256 --causal" \
    "--varlen --batch 4 --seqlen-q 300 --seqlen-k 333 --heads 4 --kv-heads 2 --head-dim 128 --causal" \
    "--kvcache --paged --page-size 16 --batch 2 --seqlen-q 200 --seqlen-k 600 --heads 8 --kv-heads 2 --head-dim 128 --causal --append 40" \
    "--kvcache --paged --page-size 32 --batch 2 --seqlen-q 130 --seqlen-k 300 --heads 4 --kv-heads 2 --head-dim 256 --causal" \
    "--kvcache --batch 2 --seqlen-q 150 --seqlen-k 500 --heads 4 --kv-heads 2 --head-dim 128 --causal --append 20 --rotary neox" || rc=1
  sanitize_index_faults "$log" warpspec || rc=1  # varlen's bad index values (paged too) on the warpspec kernel
  return $rc
}

# The FP8 products (D-75): the V transpose's pipeline, the e4m3 operands, O's own buffer.
stage_fp8_warpspec_sanitize() {
  local log="$OUT/sanitizer-fp8-warpspec.log"
  : >"$log"
  sanitize_warpspec_cases "$log" \
    "--dtype e4m3 --batch 2 --seqlen-q 300 --seqlen-k 333 --heads 4 --kv-heads 2 --head-dim 128 --causal" \
    "--dtype e4m3 --batch 3 --seqlen-q 200 --seqlen-k 150 --heads 2 --kv-heads 1 --head-dim 256 --window 16,8 --alibi --softcap 20" \
    "--dtype e4m3 --varlen --batch 4 --seqlen-q 300 --seqlen-k 333 --heads 4 --kv-heads 2 --head-dim 128" \
    "--kvcache --kv-dtype e4m3 --dtype e4m3 --paged --page-size 16 --batch 2 --seqlen-q 200 --seqlen-k 600 --heads 8 --kv-heads 2 --head-dim 128 --causal"
}

# The CLI cases the sanitizer stages run (--check against the CPU reference).
SANITIZE_CASES=(
  "--batch 2 --seqlen-q 77 --seqlen-k 130 --heads 4 --kv-heads 2 --head-dim 64 --causal"
  "--batch 2 --seqlen-q 33 --seqlen-k 200 --heads 4 --kv-heads 1 --head-dim 128 --window 16,8 --alibi --softcap 20"
  "--varlen --batch 3 --seqlen-q 65 --seqlen-k 129 --heads 4 --kv-heads 2 --head-dim 128"
  "--kvcache --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 1 --seqlen-k 300 --heads 8 --kv-heads 2 --head-dim 128 --causal --append 3 --rotary neox"
  "--kvcache --splits 12 --batch 2 --seqlen-q 1 --seqlen-k 1000 --heads 8 --kv-heads 2 --head-dim 128"
  "--kvcache --batch 2 --seqlen-q 1 --seqlen-k 1000 --heads 8 --kv-heads 2 --head-dim 64 --append 1 --rotary neox"
  "--batch 2 --seqlen-q 300 --seqlen-k 333 --heads 4 --kv-heads 2 --head-dim 128 --causal"
  "--kvcache --batch 1 --seqlen-q 1 --seqlen-k 1000 --heads 32 --kv-heads 8 --head-dim 128"
  "--kvcache --batch 1 --seqlen-q 1 --seqlen-k 4000 --heads 32 --kv-heads 8 --head-dim 128"
  "--kvcache --batch 1 --seqlen-q 1 --seqlen-k 6000 --heads 32 --kv-heads 8 --head-dim 128"
  "--kvcache --paged --page-size 16 --batch 1 --seqlen-q 1 --seqlen-k 1000 --heads 32 --kv-heads 8 --head-dim 128 --append 1"
  "--kvcache --paged --page-size 3 --batch 3 --seqlen-q 1 --seqlen-k 500 --heads 8 --kv-heads 2 --head-dim 64"
  "--kvcache --paged --page-size 40 --batch 2 --seqlen-q 1 --seqlen-k 400 --heads 8 --kv-heads 8 --head-dim 256"
  "--kvcache --splits 1 --batch 2 --seqlen-q 1 --seqlen-k 1000 --heads 8 --kv-heads 2 --head-dim 128"
  "--kvcache --paged --page-size 16 --splits 2 --batch 2 --seqlen-q 1 --seqlen-k 2000 --heads 8 --kv-heads 2 --head-dim 128"
  "--kvcache --batch 66 --seqlen-q 1 --seqlen-k 200 --heads 32 --kv-heads 8 --head-dim 128"
  "--kvcache --paged --page-size 16 --batch 66 --seqlen-q 1 --seqlen-k 300 --heads 32 --kv-heads 8 --head-dim 128 --append 1"
  "--kvcache --batch 33 --seqlen-q 3 --seqlen-k 150 --heads 16 --kv-heads 16 --head-dim 64 --causal --alibi --append 3 --rotary interleaved"
  "--kvcache --batch 34 --seqlen-q 2 --seqlen-k 150 --heads 16 --kv-heads 16 --head-dim 64 --causal --alibi --append 2 --rotary interleaved"
  # head dims that are not multiples of 8: staged, zero-padded copies (src/api/staging.h)
  "--batch 2 --seqlen-q 77 --seqlen-k 130 --heads 4 --kv-heads 2 --head-dim 59 --causal"
  "--varlen --batch 3 --seqlen-q 65 --seqlen-k 129 --heads 4 --kv-heads 2 --head-dim 1"
  "--kvcache --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 2 --seqlen-k 300 --heads 8 --kv-heads 2 --head-dim 111 --causal --append 2 --rotary neox"
)

stage_sanitize() {
  local log="$OUT/sanitizer.log" rc=0
  : >"$log"
  local cases=("${SANITIZE_CASES[@]}")
  local kernel
  for tool in memcheck racecheck; do
    for c in "${cases[@]}"; do
      sanitize_cli "$log" "$tool" "" $c || rc=1
      tail -n 2 "$log"
    done
    # every decode kernel and mma prefill, forced, on a decode and a prefill case each
    for kernel in mma wgmma warpspec splitkeys deep dims persistent heads automatic,combine=kernel,pdl=off; do
      for c in "${cases[3]}" "${cases[7]}" "${cases[0]}"; do
        sanitize_cli "$log" "$tool" "$kernel" $c || rc=1
      done
    done
  done
  # wgmma's barriers; the warpspec kernel's in stage_warpspec_sanitize
  for c in "${cases[0]}" "${cases[1]}" "${cases[6]}"; do
    sanitize_cli "$log" synccheck wgmma $c || rc=1
  done
  stage_warpspec_sanitize || rc=1
  sanitize_index_faults "$log" || rc=1
  stage_fp8sanitize || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sort | uniq -c
  return $rc
}

# Bad index values in device memory (tests/gpu/test_index_faults.cpp; the CLI cannot pass
# them): nothing read or written outside the tensors, on every kernel forced in turn.
# Arguments: the log, then the FLASHATTN_KERNEL values (default: every kernel).
sanitize_index_faults() {
  local log=$1 kernel rc=0
  shift
  local kernels=("$@")
  [ ${#kernels[@]} -gt 0 ] || kernels=(automatic mma warpspec splitkeys deep dims persistent heads automatic,combine=kernel,pdl=off)
  for kernel in "${kernels[@]}"; do
    echo "== memcheck IndexFaults FLASHATTN_KERNEL=$kernel" >>"$log"
    FLASHATTN_KERNEL=$kernel compute-sanitizer --tool memcheck --error-exitcode 9 "$CARRY/flashattn_tests_gpu" \
      --gtest_filter='IndexFaults.*' --gtest_brief=1 >>"$log" 2>&1 || rc=1
    tail -n 2 "$log"
  done
  return $rc
}

# The paged-cache subset of stage_sanitize (the block_table reads and checks, D-61): memcheck on
# its --paged cases, the first also with an e4m3 cache, racecheck on the first two; then the bad
# index values under the paged decode kernels.
stage_pagedsanitize() {
  local log="$OUT/sanitizer-paged.log" rc=0 c n=0
  : >"$log"
  for c in "${SANITIZE_CASES[@]}"; do
    [[ "$c" == *--paged* ]] || continue
    n=$((n + 1))
    sanitize_cli "$log" memcheck "" $c || rc=1
    [ $n -gt 1 ] || sanitize_cli "$log" memcheck "" $c --kv-dtype e4m3 || rc=1
    [ $n -gt 2 ] || sanitize_cli "$log" racecheck "" $c || rc=1
  done
  sanitize_index_faults "$log" automatic splitkeys persistent heads || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sort | uniq -c
  return $rc
}

# The FP8 cases of the GPU sweeps (tests/common/cases.cpp, names *e4m3*): the e4m3 mirror loads
# and widening (mma prefill, splitkeys decode), the quantizing append, 1-byte staging.
stage_fp8sanitize() {
  local log="$OUT/sanitizer.log" rc=0 tool
  local cases=(
    "--dtype e4m3 --batch 2 --seqlen-q 77 --seqlen-k 130 --heads 4 --kv-heads 2 --head-dim 128 --causal"
    "--kvcache --kv-dtype e4m3 --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 1 --seqlen-k 300 --heads 8 --kv-heads 2 --head-dim 128 --append 3 --rotary neox"
    "--kvcache --dtype e4m3 --batch 3 --seqlen-q 1 --seqlen-k 1000 --heads 32 --kv-heads 8 --head-dim 128 --append 1"
  )
  for tool in memcheck racecheck; do
    for c in "${cases[@]}"; do
      echo "== $tool: $c" >>"$log"
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$CLI" run --device cuda --repeat 1 --check $c >>"$log" 2>&1 || rc=1
      tail -n 2 "$log"
    done
    echo "== $tool FP8 sweep cases" >>"$log"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$CARRY/flashattn_tests_gpu" \
      --gtest_filter='Cuda/*e4m3*' --gtest_brief=1 >>"$log" 2>&1 || rc=1
    tail -n 3 "$log"
  done
  return $rc
}

stage_ab() {
  local round kernel
  for round in 1 2; do
    for kernel in ${AB:-automatic,grid=tiles automatic}; do
      echo "== FLASHATTN_KERNEL=$kernel, round $round"
      FLASHATTN_KERNEL="$kernel" "$CLI" bench --head-dims "${AB_DIMS:-128,256}" --repeat 20 2>/dev/null
    done
  done >"$OUT/ab.log"
  python3 bench/probes/ab_summary.py "$OUT/ab.log"
}

# Varlen prefill (random lengths up to --seqlen-q) on each prefill kernel forced in turn, CLI
# run --json, alternating, two rounds; the summary prints each case's best TFLOP/s per kernel
# (warpspec serves varlen since session 27, one CTA per query tile (D-79), against its persistent
# grid of 132 CTAs; before, wgmma did, and mma the e4m3 calls).
VARLEN_AB_CASES=(
  "--varlen --batch 16 --seqlen-q 2048 --heads 16 --head-dim 128"
  "--varlen --batch 16 --seqlen-q 2048 --heads 16 --head-dim 128 --causal"
  "--varlen --batch 64 --seqlen-q 512 --heads 16 --head-dim 128 --causal"
  "--varlen --batch 16 --seqlen-q 2048 --heads 8 --head-dim 256 --causal"
  "--dtype e4m3 --varlen --batch 16 --seqlen-q 2048 --heads 16 --head-dim 128"
  "--dtype e4m3 --varlen --batch 16 --seqlen-q 2048 --heads 16 --head-dim 128 --causal"
)
stage_varlen_ab() {
  local round kernel c
  for round in 1 2; do
    for c in "${VARLEN_AB_CASES[@]}"; do
      for kernel in mma wgmma warpspec warpspec,grid=132; do
        printf '%s\t%s\t' "$kernel" "$c"
        FLASHATTN_KERNEL="$kernel" "$CLI" run $c --repeat 20 --json 2>/dev/null || echo "{}"
      done
    done
  done >"$OUT/varlen-ab.log"
  best_tflops "$OUT/varlen-ab.log"
}

# A log of "label<TAB>case<TAB>CLI run --json record" lines: each case's best TFLOP/s per label,
# and with two labels given, the second's over the first's.
best_tflops() {
  python3 - "$@" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    label, case, record = line.rstrip("\n").split("\t")
    tflops = json.loads(record or "{}").get("tflops", 0.0)
    best.setdefault(case, {})[label] = max(best.get(case, {}).get(label, 0.0), tflops)
for case, by_label in best.items():
    ratio = ""
    if len(sys.argv) == 4:
        first, second = sys.argv[2:]
        ratio = f", {second}/{first} {by_label.get(second, 0.0) / max(by_label.get(first, 0.0), 1e-9):.3f}"
    print(case, " ".join(f"{k} {v:.0f}" for k, v in by_label.items()), f"TFLOP/s{ratio}")
PY
}

# Two builds of the same source side by side: build_variant configures build/variant with the
# preset, CMAKE_ARGS and VARIANT_ARGS (e.g. -DFLASHATTN_HEAD_DIMS=128) and builds its CLI
# alone; variant_ab runs VARIANT_AB_CASES (CLI run flags; default the FP8 prefill grid at d 128
# and 256) on the installed CLI ("main") and the variant's, alternating, two rounds, and prints
# each case's best TFLOP/s per build. Log: variant-ab.log. Run build_variant after build, not beside
# it: the two at once (session 28) took past the 600 s a device call may run.
VARIANT_AB_CASES=(
  "--dtype e4m3 --batch 4 --seqlen-q 4096 --heads 16 --head-dim 128"
  "--dtype e4m3 --batch 4 --seqlen-q 4096 --heads 16 --head-dim 128 --causal"
  "--dtype e4m3 --batch 1 --seqlen-q 16384 --heads 16 --head-dim 128"
  "--dtype e4m3 --batch 1 --seqlen-q 16384 --heads 16 --head-dim 128 --causal"
  "--dtype e4m3 --batch 4 --seqlen-q 4096 --heads 8 --head-dim 256"
  "--dtype e4m3 --batch 1 --seqlen-q 16384 --heads 8 --head-dim 256 --causal"
  "--batch 4 --seqlen-q 4096 --heads 16 --head-dim 128"
)
stage_build_variant() {
  cmake --preset "$PRESET" -B build/variant -DFLASHATTN_CUTLASS_INCLUDE="$PWD/$CARRY/cutlass" \
    -DCMAKE_PREFIX_PATH="$PWD/$CARRY/gtest" ${CMAKE_ARGS:-} ${VARIANT_ARGS:-} >"$OUT/build-variant.log" 2>&1 &&
    cmake --build build/variant --target flashattn_cli -j "$(nproc)" >>"$OUT/build-variant.log" 2>&1 ||
    { tail -n 40 "$OUT/build-variant.log"; return 1; }
}
stage_variant_ab() {
  local round build cli c
  local variant_cli
  variant_cli=$(find build/variant -name flashattn -type f -perm -u+x | head -n 1)
  for round in 1 2; do
    for c in "${VARIANT_AB_CASES[@]}"; do
      for build in main variant; do
        cli=$CLI
        [ "$build" = variant ] && cli=$variant_cli
        printf '%s\t%s\t' "$build" "$c"
        "$cli" run $c --repeat 20 --json 2>/dev/null || echo "{}"
      done
    done
  done >"$OUT/variant-ab.log"
  best_tflops "$OUT/variant-ab.log" main variant
}

# Paged decode against contiguous (the block_table checks' cost, D-61): the CLI's decode grid at
# PAGE_BATCHES x PAGE_CONTEXTS, contiguous and with pages of 1 and 16 rows, alternating, two rounds.
stage_pagecost() {
  local round page
  for round in 1 2; do
    for page in 0 1 16; do
      echo "== page $page, round $round"
      "$CLI" bench --decode --batches "${PAGE_BATCHES:-1,8,32}" --seqlens "${PAGE_CONTEXTS:-4096,16384,65536}" \
        --repeat 20 $([ "$page" = 0 ] || echo --page-size "$page") 2>/dev/null
    done
  done | tee "$OUT/pagecost.log" | grep -v "^$"
}

stage_spills() {
  python3 bench/probes/spill_cost.py --cli "$CLI" --out "$OUT" 2>&1 | tee "$OUT/spills.log"
  return "${PIPESTATUS[0]}"
}

stage_floor() {
  python3 bench/probes/l2_state.py --points 32x4096 --flushes dirty --read-floor --rounds 2 2>&1 | tee "$OUT/floor.log" | tail -n 5
  return "${PIPESTATUS[0]}"
}

stage_probe() {
  "$CARRY/stream_probe" | tee "$OUT/stream-probe.log"
  return "${PIPESTATUS[0]}"
}

# One ncu run per L2 state; the CSV and its per-call summary go to $OUT.
stage_dram() {
  local flush points="${DRAM_POINTS:-8x16384 32x4096 128x1024}" rc=0
  for flush in dirty clean; do
    ncu --profile-from-start off --cache-control none --clock-control none --csv --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      python3 bench/probes/decode_ncu.py --flash --flush "$flush" $points >"$OUT/dram-$flush.csv" 2>>"$OUT/dram.err" || rc=1
    echo "== $flush flush"
    python3 bench/probes/decode_ncu.py --flash --summarize "$OUT/dram-$flush.csv" $points | tee -a "$OUT/dram.log"
  done
  return $rc
}

# BENCH="prefill decode chunked" (default) picks the tables (also prefill-fp8, decode-fp8); BENCH_ARGS adds bench.py options.
stage_profile() {
  local log="$OUT/profile.log" dtype rc=0
  local args="${PROFILE_ARGS:---batch 2 --seqlen-q 8192 --seqlen-k 8192 --heads 16 --kv-heads 16 --head-dim 128}"
  : >"$log"
  for dtype in bf16 e4m3; do
    echo "== $dtype $args" >>"$log"
    ncu --kernel-name regex:warpspec --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active" \
      "$CLI" run --device cuda --dtype "$dtype" --repeat 3 $args >>"$log" 2>&1 || rc=1
  done
  python3 bench/probes/profile_summary.py "$log" --out "$OUT/profile-warpspec-h200.json" || rc=1
  return $rc
}

# Where the warpspec kernel's warps stall, per SASS instruction: Nsight Compute's warp-state
# sampling (SourceCounters) of one launch per HOTSPOT_CASES entry, the source page as CSV
# (hotspots-N.csv.gz), summarized by bench/probes/stall_hotspots.py. Log: hotspots.log
HOTSPOT_CASES=(
  "--dtype bf16 --batch 32 --seqlen-q 512 --seqlen-k 512 --heads 16 --kv-heads 16 --head-dim 128 --causal"
  "--dtype e4m3 --batch 2 --seqlen-q 8192 --seqlen-k 8192 --heads 16 --kv-heads 16 --head-dim 128"
)
stage_hotspots() {
  local log="$OUT/hotspots.log" i=0 c rc=0
  : >"$log"
  for c in "${HOTSPOT_CASES[@]}"; do
    i=$((i + 1))
    echo "== case $i: $c" | tee -a "$log"
    ncu --kernel-name regex:warpspec --launch-skip 1 --launch-count 1 --section SourceCounters \
      --section WarpStateStats --import-source no -f -o "/tmp/hotspots-$i" \
      "$CLI" run --device cuda --repeat 3 $c >>"$log" 2>&1 || rc=1
    ncu -i "/tmp/hotspots-$i.ncu-rep" --page source --csv --print-source sass >"/tmp/hotspots-$i.csv" 2>>"$log" || rc=1
    gzip -c "/tmp/hotspots-$i.csv" >"$OUT/hotspots-$i.csv.gz"
    python3 bench/probes/stall_hotspots.py "/tmp/hotspots-$i.csv" --top 40 2>&1 | tee -a "$log" | head -n 30
  done
  return $rc
}

# Libraries built on the development machine, side by side (no build here): AB_PREFIXES, carried
# install prefixes (e.g. ".carry/p-main .carry/p-v4", each `cmake --install` of a build with
# -DFLASHATTN_BUILD_TESTS=OFF and a few head dims; carry them all), the Python extension built
# once against the first and loaded with each library in turn (LD_LIBRARY_PATH, checked from
# /proc/self/maps), AB_PROBE (a bench/probes command line, default the FP8 decode split probe at
# the points issue 29 lacks) run over the list twice. Log: prefix-ab.log.
stage_prefix_ab() {
  local prefixes=(${AB_PREFIXES:?AB_PREFIXES: carried install prefixes, the first one main})
  local probe=${AB_PROBE:-bench/probes/fp8_decode_splits.py --points 8x16384,32x4096,128x1024,128x4096 --splits 0}
  stage_pyext "$PWD/${prefixes[0]}" || return 1
  local round prefix
  for round in 1 2; do
    for prefix in "${prefixes[@]}"; do
      echo "== $prefix, round $round"
      LD_LIBRARY_PATH="$PWD/$prefix/lib" python3 -c \
        "import flashattn; print('loaded', [l.split()[-1] for l in open('/proc/self/maps') if 'libflashattn' in l][0])"
      LD_LIBRARY_PATH="$PWD/$prefix/lib" PYTHONUNBUFFERED=1 python3 $probe
    done
  done 2>&1 | tee "$OUT/prefix-ab.log"
}

stage_bench() {
  local kind name
  for kind in ${BENCH:-prefill decode chunked}; do
    name=$kind
    [ "$kind" = chunked ] && name=prefill-paged
    PYTHONUNBUFFERED=1 python3 bench/bench.py "$kind" ${BENCH_ARGS:-} --out "$OUT/$name-h200.json" \
      --plot "$OUT/$name-h200.png" 2>>"$OUT/bench.err"
  done
}

for s in "${stages[@]}"; do
  echo "######## stage $s"
  "stage_$s" || { echo "######## stage $s FAILED"; status=1; }
done
exit $status
