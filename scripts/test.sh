#!/usr/bin/env bash
# Sets up and runs the tests: C++ (ctest: CPU suite; the GPU suite skips without a GPU),
# Python (pytest), and a compile of one CUDA kernel instance set when nvcc is present.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"

python3 -m pip install -q -r requirements.txt

echo "== C++ build (CPU backend) and ctest"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$JOBS"
ctest --preset cpu -j "$JOBS"

echo "== Python package (CPU) and pytest"
python3 -m pip install -q . 
(cd tests/python && python3 -m pytest -q -p no:cacheprovider .)

if command -v nvcc >/dev/null 2>&1; then
  echo "== CUDA compile check (bf16, head dim 128, sm_90a)"
  cmake --preset cuda-compile-check >/dev/null
  cmake --build --preset cuda-compile-check -j "$JOBS"
fi
echo "== all tests passed"
