# Sourced by tools/gpu-parity.sh and tools/gpu-mutants.sh (after MLX_PARITY_CACHE is set): places the
# whisper twins' vocabulary, carried as .gpu/multilingual.tiktoken (a data file of the mlx-whisper
# wheel), where the wheel fetch would put it, sha256-checked.
vocab_sha=b34b360dbb493e781e479794586d661700670d65564001f23024971d1f2fa126
vocab=$MLX_PARITY_CACHE/downloads/mlx-whisper-0.4.3/$vocab_sha/multilingual.tiktoken
if [ -f .gpu/multilingual.tiktoken ] && [ ! -f "$vocab" ]; then
  mkdir -p "$(dirname "$vocab")"
  echo "$vocab_sha  .gpu/multilingual.tiktoken" | sha256sum -c - && cp .gpu/multilingual.tiktoken "$vocab"
fi
