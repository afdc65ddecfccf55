#!/usr/bin/env bash
# One device call: GPU tests, then both benchmarks; logs and JSON under $OUT. Usage: bash benchmarks/gpu_run.sh [tests|flce|ops]...
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
parts=${*:-tests flce ops}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
for p in $parts; do
  case $p in
    tests) GPU_TEST_REPORT=$OUT/gpu_tests.json timeout ${T_TESTS:-240} python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_gpu.py 2>&1 | tee $OUT/gpu_tests.log | tail -30 ;;
    flce) timeout ${T_FLCE:-200} python3 benchmarks/bench_flce.py 2>&1 | tee $OUT/bench_flce.log | tail -30 ;;
    ops) timeout ${T_OPS:-150} python3 benchmarks/bench_ops.py 2>&1 | tee $OUT/bench_ops.log | tail -24 ;;
  esac
done
