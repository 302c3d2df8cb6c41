"""mlx-whisper writers oracle: runs inside the oracle's own venv, never imports the harness.

Reads a transcript (the JSON of `mlx_whisper.transcribe`'s result, or a golden's
`transcript`) and writes it in every format with `mlx_whisper.writers.get_writer`, the word
options passed as the mlx_whisper CLI passes them (keyword arguments of the writer call).

Usage: python -I writers.py --job JOB.json --out DIR, the job
  {"result": transcript, "audio_name": NAME, "options": {...} or [{...}, ...]}
  writes DIR/<NAME, suffix replaced>.{txt,vtt,srt,tsv,json}
`options` holds any of max_line_width, max_line_count, highlight_words, max_words_per_line;
a list of such objects writes option set i into DIR/i/ (one interpreter start for them all:
importing mlx_whisper costs seconds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# oracles/common by path: the venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402

FORMATS = ("txt", "vtt", "srt", "tsv", "json")
WORD_OPTIONS = frozenset({"max_line_width", "max_line_count", "highlight_words", "max_words_per_line"})


def _check_option_set(where: str, options) -> dict:
    if not isinstance(options, dict):
        raise SystemExit(f"{where}: expected a JSON object, got {type(options).__name__}")
    unknown = sorted(set(options) - WORD_OPTIONS)
    if unknown:
        raise SystemExit(f"{where}: unknown keys {unknown} (known: {', '.join(sorted(WORD_OPTIONS))})")
    return options


def parse_options(options) -> dict | list[dict]:
    """The writer keyword arguments (one object, or a list of them); anything but the four
    word options is an error."""
    if isinstance(options, list):
        return [_check_option_set(f"options[{i}]", o) for i, o in enumerate(options)]
    return _check_option_set("options", options)


def main() -> int:
    job, out_dir = base.job_and_out(__doc__.splitlines()[0])
    options = parse_options(job.get("options", {}))
    result, audio_name = job.get("result"), job.get("audio_name")
    if not isinstance(result, dict) or not isinstance(result.get("segments"), list):
        raise SystemExit("job.result: expected a transcript object with a segments list")
    if not isinstance(audio_name, str) or not audio_name:
        raise SystemExit(f"job.audio_name: expected a file name, got {audio_name!r}")

    from mlx_whisper.writers import get_writer

    runs = [(out_dir, options)] if isinstance(options, dict) else [(out_dir / str(i), o) for i, o in enumerate(options)]
    for out, option_set in runs:
        out.mkdir(parents=True, exist_ok=True)
        for output_format in FORMATS:
            # A fresh copy per format: the writers must not see each other's changes.
            get_writer(output_format, str(out))(json.loads(json.dumps(result)), audio_name, **option_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
