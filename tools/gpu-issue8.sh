#!/usr/bin/env bash
# On the lent GPU machine, after .gpu/install.sh (docs/gpu.md): the compiled-decode figures and
# gates, and the Whisper fast path's speed-up. Results (logs, JSON) under $OUT.
# Usage: bash tools/gpu-issue8.sh compiled|parity|whisper|overhead
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
export MLX_PARITY_ORACLE_PYTHON=$(command -v python3) MLX_PARITY_ORACLE_PYTHONPATH=/tmp/site
export MLX_PARITY_CACHE=/root/parity-cache HF_HUB_OFFLINE=1
export MLX_PARITY_GOLDENS=$OUT/goldens MLX_PARITY_REPORTS=$OUT
case "${1:-}" in
  compiled)
    timeout 330 python3 -m harness bench-compiled --model minicpm5-2b --steps 128 --repeats 3 \
      --out "$OUT/bench-compiled-minicpm5-2b.json" > "$OUT/bench-compiled.log" 2>&1; tail -25 "$OUT/bench-compiled.log"
    timeout 200 python3 -m harness bench-compiled --model minicpm5-2b --gate --scenario think-default-32 \
      --scenario chat-think-off > "$OUT/gate-compiled.log" 2>&1; tail -15 "$OUT/gate-compiled.log" ;;
  parity)
    timeout 500 python3 -m harness parity --model minicpm5-2b --model minicpm5-2b-mini -k "compiled_decode" \
      > "$OUT/parity-compiled.log" 2>&1; tail -25 "$OUT/parity-compiled.log" ;;
  whisper)
    vocab_sha=b34b360dbb493e781e479794586d661700670d65564001f23024971d1f2fa126
    vocab=$MLX_PARITY_CACHE/downloads/mlx-whisper-0.4.3/$vocab_sha/multilingual.tiktoken
    if [ -f .gpu/multilingual.tiktoken ] && [ ! -f "$vocab" ]; then
      mkdir -p "$(dirname "$vocab")" && cp .gpu/multilingual.tiktoken "$vocab"
    fi
    timeout 500 python3 -m harness bench-whisper --model whisper-large-v3-turbo-fp16 --repeats 3 \
      --paths faithful,fast,mlx-whisper --clips fox.wav,long.wav --out "$OUT/bench-whisper-fast.json" \
      > "$OUT/bench-whisper-fast.log" 2>&1; tail -20 "$OUT/bench-whisper-fast.log" ;;
  overhead)
    timeout 500 python3 -m harness bench --model minicpm5-2b --per-step > "$OUT/bench-per-step.log" 2>&1
    tail -14 "$OUT/bench-per-step.log" ;;
  *) echo "usage: $0 compiled|parity|whisper|overhead"; exit 2 ;;
esac
