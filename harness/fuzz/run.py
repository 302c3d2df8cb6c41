"""`python -m harness fuzz` (`make fuzz`): differential fuzzing of a language-model or Whisper
profile against its oracle (docs/fuzz.md).

Hypothesis draws scenarios (chat: harness/fuzz/strategies.py; speech: harness/fuzz/speech.py,
the edited WAV beside a written finding); each runs through the oracle's warm
process and the in-tree implementation and is judged by every check of the scenario, as the
gates judge (harness/fuzz/session.py). A failing example is shrunk by Hypothesis, one per first
failing check, and written out as a profile scenario (`found-*.yaml`) with the failures in its
comment; `fuzz.json` holds the figures (examples judged, rejected, examples per second).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness.checks import registry
from harness.errors import HarnessError, OracleError, ProfileError
from harness.fileio import atomic_write_bytes
from harness.fuzz import speech
from harness.fuzz.session import FuzzSession, WarmOracle
from harness.fuzz.strategies import chat_scenarios
from harness.implementations import LLM, SPEECH
from harness.oracle.descriptor import ORACLES, descriptor
from harness.profile.inputs import read_yaml
from harness.profile.load import load_profile, scenario_from_dict
from harness.runners import ModelHook

EXAMPLE_ID = "fuzz-example"


class FuzzFailure(AssertionError):
    """An example on which some check fails; one subclass per first failing check, so that
    Hypothesis shrinks each distinct failure on its own (it tells failures apart by type)."""


_FAILURES: dict[str, type[FuzzFailure]] = {}


def failure_type(origin: str) -> type[FuzzFailure]:
    if origin not in _FAILURES:
        _FAILURES[origin] = type(f"FuzzFailure[{origin}]", (FuzzFailure,), {})
    return _FAILURES[origin]


@dataclass
class Finding:
    origin: str  # the first failing check (of the scenario's order)
    scenario: dict[str, Any]
    summaries: dict[str, str]

    def scenario_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.scenario, sort_keys=True).encode()).hexdigest()[:8]
        return f"fuzz-{digest}"

    def as_yaml(self, model: str, scenario: dict[str, Any] | None = None, notes: tuple[str, ...] = ()) -> str:
        """The finding as a profile's scenario list; `scenario` in place of the drawn one (its
        audio moved beside the file), `notes` more comment lines."""
        lines = [f"# Found by `python -m harness fuzz --model {model}`, shrunk by Hypothesis. Failing:"]
        for check, summary in self.summaries.items():
            lines.append(f"#   {check}: {summary[:300]}")
        lines += [f"# {note}" for note in notes]
        body = yaml.safe_dump(
            [{"id": self.scenario_id(), **(scenario or self.scenario)}], sort_keys=False, allow_unicode=True
        )
        return "\n".join(lines) + "\n" + body


@dataclass
class FuzzStats:
    judged: int = 0
    passed: int = 0
    invalid: Counter[str] = field(default_factory=Counter)  # the profile refused the example: why
    oracle_refused: Counter[str] = field(default_factory=Counter)  # the oracle could not run it: why
    nothing_compared: Counter[str] = field(default_factory=Counter)  # per check: examples it could not judge
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "passed": self.passed,
            "invalid": dict(self.invalid),
            "oracle_refused": dict(self.oracle_refused),
            "nothing_compared": dict(self.nothing_compared),
            "seconds": round(self.seconds, 1),
            "examples_per_second": round(self.judged / self.seconds, 3) if self.seconds else None,
        }


@dataclass
class FuzzRun:
    model: str
    examples: int
    seed: int = 0
    shrink: bool = True
    database: Path | None = None
    max_steps: int = 12
    model_hook: ModelHook | None = None
    patch: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    # Examples judged after the first failure (the rest of the generation, then shrinking), at
    # most (None: Hypothesis's own limit, 5 minutes of shrinking); past it, a candidate passes
    # unjudged and the smallest failure so far is the finding.
    shrink_budget: int | None = None
    stats: FuzzStats = field(default_factory=FuzzStats)
    findings: dict[str, Finding] = field(default_factory=dict)
    _verdicts: dict[str, Finding | None] = field(default_factory=dict)  # per example judged: its finding or None
    _shrink_judged: int = 0
    _scenarios: list[Any] | None = None  # the profile file's own scenarios, as its YAML has them

    def run(self) -> None:
        session = FuzzSession(model_hook=self.model_hook)
        base = session.profile(self.model)
        kind = base.under_test.produces
        oracle = descriptor(base.oracle)
        if not oracle.has_script("fuzz.py") or kind not in (LLM, SPEECH) or kind not in oracle.serves:
            raise HarnessError(
                f"{self.model} is judged by {base.oracle}: the fuzzer draws chat or transcription scenarios and runs "
                "them on an oracle with a warm fuzz.py "
                f"({', '.join(n for n, d in ORACLES.items() if d.has_script('fuzz.py'))})"
            )
        artifact = session.artifact(base)
        model_dir = artifact.model_dir
        if kind == SPEECH:  # a twin's seeded random weights never end a window: its tokens capped
            scenarios = speech.whisper_scenarios(_multilingual(model_dir), self.max_steps, "twin" in artifact.identity)
        else:
            encode, eos_ids = _tokenizer(model_dir)
            scenarios = chat_scenarios(encode, eos_ids, self.max_steps)
        started = time.perf_counter()
        with (
            self.patch() if self.patch else contextlib.nullcontext(),
            _closing(WarmOracle(base.oracle, model_dir)) as oracle,
        ):

            def example(data: dict[str, Any]) -> None:
                self._example(session, base, oracle, data)

            test = given(scenarios)(example)
            phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if self.shrink else [])
            test = settings(
                max_examples=self.examples,
                deadline=None,
                database=DirectoryBasedExampleDatabase(self.database) if self.database else None,
                phases=phases,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=True,
                print_blob=False,
            )(test)
            try:
                seed(self.seed)(test)()
            except (FuzzFailure, ExceptionGroup):
                pass  # the findings hold each shrunk example
        self.stats.seconds = time.perf_counter() - started
        self.stats.nothing_compared = session.nothing_compared

    def _example(self, session: FuzzSession, base: Any, oracle: WarmOracle, data: dict[str, Any]) -> None:
        # Each distinct example is judged once: Hypothesis replays an example (the failure it
        # starts shrinking from, the shrunk one it reports last), and the replay must raise from
        # the same line with the same type or it takes the failure for a flaky one and stops.
        key = json.dumps(data, sort_keys=True)
        if key not in self._verdicts:
            if self.findings and self.shrink_budget is not None and self._shrink_judged >= self.shrink_budget:
                return  # the budget is spent: the candidate is not judged (Hypothesis takes it for a pass)
            self._shrink_judged += bool(self.findings)
            self._verdicts[key] = self._judge(session, base, oracle, data)
        finding = self._verdicts[key]
        if finding is not None:
            # The last failure of a kind is Hypothesis's smallest: its final replay of each.
            self.findings[finding.origin] = finding
            raise failure_type(finding.origin)(
                f"{finding.origin}: " + "; ".join(f"{c}: {s[:200]}" for c, s in finding.summaries.items())
            )

    def _judge(self, session: FuzzSession, base: Any, oracle: WarmOracle, data: dict[str, Any]) -> Finding | None:
        """The example judged: None when every check passes, else the finding."""
        scenario_dict: dict[str, Any] = {"id": EXAMPLE_ID, **data}
        try:
            asked = registry.asked_for(base, scenario_from_dict(scenario_dict, "fuzz example"))
            if asked:  # a key that asks for its check (response:) names it beside the defaults
                scenario_dict["checks"] = [*base.defaults.checks, *asked]
            # Beside the file's own scenarios, which what else the profile says (its certificate)
            # may name; the example alone is judged.
            profile = load_profile(Path(base.source_file), [*self._file_scenarios(base), scenario_dict])
        except ProfileError as e:
            self.stats.invalid[_reason(str(e))] += 1
            reject()
        scenario = next(s for s in profile.scenarios if s.id == EXAMPLE_ID)
        try:
            results = session.judge(profile, scenario, oracle)
        except OracleError as e:
            self.stats.oracle_refused[_reason(str(e))] += 1
            reject()
        self.stats.judged += 1
        failed = {r.check: r.summary for r in results if not r.passed}
        if not failed:
            self.stats.passed += 1
            return None
        # One fault fails several checks, in an order of its own per example: a finding is the
        # first failing check in the scenario's order (prompt before logits before tokens).
        return Finding(next(iter(failed)), data, failed)

    def _file_scenarios(self, base: Any) -> list[Any]:
        if self._scenarios is None:
            data = read_yaml(Path(base.source_file))
            self._scenarios = list(data.get("scenarios") or []) if isinstance(data, dict) else []
        return self._scenarios

    def write(self, out: Path) -> list[Path]:
        """fuzz.json and one found-*.yaml per finding, in a new folder `out`."""
        out.mkdir(parents=True, exist_ok=False)
        written = []
        for n, finding in enumerate(self.findings.values(), 1):
            path = out / f"found-{n}-{finding.scenario_id()}.yaml"
            scenario, notes = speech.keep_audio(finding.scenario, out)
            atomic_write_bytes(path, finding.as_yaml(self.model, scenario, notes).encode())
            written.append(path)
        summary = {
            "model": self.model,
            "seed": self.seed,
            "examples": self.examples,
            **self.stats.as_dict(),
            "findings": [
                {
                    "first_failing_check": f.origin,
                    "checks": sorted(f.summaries),
                    "scenario_id": f.scenario_id(),
                    "summaries": f.summaries,
                }
                for f in self.findings.values()
            ],
        }
        atomic_write_bytes(out / "fuzz.json", (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode())
        return written


def _reason(message: str) -> str:
    """A refusal's message without the example's own values, so that reasons are counted."""
    return message.replace(f"{EXAMPLE_ID}", "<example>").split("\n")[0][:200]


def _multilingual(model_dir: Path) -> bool:
    """A Whisper model with the multilingual vocabulary (51865 ids and more; English-only: 51864)."""
    try:
        return int(json.loads((model_dir / "config.json").read_text())["n_vocab"]) >= 51865
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HarnessError(f"{model_dir}/config.json: the fuzzer reads n_vocab: {e}") from None


def _tokenizer(model_dir: Path) -> tuple[Callable[[str], list[int]], list[int]]:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"{model_dir}: the fuzzer reads tokenizer.json and config.json: {e}") from None
    eos = config.get("eos_token_id")
    eos_ids = sorted(eos if isinstance(eos, list) else [eos]) if eos is not None else []
    if not eos_ids:
        raise HarnessError(f"{model_dir}/config.json: no eos_token_id to put into forced tokens")
    return (lambda text: tokenizer.encode(text, add_special_tokens=False).ids), eos_ids


@contextlib.contextmanager
def _closing(oracle: WarmOracle) -> Iterator[WarmOracle]:
    try:
        yield oracle
    finally:
        oracle.close()
