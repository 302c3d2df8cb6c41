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

import functools
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.errors import ProfileError, table_row
from harness.paths import REPO_ROOT

# The records an implementation produces (harness/records.py; the oracles' generators make the same):
LLM = "llm"  # per decode step logits and tokens of a language model
SPEECH = "speech"  # a Whisper transcription: decode calls, their steps' logits, segments, words
VAD = "vad"  # speech probabilities per audio chunk, and the segments cut from them
RECORD_KINDS = (LLM, SPEECH, VAD)

# The kinds of run an implementation may serve (its capabilities; harness/capabilities.py says which
# a check needs on a scenario). A check needing a kind its implementation does not serve is refused
# when the profile loads (or at the plug-in's hello), never run into an ERROR.
RUN_KINDS = {
    "free": "runs a scenario greedily on its own tokens",
    "teacher_forced": "runs a scenario fed the golden's tokens (its own logits)",
    "stopped": "stops at EOS inside the step budget (a scenario's `stop:`)",
    "batched": "runs a scenario's `batch:` prompts together",
    "compiled": "has a second, compiled decode loop (decode 'compiled')",
    "streamed": "transcribes audio fed in chunks (the streaming transcriber)",
    "writers": "its own subtitle writers (txt, vtt, srt, tsv, json), run on its transcript",
    "vad": "a VAD's per-chunk probabilities and segments",
}
# A plug-in that declares nothing (docs/protocol.md): what every plug-in served before it could say;
# `compiled` besides where its hello's `decodes` names it.
UNDECLARED_SERVES = ("free", "teacher_forced")


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
    - `serves`: the run kinds it serves (RUN_KINDS): a check needing another is refused by the
      profile loader; a plug-in's come from its profile's `serves:` or its hello.
    - `fields`: the optional record arrays it writes (e.g. `mel`, `encoder`); None: not declared
      (every check reads what it finds).
    """

    name: str
    produces: str
    runner: str
    package: str
    compositions: tuple[str, ...] = ()
    localizes: bool = False
    plugin: Plugin | None = None  # run in its own process over docs/protocol.md (a profile's own)
    serves: tuple[str, ...] = UNDECLARED_SERVES
    fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        assert self.produces in RECORD_KINDS, self.produces
        assert set(self.serves) <= set(RUN_KINDS), self.serves

    def runner_class(self) -> Any:
        module, _, attribute = self.runner.partition(":")
        cls = getattr(importlib.import_module(module), attribute)
        return cls if self.plugin is None else functools.partial(cls, plugin=self.plugin)

    def sources(self) -> list[Path]:
        """Every Python file of its package, sorted (none for a plugin: it is not ours to hash)."""
        return sorted((REPO_ROOT / self.package).rglob("*.py")) if self.package else []


_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class Plugin:
    """An implementation the harness does not import, named by a profile (`implementation:` as a
    mapping): run in its own process, spoken to over docs/protocol.md.

    - `command`: any program speaking the protocol; `{python}` in it is the interpreter of the venv
      built from `requirements`, `{repo}` the repository.
    - `python`: `package.module:factory` of a Python implementation, served by
      plugins/host.py in the venv built from `requirements` (never the project's venv);
      `path` lists folders (relative to the repository) put on its sys.path.
    - `produces`: the records it makes (`llm` or `speech`).
    - `serves`, `fields`: its capabilities (ImplementationDescriptor), where the profile declares
      them: checked when the profile loads. Absent, its hello's `serves`/`fields` decide, and a
      hello that declares nothing serves UNDECLARED_SERVES (plus `compiled` where it decodes so).
    """

    command: list[str] | None = None
    python: str | None = None
    requirements: list[str] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    produces: Literal["llm", "speech"] = "llm"
    name: str = ""
    load_timeout_s: float = 600.0
    run_timeout_s: float = 600.0
    serves: list[str] | None = None
    fields: list[str] | None = None
    interpreter: str | None = None  # the Python its venv is made with: "3.12" or a path (None: the project's)
    # The mlx of its comparisons when its profile's oracle is a variant pinning another than the
    # project's (set by the profile loader, never by a profile: harness/oracle/pins.py comparison_mlx).
    _comparison_mlx: str | None = None
    # What its profile's checks need, (where, check, run kind or field) each, checked against its
    # hello's capabilities (set by the profile loader: harness/capabilities.py).
    _needs: tuple[tuple[str, str, str], ...] = ()

    def validate(self, where: str) -> None:
        if (self.command is None) == (self.python is None):
            raise ProfileError(f"{where}: expected exactly one of 'command' (a program) or 'python' (module:factory)")
        if self.command is not None and not self.command:
            raise ProfileError(f"{where}.command: expected a non-empty list of strings")
        if self.python is not None:
            if not _FACTORY.fullmatch(self.python):
                raise ProfileError(f"{where}.python: expected 'package.module:factory', got {self.python!r}")
            if not self.requirements:
                raise ProfileError(f"{where}.requirements: a python implementation runs in its own venv: pin it")
        uses_venv = self.python is not None or any("{python}" in c for c in self.command or ())
        if self.requirements and not uses_venv:
            raise ProfileError(f"{where}.requirements: given, but the command never runs '{{python}}' (the venv)")
        if uses_venv and not self.requirements:
            raise ProfileError(f"{where}.command: '{{python}}' needs 'requirements' (what its venv is built from)")
        # printed on the terminal and into reports: no escape sequence may ride in (hostile probe 2, L7)
        for key, text in [("name", self.name), *((f"command[{i}]", c) for i, c in enumerate(self.command or ()))]:
            if not text.isprintable():
                raise ProfileError(
                    f"{where}.{key}: expected printable text (no control characters such as ESC or a newline), "
                    f"got {text!r}"
                )
        if self.interpreter is not None and not (
            re.fullmatch(r"3\.\d+(\.\d+)?", str(self.interpreter)) or str(self.interpreter).startswith("/")
        ):
            raise ProfileError(
                f"{where}.interpreter: expected a Python version such as '3.12' or an absolute path, "
                f"got {self.interpreter!r}"
            )
        if self.interpreter is not None and not (
            self.python is not None or any("{python}" in c for c in self.command or ())
        ):
            raise ProfileError(f"{where}.interpreter: given, but no venv is made (neither 'python' nor '{{python}}')")
        if self.serves is not None and not set(self.serves) <= set(RUN_KINDS):
            unknown = sorted(set(self.serves) - set(RUN_KINDS))
            raise ProfileError(f"{where}.serves: unknown run kind(s) {unknown}; known: {list(RUN_KINDS)}")
        for key in ("load_timeout_s", "run_timeout_s"):
            if not getattr(self, key) > 0:
                raise ProfileError(f"{where}.{key}: expected a number of seconds > 0, got {getattr(self, key)!r}")

    @property
    def label(self) -> str:
        return self.name or self.python or " ".join(self.command or ())


def of_plugin(plugin: Plugin) -> ImplementationDescriptor:
    """The descriptor of a profile's plugin: records as it says, no compositions, no module taps."""
    return ImplementationDescriptor(
        plugin.label,
        produces=plugin.produces,
        runner="harness.runners.process:ProcessRunner",
        package="",
        plugin=plugin,
        serves=tuple(plugin.serves) if plugin.serves is not None else UNDECLARED_SERVES,
        fields=tuple(plugin.fields) if plugin.fields is not None else None,
    )


IMPLEMENTATIONS = {
    d.name: d
    for d in (
        ImplementationDescriptor(
            "universal-llama",
            produces=LLM,
            runner="harness.runners.llama:LlamaRunner",
            package="models/universal",
            localizes=True,
            serves=("free", "teacher_forced", "stopped", "batched", "compiled"),
        ),
        ImplementationDescriptor(
            "whisper",
            produces=SPEECH,
            runner="harness.runners.whisper:WhisperRunner",
            package="models/whisper",
            compositions=("whisper-fast",),
            serves=("free", "teacher_forced", "streamed", "writers"),
        ),
        ImplementationDescriptor(
            "silero-vad",
            produces=VAD,
            runner="harness.vad_session:VadRun",
            package="models/vad",
            serves=("vad",),
        ),
    )
}

# The implementations a parity profile (profiles/*.yaml) may name; VAD profiles are their own kind.
PROFILE_IMPLEMENTATIONS = tuple(name for name, d in IMPLEMENTATIONS.items() if d.produces in (LLM, SPEECH))
# Every composition some implementation runs itself (see ImplementationDescriptor.compositions).
INTREE_COMPOSITIONS = tuple(c for d in IMPLEMENTATIONS.values() for c in d.compositions)


def implementation(name: str | Plugin) -> ImplementationDescriptor:
    """An in-tree implementation by name, or the descriptor of a profile's plugin."""
    if isinstance(name, Plugin):
        return of_plugin(name)
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
