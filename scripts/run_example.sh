#!/usr/bin/env bash
# Sets up and runs the main job: the flashattn CLI on a built-in example, checked against the
# float64 reference. On a machine with an NVIDIA GPU it builds the CUDA backend (sm_90a,
# head dims 64/128) and runs there; otherwise it builds the CPU backend and runs there.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
python3 -m pip install -q -r requirements.txt
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  preset=gpu-dev
else
  preset=cpu
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$JOBS" --target flashattn_cli
./build/"$preset"/tools/flashattn run --device auto --batch 2 --seqlen-q 512 --seqlen-k 512 \
  --heads 8 --kv-heads 2 --head-dim 128 --causal --check "$@"
