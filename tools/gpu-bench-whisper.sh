#!/usr/bin/env bash
# On the lent H200 machine, after .gpu/install.sh (docs/gpu.md): issue 18 part 2's Whisper figures.
# Paired, interleaved rounds (harness.tools.bench_whisper over harness.tools.bench_paired): the
# in-tree faithful path, the in-tree fast path and mlx-whisper, each in its own process, every side
# transcribing every clip once per round; best-of, median and min..max RTF per side and clip, and
# the per-round speed-ups. Then the faithful L1 gates of the turbo fp16 twin on CUDA (mel, encoder,
# every decode step's pre-filter logits free and teacher-forced, tokens, transcript, fallback
# decisions: bit-exact against mlx-whisper). Then, in the time left, where each side's time goes
# (`bench-whisper --profile`: log-Mel, one encoder window, one greedy decode call and its ms per
# decoder step). Results (JSON, logs, reports) under $OUT.
# Usage: bash tools/gpu-bench-whisper.sh [all|bench|gates|profile]   (all, the default: the three
#   in that order, within BUDGET=525 s: bench <= 280 s, gates <= 170 s, profile in what is left)
#   ROUNDS (default 5), CLIPS (default fox.wav,long.wav), MODEL (default whisper-large-v3-turbo-fp16)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
export MLX_PARITY_ORACLE_PYTHON=$(command -v python3) MLX_PARITY_ORACLE_PYTHONPATH=/tmp/site
export MLX_PARITY_CACHE=${MLX_PARITY_CACHE:-/root/parity-cache} HF_HUB_OFFLINE=1
# Goldens stay on the machine: $OUT brings back at most 8 files (7 here: logs, JSON, the report).
export MLX_PARITY_GOLDENS=${MLX_PARITY_GOLDENS:-/root/parity-goldens} MLX_PARITY_REPORTS=$OUT
MODEL=${MODEL:-whisper-large-v3-turbo-fp16} ROUNDS=${ROUNDS:-5} CLIPS=${CLIPS:-fox.wav,long.wav}
started=$(date +%s)

# The twins' vocabulary: where the wheel fetch would put it (sha256-checked), from .gpu/ when
# carried, else from the mlx-whisper wheel install.sh put into /tmp/site.
vocab_sha=b34b360dbb493e781e479794586d661700670d65564001f23024971d1f2fa126
vocab=$MLX_PARITY_CACHE/downloads/mlx-whisper-0.4.3/$vocab_sha/multilingual.tiktoken
for source in .gpu/multilingual.tiktoken /tmp/site/mlx_whisper/assets/multilingual.tiktoken; do
  if [ -f "$source" ] && [ ! -f "$vocab" ]; then
    mkdir -p "$(dirname "$vocab")"
    echo "$vocab_sha  $source" | sha256sum -c --quiet - && cp "$source" "$vocab"
  fi
done
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/device.txt" 2>&1

left() { echo $(( ${BUDGET:-525} - ($(date +%s) - started) )); }  # seconds left of the whole command's budget
bench() {
  timeout "${BENCH_TIMEOUT:-280}" python3 -m harness bench-whisper --model "$MODEL" --rounds "$ROUNDS" \
    --paths faithful,fast,mlx-whisper --clips "$CLIPS" --out "$OUT/bench-whisper-$MODEL.json" \
    > "$OUT/bench-whisper.log" 2>&1
  local status=$?
  tail -16 "$OUT/bench-whisper.log"
  echo "bench-whisper: exit $status after $(( $(date +%s) - started )) s"
  return $status
}
gates() {
  timeout "${GATES_TIMEOUT:-170}" python3 -m harness parity --model "$MODEL" > "$OUT/parity-$MODEL.log" 2>&1
  local status=$?
  tail -8 "$OUT/parity-$MODEL.log"
  echo "parity: exit $status after $(( $(date +%s) - started )) s"
  return $status
}
profile() {  # where the time goes: log-Mel, one encoder window, one greedy decode call (ms per step)
  local budget; budget=$(left)
  if [ "$budget" -lt 60 ]; then echo "profile: skipped, ${budget} s left"; return 0; fi
  timeout "$budget" python3 -m harness bench-whisper --model "$MODEL" --profile 5 \
    --paths faithful,fast,mlx-whisper --clips fox.wav --out "$OUT/profile-whisper-$MODEL.json" \
    > "$OUT/profile-whisper.log" 2>&1
  local status=$?
  tail -11 "$OUT/profile-whisper.log"
  echo "profile: exit $status after $(( $(date +%s) - started )) s"
  return $status
}
case "${1:-all}" in
  all) bench; b=$?; gates; g=$?; profile; exit $(( b || g )) ;;
  bench) bench ;;
  gates) gates ;;
  profile) profile ;;
  *) echo "usage: $0 [all|bench|gates|profile]"; exit 2 ;;
esac
