"""What users feed a Whisper model, as Hypothesis strategies: scenarios of a speech profile.

An example is a profile scenario (the mapping a profile's YAML holds), its `audio:` a WAV file
made from the fixtures (fixtures/audio) by drawn edits, so that a failing one, shrunk, is
written out as a scenario the profile can keep (its WAV beside it). What varies:

- the audio: one or two fixture clips end to end (speech, digital silence, noise), cut anywhere
  (to the sample), silence inserted anywhere, either a little or as much as brings the clip
  to within 0.3 s of the 30 s window boundary (either side: a second window of a few frames, or
  none), a gain from 0.1 to 4 (clipped at 16 bits, as a loud recording is);
- the decode options mlx_whisper.transcribe takes: greedy, the default fallback ladder, a
  drawn ladder or one sampling temperature (seeded, best_of candidates), the fallback
  thresholds (log-prob, compression ratio, no-speech; some unreachable, so that every
  temperature is tried), conditioning on the previous window, an initial prompt, timestamps
  off, word timestamps (with the hallucination-silence rule), clip ranges, a cap on the tokens
  per window, blank suppression, the first timestamp's limit, and language / task on a
  multilingual model;
- the streaming transcriber's chunk sizes (the `streamed_transcript` check), now and then.

Beam search is not drawn: mlx-whisper has none (the profile judges it against openai-whisper,
an oracle without a warm process here).

The edited WAV is written once per content: `<sha256 of its bytes>.wav`, with `<sha256>.json`
beside it saying how it was made, under `.cache/fuzz-audio/` of the repository (a profile's
audio lives in the repository: the loader refuses a path outside it).
"""

from __future__ import annotations

import hashlib
import io
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from harness.fileio import atomic_write_bytes
from harness.paths import FIXTURES_DIR, REPO_ROOT

RATE = 16000
WINDOW = 30 * RATE  # samples of one Whisper window
NEAR_WINDOW = RATE * 3 // 10  # "near the boundary": within 0.3 s of it
MAX_SAMPLES = 45 * RATE  # at most two windows
SOURCES = ("fox.wav", "weather.wav", "message.wav", "long.wav", "silence.wav", "noise.wav")
GAINS = (0.1, 0.25, 0.5, 2.0, 4.0)
PROMPTS = ("Voicemail transcript:", "The weather forecast.", "Umm, let me think like, hmm.", "Glossary: fox, dog.")
AUDIO_DIR = REPO_ROOT / ".cache" / "fuzz-audio"


def read_fixture(name: str) -> np.ndarray:
    """A fixture's 16-bit mono samples (every clip of fixtures/audio is 16 kHz mono PCM)."""
    with wave.open(str(FIXTURES_DIR / name), "rb") as f:
        if (f.getnchannels(), f.getsampwidth(), f.getframerate()) != (1, 2, RATE):
            raise ValueError(f"fixtures/audio/{name}: expected 16 kHz mono 16-bit PCM")
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")


_LENGTHS: dict[str, int] = {}


def fixture_samples(name: str) -> int:
    if name not in _LENGTHS:
        _LENGTHS[name] = len(read_fixture(name))
    return _LENGTHS[name]


def edited(recipe: dict[str, Any]) -> np.ndarray:
    """The samples a recipe describes: clips end to end, cut to [start, end), silence inserted,
    a gain (rounded half to even, clipped to 16 bits)."""
    samples = np.concatenate([read_fixture(name) for name in recipe["clips"]])
    if recipe.get("cut"):
        start, end = recipe["cut"]
        samples = samples[start:end]
    if recipe.get("silence"):
        at, length = recipe["silence"]
        samples = np.concatenate([samples[:at], np.zeros(length, dtype="<i2"), samples[at:]])
    if recipe.get("gain") is not None:
        scaled = np.rint(samples.astype(np.float64) * recipe["gain"])
        samples = np.clip(scaled, -32768, 32767).astype("<i2")
    return samples


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def write_audio(recipe: dict[str, Any], folder: Path = AUDIO_DIR) -> Path:
    """The recipe's WAV, named by the sha256 of its bytes (written once), and its recipe beside it."""
    data = wav_bytes(edited(recipe))
    path = folder / f"{hashlib.sha256(data).hexdigest()}.wav"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    recipe_path = path.with_suffix(".json")
    if not recipe_path.is_file():
        atomic_write_bytes(recipe_path, (json.dumps(recipe, sort_keys=True) + "\n").encode())
    return path


