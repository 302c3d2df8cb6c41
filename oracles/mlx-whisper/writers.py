"""mlx-whisper writers oracle: runs inside the oracle's own venv, never imports the harness.

Reads a transcript (the JSON of `mlx_whisper.transcribe`'s result, or a golden's
`transcript`) and writes it in every format with `mlx_whisper.writers.get_writer`, the word
options passed as the mlx_whisper CLI passes them (keyword arguments of the writer call).

Usage: python -I writers.py --result result.json --out DIR --audio-name NAME --options JSON
  writes DIR/<NAME, suffix replaced>.{txt,vtt,srt,tsv,json}
`--options` holds any of max_line_width, max_line_count, highlight_words, max_words_per_line;
a list of such objects writes option set i into DIR/i/ (one interpreter start for them all:
importing mlx_whisper costs seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FORMATS = ("txt", "vtt", "srt", "tsv", "json")
WORD_OPTIONS = frozenset({"max_line_width", "max_line_count", "highlight_words", "max_words_per_line"})


def _check_option_set(where: str, options) -> dict:
    if not isinstance(options, dict):
        raise SystemExit(f"{where}: expected a JSON object, got {type(options).__name__}")
    unknown = sorted(set(options) - WORD_OPTIONS)
    if unknown:
        raise SystemExit(f"{where}: unknown keys {unknown} (known: {', '.join(sorted(WORD_OPTIONS))})")
    return options


def parse_options(text: str) -> dict | list[dict]:
    """The writer keyword arguments (one object, or a list of them); anything but the four
    word options is an error."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--options: not JSON ({e})") from None
    if isinstance(options, list):
        return [_check_option_set(f"--options[{i}]", o) for i, o in enumerate(options)]
    return _check_option_set("--options", options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", required=True, help="transcript JSON: text, segments[, language]")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--audio-name", required=True, help="output file name; its suffix is replaced")
    parser.add_argument("--options", default="{}", help="writer word options, a JSON object")
    args = parser.parse_args(argv)
    options = parse_options(args.options)
    result = json.loads(Path(args.result).read_text(encoding="utf-8"))
    if not isinstance(result, dict) or not isinstance(result.get("segments"), list):
        raise SystemExit(f"--result {args.result}: expected a transcript object with a segments list")

    from mlx_whisper.writers import get_writer

    runs = (
        [(Path(args.out), options)]
        if isinstance(options, dict)
        else [(Path(args.out) / str(i), o) for i, o in enumerate(options)]
    )
    for out, option_set in runs:
        out.mkdir(parents=True, exist_ok=True)
        for output_format in FORMATS:
            # A fresh copy per format: the writers must not see each other's changes.
            get_writer(output_format, str(out))(json.loads(json.dumps(result)), args.audio_name, **option_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
