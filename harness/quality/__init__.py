"""Quantization quality against a control, reported apart from parity (docs/quality.md).

sides.py (a pair's model directories) -> oracle.py (the oracle's per-token arrays, in its venv)
-> store.py (the cache) -> intree.py (the in-tree cross-check, bit for bit) -> metrics.py
(float64 summaries) -> report.py / page.py (table, JSON, HTML); run.py wires one pair, cli.py is
`python -m harness quality`. Speech pairs go to whisper.py (the Whisper measurement layer:
whisper_candidate.py builds the MLX-quantized candidate, whisper_intree.py cross-checks).
"""
