#!/usr/bin/env bash
# On the lent H200 machine, after .gpu/install.sh (docs/gpu.md): issue 18 part 5, the mutants that
# float32 may round away (final-norm-eps, imprecise-softmax, dequant-fused-sdpa) judged on the
# half-precision twins on CUDA, each run with a control mutant that must be killed there (one-ulp,
# decoder-ulp), so a column of survivors cannot be a setup that kills nothing. Goldens for the GPU's
# key are made there by its interpreter as oracle. Each stage stays under 10 minutes; results under
# $OUT: mutants-<model>.log, mutants-<model>.json (the verdicts), matrix.md (mutant x model, every
# JSON under $OUT), goldens.tgz. Exit status: that of the last failing stage (mutants: 1 when a
# mutant survives or is unjudged, e.g. quantized KV, which mlx 0.32.4's CUDA backend cannot run).
# Usage: bash tools/gpu-mutants.sh STAGE [STAGE ...]
#   bf16:    minicpm5-2b-mini-bf16 (chat-bf16, kv8-from-prefill)   one-ulp + the three
#   fp16:    minicpm5-2b-mini-fp16 (chat-fp16, kv8-from-prefill)   one-ulp + the three
#   whisper: whisper-large-v3-turbo-fp16 (fox-english; the full-size fp16 twin, built there; needs
#            .gpu/multilingual.tiktoken as for tools/gpu-parity.sh)   decoder-ulp + imprecise-softmax
#   f32:     the float32 mini twins on CUDA, for contrast: minicpm5-2b-mini (one-ulp + the three),
#            whisper-large-v3-turbo-mini (decoder-ulp + imprecise-softmax)
# Here, over the JSON files brought back: bash tools/gpu-mutants.sh matrix FILE.json ...
set -uo pipefail
PY=${PYTHON:-python3}
LLM_MUTANTS=one-ulp,final-norm-eps,imprecise-softmax,dequant-fused-sdpa
WHISPER_MUTANTS=decoder-ulp,imprecise-softmax
if [ "${1:-}" = matrix ]; then
  shift
  exec "$PY" -m harness mutants --summarize "$@"
fi
export PYTHONPATH=/tmp/site:$PWD
export MLX_PARITY_ORACLE_PYTHON=$(command -v python3) MLX_PARITY_ORACLE_PYTHONPATH=/tmp/site
export MLX_PARITY_CACHE=/root/parity-cache HF_HUB_OFFLINE=1 MLX_PARITY_LOCALIZE=0
export MLX_PARITY_GOLDENS=$OUT/goldens MLX_PARITY_REPORTS=$OUT
. "$(dirname "$0")/gpu-whisper-vocab.sh"
python3 -c "import mlx.core as mx, json; print(mx.__version__, mx.default_device(), json.dumps(mx.device_info(), default=str))" \
  > "$OUT/device.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/device.txt" 2>&1
status=0
judge() {  # $1 = model, $2 = mutants, $3 = seconds
  timeout "$3" python3 -m harness mutants --only "$2" --model "$1" --json "$OUT/mutants-$1.json" \
    > "$OUT/mutants-$1.log" 2>&1 || status=$?
  grep -E '^\| [a-z0-9-]+ \| .* \| [0-9]+ \|$' "$OUT/mutants-$1.log" | sort -u
  grep -E '^mutation score' "$OUT/mutants-$1.log" || tail -5 "$OUT/mutants-$1.log"
}
for stage in "$@"; do
  case "$stage" in
    bf16) judge minicpm5-2b-mini-bf16 "$LLM_MUTANTS" 500 ;;
    fp16) judge minicpm5-2b-mini-fp16 "$LLM_MUTANTS" 500 ;;
    whisper) judge whisper-large-v3-turbo-fp16 "$WHISPER_MUTANTS" 540 ;;
    f32)
      judge minicpm5-2b-mini "$LLM_MUTANTS" 280
      judge whisper-large-v3-turbo-mini "$WHISPER_MUTANTS" 250 ;;
    *) echo "usage: $0 bf16|fp16|whisper|f32 ... | matrix FILE.json ..."; exit 2 ;;
  esac
done
if ls "$OUT"/mutants-*.json > /dev/null 2>&1; then
  python3 -m harness mutants --summarize "$OUT"/mutants-*.json > "$OUT/matrix.md" && cat "$OUT/matrix.md"
fi
[ -d "$OUT/goldens" ] && (cd "$OUT" && tar -czf goldens.tgz goldens && rm -rf goldens)
exit $status
