"""The implementations under test, in one table: what each produces, what runs it, where its
code is and what it offers beyond its records.

Everything else reads these descriptors: the profile validator (which checks, oracles and
compositions a profile may name), the session (which runner builds the records, whether a
failure can be localized), the quality runs (which sources their caches depend on). No other
module of the harness names an implementation (tests/test_layout.py). A new implementation
is its package and one row here.

What an implementation produces decides which checks and oracles apply to it: a check's
registry row and an oracle's descriptor name record kinds, not implementations, so a second
implementation producing LLM records is judged by every LLM check and oracle unchanged.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import table_row
from harness.paths import REPO_ROOT

# The records an implementation produces (harness/records.py; the oracles' generators make the same):
LLM = "llm"  # per decode step logits and tokens of a language model
SPEECH = "speech"  # a Whisper transcription: decode calls, their steps' logits, segments, words
VAD = "vad"  # speech probabilities per audio chunk, and the segments cut from them
RECORD_KINDS = (LLM, SPEECH, VAD)


@dataclass(frozen=True)
class ImplementationDescriptor:
    """One implementation under test.

    - `produces`: the records it makes (LLM, SPEECH, VAD): which checks and oracles apply.
    - `runner`: `module:Class` of what builds its records from a profile's scenarios (imported
      when first used): an `InTreeRunner(model_dir, model_hook, label=...)` for LLM and SPEECH
      records; a VAD profile's `VadRun`.
    - `package`: its code, relative to the repository: hashed into what depends on it (the
      quality caches' cross-checks).
    - `compositions`: composed paths it runs that no oracle composes (judged at L2 against the
      plain oracle's reference path, within a budget whose every difference is explained).
    - `localizes`: it has module taps, so a failing step is localized to the first diverging
      module (without them, the report says localization is unavailable).
    """

    name: str
    produces: str
    runner: str
    package: str
    compositions: tuple[str, ...] = ()
    localizes: bool = False

    def __post_init__(self) -> None:
        assert self.produces in RECORD_KINDS, self.produces

    def runner_class(self) -> Any:
        module, _, attribute = self.runner.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def sources(self) -> list[Path]:
        """Every Python file of its package, sorted."""
        return sorted((REPO_ROOT / self.package).rglob("*.py"))


IMPLEMENTATIONS = {
    d.name: d
    for d in (
        ImplementationDescriptor(
            "universal-llama",
            produces=LLM,
            runner="harness.runners.llama:LlamaRunner",
            package="models/universal",
            localizes=True,
        ),
        ImplementationDescriptor(
            "whisper",
            produces=SPEECH,
            runner="harness.runners.whisper:WhisperRunner",
            package="models/whisper",
            compositions=("whisper-fast",),
        ),
        ImplementationDescriptor(
            "silero-vad",
            produces=VAD,
            runner="harness.vad_session:VadRun",
            package="models/vad",
        ),
    )
}

# The implementations a parity profile (profiles/*.yaml) may name; VAD profiles are their own kind.
PROFILE_IMPLEMENTATIONS = tuple(name for name, d in IMPLEMENTATIONS.items() if d.produces in (LLM, SPEECH))
# Every composition some implementation runs itself (see ImplementationDescriptor.compositions).
INTREE_COMPOSITIONS = tuple(c for d in IMPLEMENTATIONS.values() for c in d.compositions)


def implementation(name: str) -> ImplementationDescriptor:
    return table_row(
        IMPLEMENTATIONS,
        name,
        "implementation",
        "a new implementation is its package and a row in harness/implementations.py",
    )


def producing(kind: str) -> tuple[str, ...]:
    """The implementations whose records are of `kind`."""
    return tuple(name for name, d in IMPLEMENTATIONS.items() if d.produces == kind)


def sources_of(kind: str) -> list[Path]:
    """The Python files of every implementation producing records of `kind`, sorted by
    implementation then path: what a measurement of those records' quality depends on."""
    return [path for name in producing(kind) for path in IMPLEMENTATIONS[name].sources()]
