#!/usr/bin/env bash
# On the lent H200 machine, after .gpu/install.sh (docs/gpu.md): issue 18's decode figures.
# Paired, interleaved rounds (harness.tools.bench_paired): in-tree eager, in-tree compiled and
# mlx-lm, each in its own process, every side timed once per round; best-of, median, IQR and
# min..max per side and per-round ratio. Then the compiled step gates on CUDA. Results under $OUT.
# A ratio quoted in docs/benchmarks.md needs at least 15 rounds (with its IQR): the default is 20.
# Usage: bash tools/gpu-bench-decode.sh bench|blocks|gates   (each run stays under 10 minutes)
#   bench:  variant auto (= whole on CUDA), 255 steps, 20 rounds (STEPS=, ROUNDS= to change)
#   blocks: variant blocks (in-place KV block writes, fixed-shape traces), 255 steps, 20 rounds
#   gates:  the L1 step gates through the compiled loop (auto and blocks) + compiled_decode parity
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
export MLX_PARITY_ORACLE_PYTHON=$(command -v python3) MLX_PARITY_ORACLE_PYTHONPATH=/tmp/site
export MLX_PARITY_CACHE=/root/parity-cache HF_HUB_OFFLINE=1
export MLX_PARITY_GOLDENS=$OUT/goldens MLX_PARITY_REPORTS=$OUT
MODEL=${MODEL:-minicpm5-2b} STEPS=${STEPS:-255} ROUNDS=${ROUNDS:-20}
bench() {  # $1 = variant
  timeout 560 python3 -m harness bench-compiled --model "$MODEL" --steps "$STEPS" --rounds "$ROUNDS" \
    --variant "$1" --out "$OUT/bench-decode-$MODEL-$1.json" > "$OUT/bench-decode-$1.log" 2>&1
  tail -16 "$OUT/bench-decode-$1.log"
}
case "${1:-}" in
  bench) bench auto ;;
  blocks) bench blocks ;;
  gates)
    for v in auto blocks; do
      timeout 250 python3 -m harness bench-compiled --model "$MODEL" --gate --variant "$v" \
        --scenario think-default-32 --scenario chat-think-off > "$OUT/gate-decode-$v.log" 2>&1
      tail -4 "$OUT/gate-decode-$v.log"
    done
    timeout 300 python3 -m harness parity --model "$MODEL" -k "compiled_decode" > "$OUT/parity-decode.log" 2>&1
    tail -8 "$OUT/parity-decode.log" ;;
  *) echo "usage: $0 bench|blocks|gates"; exit 2 ;;
esac
