"""The scenario spec check of the whisper oracles (mlx-whisper and openai-whisper generators).

Standard library only, so a generator loads it (by file path) and checks a spec before it
imports its library; the tests load it in the project venv. Each generator passes what its
library accepts: the transcribe options, the reserved ones, the weight files, any extra check.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import wave
from pathlib import Path

KINDS = ("transcribe",)

# Keyword arguments of transcribe that mlx_whisper (0.4.3) and openai-whisper (20250625) both take ...
TRANSCRIBE_OPTIONS = frozenset(
    {
        "temperature",
        "compression_ratio_threshold",
        "logprob_threshold",
        "no_speech_threshold",
        "condition_on_previous_text",
        "initial_prompt",
        "word_timestamps",
        "prepend_punctuations",
        "append_punctuations",
        "clip_timestamps",
        "hallucination_silence_threshold",
    }
)
# ... and the DecodingOptions fields it passes on (prompt and temperature are set by transcribe).
DECODING_OPTIONS = frozenset(
    {
        "task",
        "language",
        "sample_len",
        "best_of",
        "beam_size",
        "patience",
        "length_penalty",
        "prefix",
        "suppress_tokens",
        "suppress_blank",
        "without_timestamps",
        "max_initial_timestamp",
        "fp16",
    }
)
BOOL_OPTIONS = frozenset(
    {"condition_on_previous_text", "word_timestamps", "suppress_blank", "without_timestamps", "fp16"}
)
SAMPLE_RATE = 16000
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SCENARIO_KEYS = frozenset({"id", "kind", "audio", "audio_sha256", "options", "seed"})


class SpecError(ValueError):
    """The spec cannot be run; the message lists every problem found."""


def wav_problem(path: Path) -> str | None:
    """None if `path` is a 16 kHz mono 16-bit PCM WAV, else what is wrong with it."""
    try:
        with wave.open(str(path), "rb") as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
    except (wave.Error, EOFError, OSError) as e:
        return f"not a readable PCM WAV file ({type(e).__name__}: {e})"
    if (rate, channels, width) != (SAMPLE_RATE, 1, 2):
        return f"expected 16 kHz mono 16-bit PCM, got {rate} Hz, {channels} channel(s), {8 * width}-bit"
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Rules:
    """What one whisper oracle accepts.

    transcribe: the function's name in messages ("mlx_whisper.transcribe"); transcribe_options,
    reserved_options, bool_options: option names; weight_files: the accepted weight file names,
    the first one named in the message when none is there; option_problems(where, options): a
    list of further problems with a scenario's options (or None).
    """

    def __init__(
        self, transcribe, transcribe_options, reserved_options, bool_options, weight_files, option_problems=None
    ):
        self.transcribe = transcribe
        self.known_options = transcribe_options | DECODING_OPTIONS
        self.reserved_options = reserved_options
        self.bool_options = bool_options
        self.weight_files = weight_files
        self.more_option_problems = option_problems

    def option_problems(self, where: str, options) -> list[str]:
        if not isinstance(options, dict):
            return [f"{where}: options: expected an object of {self.transcribe} keyword arguments"]
        problems = []
        for key, value in options.items():
            if key in self.reserved_options:
                problems.append(f"{where}: options.{key}: set by the generator, not by a scenario")
            elif key not in self.known_options:
                problems.append(
                    f"{where}: options.{key}: unknown option (known: {', '.join(sorted(self.known_options))})"
                )
            elif key in self.bool_options and not isinstance(value, bool):
                problems.append(f"{where}: options.{key}: expected true or false, got {value!r}")
        temperature = options.get("temperature", 0.0)
        ladder = temperature if isinstance(temperature, list) else [temperature]
        if not ladder or not all(is_number(t) and t >= 0 for t in ladder):
            problems.append(
                f"{where}: options.temperature: expected a number >= 0 or a non-empty list of them, got {temperature!r}"
            )
        if self.more_option_problems is not None:
            problems += self.more_option_problems(where, options)
        return problems

    def model_dir_problems(self, model_dir) -> list[str]:
        if not isinstance(model_dir, str) or not model_dir:
            return ["model_dir: expected the path of an mlx-whisper model directory"]
        path = Path(model_dir)
        if not path.is_dir():
            # mlx_whisper would take a missing path for a hub repo name and try to download it.
            return [f"model_dir: {model_dir}: no such directory"]
        problems = []
        if not (path / "config.json").is_file():
            problems.append(f"model_dir: {model_dir}: no config.json")
        if not any((path / name).is_file() for name in self.weight_files):
            first, *others = self.weight_files
            alternatives = f" (or {', '.join(others)})" if others else ""
            problems.append(f"model_dir: {model_dir}: no {first}{alternatives}")
        return problems

    def scenario_problems(self, where: str, scenario: dict) -> list[str]:
        problems = []
        kind = scenario.get("kind")
        if kind not in KINDS:
            problems.append(f"{where}: kind: unknown kind {kind!r} (this oracle runs: {', '.join(KINDS)})")
        audio = scenario.get("audio")
        if not isinstance(audio, str) or not Path(audio).is_absolute():
            problems.append(f"{where}: audio: expected the absolute path of a 16 kHz WAV file, got {audio!r}")
        elif not Path(audio).is_file():
            problems.append(f"{where}: audio: {audio}: no such file")
        elif (why := wav_problem(Path(audio))) is not None:
            problems.append(f"{where}: audio: {audio}: {why}")
        seed = scenario.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            problems.append(f"{where}: seed: expected an integer, got {seed!r}")
        problems += self.option_problems(where, scenario.get("options", {}))
        want = scenario.get("audio_sha256")
        if want is not None and isinstance(audio, str) and Path(audio).is_file():
            got = hashlib.sha256(Path(audio).read_bytes()).hexdigest()
            if got != want:
                problems.append(f"{where}: audio: {audio} has sha256 {got}, the spec expects {want}")
        unknown = set(scenario) - SCENARIO_KEYS
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)}")
        return problems

    def validate(self, spec) -> None:
        """Raise SpecError naming every problem of the spec, before anything is loaded or run."""
        if not isinstance(spec, dict):
            raise SpecError('spec: expected an object {"model_dir": ..., "scenarios": [...]}')
        problems = self.model_dir_problems(spec.get("model_dir"))
        scenarios = spec.get("scenarios")
        if not isinstance(scenarios, list) or not scenarios:
            problems.append("scenarios: expected a non-empty list")
            scenarios = []
        seen = set()
        for n, scenario in enumerate(scenarios):
            where = f"scenarios[{n}]"
            if not isinstance(scenario, dict):
                problems.append(f"{where}: expected an object")
                continue
            sid = scenario.get("id")
            if not isinstance(sid, str) or not _ID.match(sid):
                problems.append(f"{where}: id: expected a file-name-safe string ([A-Za-z0-9._-]), got {sid!r}")
            else:
                where = f"scenario {sid}"
                if sid in seen:
                    problems.append(f"{where}: duplicate id")
                seen.add(sid)
            problems += self.scenario_problems(where, scenario)
        if problems:
            raise SpecError("invalid spec:\n  " + "\n  ".join(problems))


def checked_spec(path: Path, validate):
    """The spec at `path`, checked by `validate`; on a SpecError: the reason on stderr, exit 2."""
    spec = json.loads(path.read_text())
    try:
        validate(spec)
    except SpecError as e:
        print(f"oracle: {e}", file=sys.stderr)
        sys.exit(2)
    return spec
