#!/usr/bin/env bash
# GPU validation + benchmarks of the CUDA executor, as run through the device tool on an H200:
#   bash bench/run_gpu.sh tests|bench-quick|bench-full|ratios  (logs and reports go to $OUT, default bench/results)
# Every report records the exact `ninfer bench` command that produced it.
set -uo pipefail
OUT=${OUT:-bench/results}
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
B="python3 -m ninfer.cli bench engine"
bench() {  # name, timeout, args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" $B "$@" --json "$OUT/$name.json" --md "$OUT/$name.md" 2>&1 | grep -v "Warning\|warn(" | tail -8
}
case "${1:-tests}" in
  tests)
    timeout 200 python3 -m pytest tests/runtime/test_cuda_executor.py -q --maxfail=8 -p no:cacheprovider --timeout 90 ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/test_cuda_executor.log" | tail -15
    ;;
  bench-quick)
    bench qwen3-8b-bf16 170 --synthetic qwen3-8b --weights bf16 --batch-sizes 1,8 --input-len 512 --output-len 64 --peer transformers
    bench qwen3.5-9b-hybrid-bf16 130 --synthetic qwen3.5-9b-hybrid --weights bf16 --batch-sizes 1,8 --input-len 512 --output-len 64
    ;;
  bench-full)
    bench qwen3-8b-fp8 120 --synthetic qwen3-8b --weights fp8 --batch-sizes 1,8 --input-len 512 --output-len 64
    bench qwen3-8b-nvfp4 120 --synthetic qwen3-8b --weights nvfp4 --batch-sizes 1,8 --input-len 512 --output-len 64
    bench qwen3-8b-bf16-prefill4096 120 --synthetic qwen3-8b --weights bf16 --batch-sizes 1 --input-len 4096 --output-len 16
    ;;
  ratios)  # batch 1 in every weight format, one process each, back to back: the fp8 / nvfp4 ratios
    for w in bf16 fp8 nvfp4; do
      bench qwen3-8b-$w-b1 90 --synthetic qwen3-8b --weights $w --batch-sizes 1 --input-len 512 --output-len 64
    done
    ;;
esac