def recipe_of(audio: Path) -> dict[str, Any] | None:
    """How a drawn WAV was made (None for a file the fuzzer did not write)."""
    try:
        return json.loads(audio.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


@st.composite
def audio_recipes(draw: st.DrawFn) -> dict[str, Any]:
    """Fixture clips with edits (what `edited` makes of it), at most 45 s."""
    clips = draw(st.lists(st.sampled_from(SOURCES), min_size=1, max_size=2))
    total = sum(fixture_samples(c) for c in clips)
    recipe: dict[str, Any] = {"clips": clips}
    if draw(st.booleans()) or total > MAX_SAMPLES:
        start = draw(st.integers(0, total - 1))
        end = draw(st.integers(start + 1, min(total, start + MAX_SAMPLES)))
        recipe["cut"] = [start, end]
        total = end - start
    kind = draw(st.sampled_from(["none", "pause", "to-window"]))
    if kind != "none" and total < MAX_SAMPLES:
        at = draw(st.integers(0, total))
        if kind == "pause":
            length = draw(st.integers(1, 3 * RATE))
        else:  # the clip brought to within 0.3 s of the window boundary, where it is shorter
            length = max(1, WINDOW - total + draw(st.integers(-NEAR_WINDOW, NEAR_WINDOW)))
        recipe["silence"] = [at, min(length, MAX_SAMPLES - total)]
    if draw(st.booleans()):
        recipe["gain"] = draw(st.one_of(st.sampled_from(GAINS), st.integers(10, 400).map(lambda g: g / 100)))
    return recipe


def _temperature(draw: st.DrawFn, options: dict[str, Any]) -> None:
    kind = draw(st.sampled_from(["greedy", "default-ladder", "ladder", "sampled"]))
    if kind == "greedy":
        options["temperature"] = 0.0
    elif kind == "ladder":
        steps = draw(st.lists(st.sampled_from([0.2, 0.4, 0.6, 0.8, 1.0]), min_size=1, max_size=3, unique=True))
        options["temperature"] = [0.0, *sorted(steps)]
    elif kind == "sampled":
        options["temperature"] = draw(st.sampled_from([0.3, 0.7, 1.0]))
    if kind != "greedy" and draw(st.booleans()):
        options["best_of"] = draw(st.integers(1, 5))


def _maybe(draw: st.DrawFn, options: dict[str, Any], key: str, values: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        options[key] = draw(values)


@st.composite
def whisper_options(
    draw: st.DrawFn, multilingual: bool = False, max_steps: int = 64, seconds: float = 30.0, capped: bool = False
) -> dict[str, Any]:
    """A scenario's decode keys (`options`, a `seed` where it samples, now and then
    `stream_chunks`) for a clip of `seconds`; `capped`: always a cap on the tokens per window
    (seeded random weights never end a window: every one would run 224 steps)."""
    options: dict[str, Any] = {}
    _temperature(draw, options)
    _maybe(draw, options, "condition_on_previous_text", st.booleans())
    _maybe(draw, options, "initial_prompt", st.sampled_from(PROMPTS))
    _maybe(draw, options, "without_timestamps", st.booleans())
    if draw(st.booleans()):
        options["word_timestamps"] = True
        _maybe(draw, options, "hallucination_silence_threshold", st.sampled_from([0.5, 1.0, 2.0]))
    _maybe(draw, options, "no_speech_threshold", st.sampled_from([None, 0.1, 0.3, 0.6, 0.9]))
    _maybe(draw, options, "logprob_threshold", st.sampled_from([None, -2.0, -1.0, -0.5, 0.0]))
    _maybe(draw, options, "compression_ratio_threshold", st.sampled_from([None, 1.0, 1.5, 2.4]))
    if capped or draw(st.booleans()):
        options["sample_len"] = draw(st.integers(1, max_steps))
    _maybe(draw, options, "suppress_blank", st.booleans())
    _maybe(draw, options, "max_initial_timestamp", st.sampled_from([None, 0.0, 0.5, 3.0]))
    if draw(st.booleans()):
        start = draw(st.integers(0, int(seconds * 10)))
        end = draw(st.integers(start + 1, int(seconds * 10) + 10))
        options["clip_timestamps"] = f"{start / 10:g},{end / 10:g}"
    if multilingual:
        _maybe(draw, options, "language", st.sampled_from(["en", "de", "fr", "ja"]))
        _maybe(draw, options, "task", st.sampled_from(["transcribe", "translate"]))
    else:
        _maybe(draw, options, "language", st.just("en"))
    scenario: dict[str, Any] = {"options": options}
    if isinstance(options.get("temperature", 1.0), list) or options.get("temperature", 1.0) > 0:
        scenario["seed"] = draw(st.integers(0, 2**16))
    if draw(st.integers(0, 4)) == 4:  # the streaming transcriber: one more transcription per chunk size
        scenario["stream_chunks"] = [draw(st.sampled_from([0.5, 1.0, 7.0, 29.9, 30.0]))]
    return scenario


@st.composite
def whisper_scenarios(
    draw: st.DrawFn, multilingual: bool = False, max_steps: int = 64, capped: bool = False
) -> dict[str, Any]:
    """A transcription scenario of a speech profile (no `id`: the runner names it); its WAV is
    written (once per content) under AUDIO_DIR as it is drawn."""
    audio = write_audio(draw(audio_recipes()))
    seconds = (audio.stat().st_size - 44) / 2 / RATE  # the 44-byte header `wave` writes
    return {
        "audio": str(audio.relative_to(REPO_ROOT)),
        **draw(whisper_options(multilingual, max_steps, seconds, capped)),
    }


def keep_audio(scenario: dict[str, Any], out: Path) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A finding's scenario with its drawn WAV copied into `out` (the finding's folder), and the
    comment lines saying how the WAV was made and where it must be for the scenario to run.
    A scenario without a drawn WAV (a chat one) is returned as it is."""
    audio = scenario.get("audio")
    source = (REPO_ROOT / audio).resolve() if isinstance(audio, str) else None
    if source is None or not source.is_relative_to(AUDIO_DIR.resolve()):
        return scenario, ()
    copy = out / source.name
    atomic_write_bytes(copy, source.read_bytes())
    notes = [f"audio: {source.name}, beside this file, made from fixtures/audio by {json.dumps(recipe_of(source))}"]
    if copy.resolve().is_relative_to(REPO_ROOT.resolve()):
        return scenario | {"audio": str(copy.resolve().relative_to(REPO_ROOT.resolve()))}, tuple(notes)
    notes.append(
        f"(this folder is outside the repository: to keep the scenario, put {source.name} under fixtures/audio/ "
        "and point audio: at it; as written it names the fuzzer's copy in .cache/fuzz-audio/)"
    )
    return scenario, tuple(notes)
