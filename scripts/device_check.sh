#!/usr/bin/env bash
# The one GPU job: run on the H200 machine (device tool) from the repo root, with the build
# folder made here carried along (build/gpu-h200 by default). Stages, in order, any subset:
#   test      ctest -L gpu (the GPU sweep) on the carried build
#   python    build the nanobind extension there against the carried library, pytest -m gpu
#   sanitize  compute-sanitizer memcheck + racecheck on a representative subset
#   bench     bench/bench.py prefill + decode, side by side with PyTorch SDPA (flash, cudnn)
# Logs, JSON and PNG go to $OUT. Example:
#   bash scripts/device_check.sh test python sanitize bench
set -uo pipefail
OUT="${OUT:-/tmp/flashattn-out}"
BUILD="${BUILD:-build/gpu-h200}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(test python sanitize bench)

# The carried build tree holds absolute paths of the development machine (/work/main/...).
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
cd /work/main
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
CLI="$BUILD/tools/flashattn"
status=0

stage_test() {
  (cd "$BUILD" && ctest -L gpu --output-on-failure -j 4) 2>&1 | tee "$OUT/ctest-gpu.log" | tail -n 30
  return "${PIPESTATUS[0]}"
}

stage_python() {
  cmake --install "$BUILD" --prefix /tmp/fa-prefix >/dev/null || return 1
  cmake -S python -B /tmp/fa-ext -G Ninja -DFLASHATTN_PREBUILT=/tmp/fa-prefix \
    -DPython_EXECUTABLE="$(command -v python3)" >"$OUT/python-build.log" 2>&1 &&
    cmake --build /tmp/fa-ext -j 16 >>"$OUT/python-build.log" 2>&1 || { tail -n 30 "$OUT/python-build.log"; return 1; }
  export PYTHONPATH="/tmp/fa-ext/site:${PYTHONPATH:-}"
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/python 2>&1 | tee "$OUT/pytest-gpu.log" | tail -n 20
  return "${PIPESTATUS[0]}"
}

stage_sanitize() {
  local log="$OUT/sanitizer.log" rc=0
  : >"$log"
  local cases=(
    "--batch 2 --seqlen-q 77 --seqlen-k 130 --heads 4 --kv-heads 2 --head-dim 64 --causal"
    "--batch 2 --seqlen-q 33 --seqlen-k 200 --heads 4 --kv-heads 1 --head-dim 128 --window 16,8 --alibi --softcap 20"
    "--varlen --batch 3 --seqlen-q 65 --seqlen-k 129 --heads 4 --kv-heads 2 --head-dim 128"
    "--kvcache --paged --page-size 16 --splits 3 --batch 2 --seqlen-q 1 --seqlen-k 300 --heads 8 --kv-heads 2 --head-dim 128 --causal --append 3 --rotary neox"
  )
  for tool in memcheck racecheck; do
    for c in "${cases[@]}"; do
      echo "== $tool: $c" >>"$log"
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$CLI" run --device cuda --dtype bf16 --repeat 1 --check $c >>"$log" 2>&1 || rc=1
      tail -n 2 "$log"
    done
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sort | uniq -c
  return $rc
}

stage_bench() {
  export PYTHONPATH="/tmp/fa-ext/site:${PYTHONPATH:-}"
  PYTHONUNBUFFERED=1 python3 bench/bench.py prefill --out "$OUT/prefill-h200.json" --plot "$OUT/prefill-h200.png" 2>"$OUT/bench-prefill.err" | tee "$OUT/bench-prefill.txt"
  PYTHONUNBUFFERED=1 python3 bench/bench.py decode --out "$OUT/decode-h200.json" --plot "$OUT/decode-h200.png" 2>"$OUT/bench-decode.err" | tee "$OUT/bench-decode.txt"
}

for s in "${stages[@]}"; do
  echo "######## stage $s"
  "stage_$s" || { echo "######## stage $s FAILED"; status=1; }
done
exit $status
