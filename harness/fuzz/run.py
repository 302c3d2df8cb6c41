"""`python -m harness fuzz` (`make fuzz`): differential fuzzing of a language-model profile
against its oracle (docs/fuzz.md).

Hypothesis draws scenarios (harness/fuzz/strategies.py); each runs through the oracle's warm
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
from harness.fuzz.session import FuzzSession, WarmOracle
from harness.fuzz.strategies import chat_scenarios
from harness.implementations import LLM
from harness.oracle.descriptor import ORACLES, descriptor
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

    def as_yaml(self, model: str) -> str:
        lines = [f"# Found by `python -m harness fuzz --model {model}`, shrunk by Hypothesis. Failing:"]
        for check, summary in self.summaries.items():
            lines.append(f"#   {check}: {summary[:300]}")
        body = yaml.safe_dump([{"id": self.scenario_id(), **self.scenario}], sort_keys=False, allow_unicode=True)
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
    stats: FuzzStats = field(default_factory=FuzzStats)
    findings: dict[str, Finding] = field(default_factory=dict)

    def run(self) -> None:
        session = FuzzSession(model_hook=self.model_hook)
        base = session.profile(self.model)
        if not descriptor(base.oracle).has_script("fuzz.py") or LLM not in descriptor(base.oracle).serves:
            raise HarnessError(
                f"{self.model} is judged by {base.oracle}: the fuzzer draws chat scenarios and runs them on an oracle "
                f"with a warm fuzz.py ({', '.join(n for n, d in ORACLES.items() if d.has_script('fuzz.py'))})"
            )
        model_dir = session.artifact(base).model_dir
        encode, eos_ids = _tokenizer(model_dir)
        started = time.perf_counter()
        with (
            self.patch() if self.patch else contextlib.nullcontext(),
            _closing(WarmOracle(base.oracle, model_dir)) as oracle,
        ):

            def example(data: dict[str, Any]) -> None:
                self._example(session, base, oracle, data)

            test = given(chat_scenarios(encode, eos_ids, self.max_steps))(example)
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
        scenario_dict: dict[str, Any] = {"id": EXAMPLE_ID, **data}
        try:
            asked = registry.asked_for(base, scenario_from_dict(scenario_dict, "fuzz example"))
            if asked:  # a key that asks for its check (response:) names it beside the defaults
                scenario_dict["checks"] = [*base.defaults.checks, *asked]
            profile = load_profile(Path(base.source_file), [scenario_dict])
        except ProfileError as e:
            self.stats.invalid[_reason(str(e))] += 1
            reject()
        scenario = profile.scenarios[0]
        try:
            results = session.judge(profile, scenario, oracle)
        except OracleError as e:
            self.stats.oracle_refused[_reason(str(e))] += 1
            reject()
        self.stats.judged += 1
        failed = {r.check: r.summary for r in results if not r.passed}
        if not failed:
            self.stats.passed += 1
            return
        # One fault fails several checks, in an order of its own per example: a finding is the
        # first failing check in the scenario's order (prompt before logits before tokens).
        origin = next(iter(failed))
        self.findings[origin] = Finding(origin, data, failed)
        raise failure_type(origin)(f"{origin}: " + "; ".join(f"{c}: {s[:200]}" for c, s in failed.items()))

    def write(self, out: Path) -> list[Path]:
        """fuzz.json and one found-*.yaml per finding, in a new folder `out`."""
        out.mkdir(parents=True, exist_ok=False)
        written = []
        for n, finding in enumerate(self.findings.values(), 1):
            path = out / f"found-{n}-{finding.scenario_id()}.yaml"
            atomic_write_bytes(path, finding.as_yaml(self.model).encode())
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
