#!/bin/bash
# The two screens in docs/screens/ and the reports tests/test_screen.py renders from
# tests/fixtures/screens/, made on one clone with a fresh cache (CACHE, default .cache-screens):
# `make parity` in an 80x50 tmux, passing; then with every in-tree RMSNorm output nudged by 2^-20
# (tools/nudge-norms.patch: every scenario fails). Prints each run's wall time (the pair that
# docs/benchmarks.md quotes, "A failing verdict"). Needs tmux and bc; run from the repo root
# on a quiet machine; models/universal/model.py is restored at the end.
set -eu
root=$(pwd)
cache=${CACHE:-$root/.cache-screens}
rm -rf "$cache"; mkdir -p "$cache"
git checkout -q -- models/universal/model.py
tmux kill-session -t parity-screens 2>/dev/null || true
tmux new-session -d -s parity-screens -x 80 -y 50 -c "$root" "env -u CI MLX_PARITY_CACHE=$cache PS1='$ ' bash --norc"
tmux set-option -t parity-screens history-limit 100000 >/dev/null
sleep 1
run() {  # $1: pass or fail
  tmux send-keys -t parity-screens "clear; tmux clear-history" Enter; sleep 1
  local s e
  s=$(date +%s.%N)
  tmux send-keys -t parity-screens "make parity" Enter
  sleep 3
  while [ "$(tmux display -p -t parity-screens '#{pane_current_command}')" != "bash" ]; do sleep 1; done
  e=$(date +%s.%N)
  tmux capture-pane -p -t parity-screens -S - > "docs/screens/parity-$1.txt"
  newest=$(ls -t reports/parity-*.json | head -n 1)
  gzip -9 -n -c "$newest" > "tests/fixtures/screens/parity-$1.json.gz"
  echo "$1: $(echo "$e - $s" | bc) s wall ($newest)"
}
run pass
git apply tools/nudge-norms.patch
trap 'git checkout -q -- models/universal/model.py' EXIT
run fail
tmux kill-session -t parity-screens
