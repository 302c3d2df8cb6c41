"""A parity session: wires profile -> artifact -> goldens / in-tree records -> checks.

One session object serves the pytest plugin and the CLI alike. It memoizes what is
expensive (artifact resolution, golden loading, in-tree runs) so that the checks of one
scenario share one oracle run and one in-tree run per mode.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness import HARNESS_VERSION
from harness.artifacts.files import sha256_file
from harness.artifacts.resolve import ResolvedArtifact, resolve_artifact
from harness.checks.compare import (
    ULP_BUCKETS,
    CheckResult,
    compare_array,
    compare_eos,
    compare_json,
    compare_prompt,
    compare_steps,
    compare_tokens,
    diff_vectors,
)
from harness.checks.localize import (
    Localization,
    can_localize,
    first_divergence,
    intree_module_outputs,
    oracle_module_outputs,
)
from harness.errors import GoldenError, HarnessError, NonDeterministicError, OracleError, OracleVersionError
from harness.goldens.calibration import CalibrationRecord, golden_identity, read_record
from harness.goldens.store import Golden, GoldenStatus, GoldenStore
from harness.paths import REPO_ROOT, cache_root, goldens_dir, oracles_dir
from harness.profile import FOREIGN_ORACLES, Profile, Scenario, find_profile
from harness.progress import progress
from harness.provenance import device_facts, golden_key
from harness.records import ScenarioRecord, array_sha256
from harness.runners import ModelHook
from harness.runners.llama import LlamaRunner
from harness.runners.oracle import OracleRunner
from harness.runners.venvs import ensure_oracle_env, pins_hash, read_pins
from harness.runners.whisper import WhisperRunner

# Which in-tree run each check judges: the free-running one or the teacher-forced one.
CheckFn = Callable[[ScenarioRecord, ScenarioRecord], CheckResult]


def _decisions(record: ScenarioRecord) -> list[dict[str, Any]]:
    """Every decode call in full: window (seek, frames), attempt, temperature, batch, initial
    tokens, steps, tokens, text, avg log-prob, compression ratio, no-speech probability, and the
    fallback decision with its reasons: the whole temperature ladder, decision by decision."""
    return list(record.extra.get("decode_calls", []))


# Transcript fields computed from log-probabilities: an oracle in another framework (PyTorch)
# computes them with other bits, so a token-level comparison leaves them out.
LOGPROB_FIELDS = ("avg_logprob", "no_speech_prob", "probability")


def _without_logprob_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_logprob_fields(v) for k, v in value.items() if k not in LOGPROB_FIELDS}
    if isinstance(value, list):
        return [_without_logprob_fields(v) for v in value]
    return value


def _sorted_keys(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _decode_call_tokens(record: ScenarioRecord) -> list[dict[str, Any]]:
    """Each decode call's window, temperature, prompt and chosen tokens (no log-prob floats)."""
    keep = ("seek", "segment_frames", "attempt", "temperature", "initial_tokens", "n_steps", "batch")
    keep += ("member_tokens", "tokens", "text")
    return [{k: call[k] for k in keep if k in call} for call in record.extra.get("decode_calls", [])]


CHECKS: dict[str, tuple[str, CheckFn]] = {
    "prompt_identity": ("free", lambda g, a: compare_prompt("prompt_identity", g, a)),
    "prefill_logits": ("free", lambda g, a: compare_steps("prefill_logits", g, a, g.prefill_rows())),
    "decode_logits": ("free", lambda g, a: compare_steps("decode_logits", g, a, g.decode_rows())),
    "teacher_forced_logits": (
        "teacher_forced",
        lambda g, a: compare_steps("teacher_forced_logits", g, a, range(0, len(g.tokens))),
    ),
    "greedy_tokens": ("free", lambda g, a: compare_tokens("greedy_tokens", g, a)),
    "eos_stop": ("free", lambda g, a: compare_eos("eos_stop", g, a)),
    "mel": ("free", lambda g, a: compare_array("mel", g, a, "mel")),
    "encoder_output": ("free", lambda g, a: compare_array("encoder_output", g, a, "encoder")),
    "transcript": (
        "free",
        lambda g, a: compare_json("transcript", "transcript", g.extra.get("transcript"), a.extra.get("transcript")),
    ),
    "fallback_decisions": (
        "free",
        lambda g, a: compare_json(
            "fallback_decisions", "decode calls and fallback decisions", _decisions(g), _decisions(a)
        ),
    ),
    "decode_tokens": ("free", lambda g, a: _decode_tokens(g, a)),
    "compiled_decode": ("compiled", lambda g, a: _compiled_decode(g, a)),
    "transcript_text": (
        "free",
        lambda g, a: compare_json(
            "transcript_text",
            "transcript (text, tokens, timestamps; log-prob floats left out)",
            _without_logprob_fields(g.extra.get("transcript")),
            _without_logprob_fields(a.extra.get("transcript")),
        ),
    ),
    "draft_stats": (
        "free",
        lambda g, a: compare_json(
            "draft_stats", "drafted/accepted counts", g.extra.get("step_info"), a.extra.get("step_info")
        ),
    ),
}

# Checks that need more than one record pair; run by ParitySession itself.
SESSION_CHECKS = ("writers", "token_budget")


def _compiled_decode(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """The compiled decode loop, free-running: every row bit for bit, then the tokens."""
    result = compare_steps("compiled_decode", golden, actual, range(len(golden.tokens)))
    if not result.passed:
        return result
    tokens = compare_tokens("compiled_decode", golden, actual)
    if not tokens.passed:
        return tokens
    result.summary += " (compiled single-token decode step)"
    return result


def _decode_tokens(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """Every row's token (each beam row, each step) and each decode call's chosen tokens."""
    result = compare_tokens("decode_tokens", golden, actual)
    if not result.passed:
        return result
    calls = compare_json(
        "decode_tokens", "decode calls' chosen tokens", _decode_call_tokens(golden), _decode_call_tokens(actual)
    )
    if not calls.passed:
        return calls
    result.summary += f"; {len(_decode_call_tokens(golden))} decode calls chose identical tokens"
    return result


# Logits gates whose failures are localized to a module.
LOGITS_CHECKS = ("prefill_logits", "decode_logits", "teacher_forced_logits")


def localize_enabled() -> bool:
    """`MLX_PARITY_LOCALIZE=0` skips localization (it costs one more run of each side)."""
    return os.environ.get("MLX_PARITY_LOCALIZE", "1") != "0"


# Oracles whose generator imports another oracle's generator: both files are its code.
SHARED_GENERATORS = {"mlx-optiq": ("mlx-lm",)}


def harness_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    commit = out.stdout.strip() or "unknown"
    return commit + ("+dirty" if dirty.stdout.strip() else "")


def oracle_pins_hash(oracle: str) -> str:
    """The pins hash of the oracle's venv, or of the external interpreter's installed versions."""
    if os.environ.get("MLX_PARITY_ORACLE_PYTHON"):
        return ensure_oracle_env(oracle).pins_hash
    return pins_hash(read_pins(oracle))


def portable_environment(environment: dict[str, Any]) -> dict[str, Any]:
    """The oracle's facts as a tracked manifest keeps them: library paths (this machine's venv
    folders) reduced to their file names, which still name the BLAS."""
    out = dict(environment)
    if isinstance(out.get("blas_libraries"), list):
        out["blas_libraries"] = [Path(p).name for p in out["blas_libraries"]]
    return out


def check_deterministic(label: str, first: ScenarioRecord, second: ScenarioRecord) -> None:
    """Two runs fed the same tokens must agree bit for bit, or no comparison means anything."""
    for step in range(min(len(first.tokens), len(second.tokens))):
        diff = diff_vectors(first.logits[step], second.logits[step])
        if not diff.equal:
            raise NonDeterministicError(
                f"in-tree implementation is not deterministic on {label}: two runs fed the same tokens "
                f"differ at step {step} ({diff.explain()}); no oracle comparison was made"
            )
    if len(first.tokens) != len(second.tokens):
        raise NonDeterministicError(f"in-tree implementation is not deterministic on {label}: run lengths differ")


@dataclass
class ParitySession:
    model_hook: ModelHook | None = None
    oracle_runner: Callable[[str], OracleRunner] = OracleRunner  # tests inject a fake oracle
    _profiles: dict[str, Profile] = field(default_factory=dict)
    _artifacts: dict[str, ResolvedArtifact] = field(default_factory=dict)
    _goldens: dict[str, dict[str, Golden]] = field(default_factory=dict)
    _runners: dict[str, LlamaRunner] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], ScenarioRecord] = field(default_factory=dict)
    # A profile whose goldens could not be had fails every later check with the same error,
    # rather than running the oracle again for each one.
    _golden_errors: dict[str, HarnessError] = field(default_factory=dict)
    _scenario_errors: dict[tuple[str, str], HarnessError] = field(default_factory=dict)
    _localizations: dict[tuple[str, str, int], Localization | None] = field(default_factory=dict)
    _full_goldens: dict[tuple[str, str], ScenarioRecord] = field(default_factory=dict)
    # Per profile, the scenarios a pytest run selected (absent: all): only their goldens are made.
    selected_scenarios: dict[str, set[str]] = field(default_factory=dict)
    # Faults for `make mutants`: per (profile, scenario), spec keys the in-tree run is given in
    # place of the profile's (the golden stays the profile's: a mutant is judged against it).
    intree_spec_edits: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def store(self, oracle: str) -> GoldenStore:
        """Where `oracle`'s goldens for this machine live: its family's golden key names the folder."""
        return GoldenStore(goldens_dir(), cache_root() / "blobs", golden_key(oracle).name)

    def release(self, name: str) -> None:
        """Drop a profile's in-tree model and records once its last check has run, so a run
        over many profiles holds one profile's model at a time (a 7 GB runner, issue 14)."""
        self._runners.pop(name, None)
        for cache in (self._records, self._full_goldens, self._localizations):
            for key in [k for k in cache if k[0] == name]:
                del cache[key]
        import gc

        import mlx.core as mx

        gc.collect()
        mx.clear_cache()

    def profile(self, name: str) -> Profile:
        if name not in self._profiles:
            self._profiles[name] = find_profile(name)
        return self._profiles[name]

    def artifact(self, profile: Profile) -> ResolvedArtifact:
        if profile.name not in self._artifacts:
            self._artifacts[profile.name] = resolve_artifact(profile)
        return self._artifacts[profile.name]

    def provenance(self, profile: Profile, scenario: Scenario) -> dict[str, Any]:
        """Everything a golden's bits depend on; any change makes the golden stale.

        Tier and oracle are the scenario's: an L1 golden can never be read as an L2 one.
        """
        oracle = profile.oracle_of(scenario)
        oracle_facts = {
            "name": oracle,
            "pins_hash": oracle_pins_hash(oracle),
            "generator_sha256": sha256_file(oracles_dir() / oracle / "generate.py"),
        }
        for shared in SHARED_GENERATORS.get(oracle, ()):
            oracle_facts[f"{shared}_generator_sha256"] = sha256_file(oracles_dir() / shared / "generate.py")
        return {
            "harness_version": HARNESS_VERSION,
            "tier": profile.tier_of(scenario),
            "oracle": oracle_facts,
            "device": golden_key(oracle).as_dict(),
            "artifact": self.artifact(profile).provenance(),
            "scenario_hash": profile.scenario_hash(scenario),
        }

    # -- goldens ---------------------------------------------------------------------------

    def goldens(self, profile: Profile, regenerate: bool = False) -> dict[str, Golden]:
        """Load the profile's goldens, generating absent ones; stale ones only when asked."""
        if profile.name in self._goldens and not regenerate:
            return self._goldens[profile.name]
        if profile.name in self._golden_errors and not regenerate:
            raise self._golden_errors[profile.name]
        try:
            return self._load_goldens(profile, regenerate)
        except HarnessError as e:
            self._golden_errors[profile.name] = e
            raise
        except Exception as e:  # ENOSPC, a vanished interpreter: reported once, the oracle not re-run per check
            error = GoldenError(
                f"the goldens of {profile.name} could not be made or read: {type(e).__name__}: {e}; nothing compared"
            )
            self._golden_errors[profile.name] = error
            raise error from e

    def _load_goldens(self, profile: Profile, regenerate: bool) -> dict[str, Golden]:
        lock = cache_root() / "locks" / f"goldens-{profile.name}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock)):  # xdist workers: one generates, the others wait and read
            todo: list[Scenario] = []
            expected_blobs: dict[str, dict[str, Any]] = {}
            for scenario in self._scenarios_in_scope(profile):
                try:  # a torch oracle's key needs its venv: if that cannot be built, only its scenarios fail
                    store = self.store(profile.oracle_of(scenario))
                except HarnessError as e:
                    self._scenario_errors[(profile.name, scenario.id)] = e
                    continue
                if regenerate:  # an unreadable manifest is about to be rewritten: it is not read
                    todo.append(scenario)
                    continue
                status = store.status(profile.name, scenario.id, self.provenance(profile, scenario))
                if status is GoldenStatus.ABSENT:
                    todo.append(scenario)
                elif status is GoldenStatus.STALE:
                    raise store.stale_error(profile.name, scenario.id, self.provenance(profile, scenario))
                elif status is GoldenStatus.BLOBS_MISSING:
                    manifest = store.read_manifest(profile.name, scenario.id) or {}
                    expected_blobs[scenario.id] = manifest.get("blobs", {})
                    todo.append(scenario)
            for oracle in sorted({profile.oracle_of(s) for s in todo}):  # one generator run per oracle
                self._generate(profile, [s for s in todo if profile.oracle_of(s) == oracle], expected_blobs)
            goldens = {
                s.id: self.store(profile.oracle_of(s)).load(profile.name, s.id)
                for s in self._scenarios_in_scope(profile)
                if (profile.name, s.id) not in self._scenario_errors
            }
        for golden in goldens.values():
            oracle_mlx = golden.manifest.get("oracle_environment", {}).get("mlx")
            if golden.manifest.get("oracle") in FOREIGN_ORACLES:
                continue  # no mlx in it: judged on tokens only (profile validation sees to that)
            if oracle_mlx != device_facts().mlx:
                raise OracleVersionError(
                    f"golden {golden.manifest_path} was made by an oracle running mlx {oracle_mlx}, the "
                    f"project runs mlx {device_facts().mlx}: refusing to compare"
                )
        self._goldens[profile.name] = goldens
        return goldens

    def _scenarios_in_scope(self, profile: Profile) -> list[Scenario]:
        """This backend's scenarios, narrowed to what the pytest run selected. Without a
        selection (a session used directly: tests, mutants, bench), nightly-tagged scenarios
        are left out; `make goldens` selects every scenario."""
        active = profile.active_scenarios(device_facts().backend)
        if profile.name not in self.selected_scenarios:
            return [s for s in active if "nightly" not in s.tags]
        return [s for s in active if s.id in self.selected_scenarios[profile.name]]

    def _generate(self, profile: Profile, scenarios: list[Scenario], expected_blobs: dict[str, Any]) -> None:
        artifact = self.artifact(profile)
        oracle = profile.oracle_of(scenarios[0])
        specs = [oracle_spec(profile, s) for s in scenarios]
        environment, records, errors = self.oracle_runner(oracle).run(artifact.model_dir, specs)
        for scenario in scenarios:
            if scenario.id in errors:
                self._scenario_errors[(profile.name, scenario.id)] = OracleError(
                    f"oracle {oracle} cannot run {profile.name}/{scenario.id} on this machine "
                    f"({golden_key(oracle).name}): {errors[scenario.id]}; no golden, nothing compared"
                )
                continue
            record = records[scenario.id]
            record.validate(f"oracle record {profile.name}/{scenario.id}", profile.expected_rows(scenario))
            extra = {
                "tier": profile.tier_of(scenario),
                "oracle": oracle,
                "oracle_environment": portable_environment(environment),
                "harness_commit": harness_commit(),
                "scenario_spec": profile.scenario_spec(scenario),
                "recorded_on": device_facts().recorded_on(),
            }
            self.store(oracle).write(
                profile.name,
                scenario.id,
                record,
                self.provenance(profile, scenario),
                extra,
                expect_blobs=expected_blobs.get(scenario.id),
                compact=profile.golden.compact if scenario.id not in expected_blobs else None,
            )

    def scenario_errors(self, profile_name: str) -> dict[tuple[str, str], HarnessError]:
        """The scenarios of a profile whose golden could not be had (their oracle failed them)."""
        return {k: e for k, e in self._scenario_errors.items() if k[0] == profile_name}

    def golden(self, profile: Profile, scenario: Scenario) -> Golden:
        goldens = self.goldens(profile)
        if (profile.name, scenario.id) in self._scenario_errors:
            raise self._scenario_errors[(profile.name, scenario.id)]
        return goldens[scenario.id]

    # -- in-tree -----------------------------------------------------------------------------

    def runner(self, profile: Profile) -> LlamaRunner:
        if profile.name not in self._runners:
            runners = {"universal-llama": LlamaRunner, "whisper": WhisperRunner}
            if profile.implementation not in runners:
                raise HarnessError(f"{profile.name}: no in-tree runner for implementation {profile.implementation!r}")
            self._runners[profile.name] = runners[profile.implementation](
                self.artifact(profile).model_dir, self.model_hook, label=f"{profile.name}/"
            )
        return self._runners[profile.name]

    def intree(self, profile: Profile, scenario: Scenario, mode: str) -> ScenarioRecord:
        """The in-tree record of a scenario, checked for determinism before any comparison."""
        key = (profile.name, scenario.id, mode)
        if mode == "compiled":
            if key not in self._records:
                spec = self.intree_spec(profile, scenario)
                record, repeat = (self.runner(profile).run(spec, decode="compiled") for _ in range(2))
                record.validate(f"in-tree record {profile.name}/{spec['id']} (compiled decode)")
                check_deterministic(f"{profile.name}/{scenario.id} (compiled decode)", record, repeat)
                self._records[key] = record
            return self._records[key]
        if (profile.name, scenario.id, "free") not in self._records:
            golden = self.golden(profile, scenario).record
            spec = self.intree_spec(profile, scenario)
            free = self._run(profile, spec, None)
            # Teacher forcing only where a check judges it (beam search has no forced path).
            wants_forced = any(
                c == "token_budget" or (c in CHECKS and CHECKS[c][0] == "teacher_forced")
                for c in profile.checks(scenario)
            )
            forced = self._run(profile, spec, golden) if wants_forced else None
            # Fed the same tokens, two runs must agree bit for bit. When the free run followed the
            # oracle's tokens, the teacher-forced run is exactly such a repeat; otherwise repeat it.
            same_path = forced is not None and free.tokens == golden.tokens and free.extra.get("decode_calls") is None
            repeat = forced if same_path else self._run(profile, spec, None)
            check_deterministic(f"{profile.name}/{scenario.id}", free, repeat)
            self._records[(profile.name, scenario.id, "free")] = free
            if forced is not None:
                self._records[(profile.name, scenario.id, "teacher_forced")] = forced
        if key not in self._records:
            raise HarnessError(
                f"{profile.name}/{scenario.id}: no {mode} in-tree run (no check of the scenario asks for it)"
            )
        return self._records[key]

    def intree_spec(self, profile: Profile, scenario: Scenario) -> dict[str, Any]:
        """What the in-tree side runs: the profile's scenario (with a mutant's edits, if any)."""
        edits = self.intree_spec_edits.get((profile.name, scenario.id), {})
        return runnable_spec(profile.scenario_spec(scenario) | edits)

    def _run(self, profile: Profile, spec: dict[str, Any], forced: ScenarioRecord | None) -> ScenarioRecord:
        record = self.runner(profile).run(spec, forced=forced)
        record.validate(f"in-tree record {profile.name}/{spec['id']} ({record.mode})")
        return record

    # -- checks ------------------------------------------------------------------------------

    def run_check(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        result = self._judge(profile, scenario, check)
        if not result.passed:
            note = self.recorded_elsewhere(profile, scenario)
            if note is not None:
                result.summary += f"; {note}"
                result.details["golden_recorded_on"] = self.golden(profile, scenario).manifest.get("recorded_on")
        return result

    def recorded_elsewhere(self, profile: Profile, scenario: Scenario) -> str | None:
        """Says so when the golden was made on another processor (or macOS version) than this
        machine: same key, so the bits should agree, but the user should know where it came from."""
        recorded = self.golden(profile, scenario).manifest.get("recorded_on")
        here = device_facts().recorded_on()
        fields = ("processor", "os_version") if here["os"] == "darwin" else ("processor",)
        if isinstance(recorded, dict) and all(recorded.get(f) == here[f] for f in fields):
            return None
        where = (
            ", ".join(f"{recorded.get(f)!r}" for f in fields) if isinstance(recorded, dict) else "an unrecorded machine"
        )
        mine = ", ".join(repr(here[f]) for f in fields)
        return (
            f"the golden was recorded on {where}, this machine is {mine} (same golden key); if the "
            f"in-tree implementation is unchanged, regenerate this machine's goldens with "
            f"`make goldens MODEL={profile.name}` and compare them with the tracked ones"
        )

    def _judge(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        if check in SESSION_CHECKS:
            return self._session_check(profile, scenario, check)
        if check not in CHECKS:
            raise HarnessError(f"{profile.name}/{scenario.id}: unknown check {check!r}; known: {sorted(CHECKS)}")
        mode, fn = CHECKS[check]
        golden = self.golden(profile, scenario).record
        actual = self.intree(profile, scenario, mode)
        if golden.is_compact:
            decided = decide_by_digest(check, golden, actual)
            if decided is not None:
                return decided
            golden = self.full_golden(profile, scenario)  # a difference: diagnostics need the vectors
        result = fn(golden, actual)
        if not result.passed and check in LOGITS_CHECKS and result.first_bad_step is not None and localize_enabled():
            where = self.localize(profile, scenario, result.first_bad_step)
            if where is not None:
                result.summary += f"; {where.explain()}"
                result.details["localization"] = where.as_dict()
        return result

    def full_golden(self, profile: Profile, scenario: Scenario) -> ScenarioRecord:
        """A golden with every full vector: as stored, from this cache's full-vector index, or
        regenerated by the oracle and checked against the compact golden's hashes."""
        golden = self.golden(profile, scenario).record
        if not golden.is_compact:
            return golden
        key = (profile.name, scenario.id)
        if key in self._full_goldens:
            return self._full_goldens[key]
        compact = golden.compact
        store = self.store(profile.oracle_of(scenario))
        logits = store.full_logits(compact)
        arrays = dict(golden.arrays)
        if logits is None or set(arrays) != set(golden.array_digests):
            with progress.task(f"{profile.name}/{scenario.id}: regenerating the oracle's full vectors"):
                environment, records, errors = self.oracle_runner(profile.oracle_of(scenario)).run(
                    self.artifact(profile).model_dir, [oracle_spec(profile, scenario)]
                )
            if scenario.id in errors:
                raise OracleError(f"{profile.name}/{scenario.id}: the oracle cannot regenerate: {errors[scenario.id]}")
            again = records[scenario.id]
            where = f"golden {profile.name}/{scenario.id}"
            bad_rows = compact.mismatches(again.logits, range(len(compact.row_sha256)))
            if again.tokens != golden.tokens or bad_rows or len(again.logits) != len(compact.row_sha256):
                raise OracleError(
                    f"{where} is not reproducible on this machine: the oracle regenerated "
                    f"{len(again.logits)} rows (golden {len(compact.row_sha256)}), rows {bad_rows[:5]} hash "
                    "differently: the oracle is not deterministic here or the golden is corrupted"
                )
            for name, digest in golden.array_digests.items():
                if name not in again.arrays or array_sha256(again.arrays[name]) != digest:
                    raise OracleError(f"{where} is not reproducible: regenerated tensor {name!r} hashes differently")
            store.remember_full(compact, again.logits)
            logits, arrays = again.logits, {name: again.arrays[name] for name in golden.array_digests}
        full = dataclasses.replace(golden, logits=logits, arrays=arrays, compact=None, array_digests={})
        full.validate(f"full golden {profile.name}/{scenario.id}")
        self._full_goldens[key] = full
        return full

    def _session_check(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        golden = self.golden(profile, scenario).record  # writers judge the transcript only
        free = self.intree(profile, scenario, "free")
        if check == "writers":
            from harness.checks.writers import check_writers

            # One key order for both: the writers are judged on the same result (the golden's
            # JSON keeps its keys sorted, a transcript dict keeps insertion order).
            return check_writers(
                _sorted_keys(golden.extra.get("transcript")),
                _sorted_keys(free.extra.get("transcript")),
                str(REPO_ROOT / scenario.audio),
                dict(scenario.writer_options),
            )
        from harness.checks.token_budget import check_token_budget

        golden = self.full_golden(profile, scenario)  # margins need the oracle's full vectors
        calibration = self.calibration(profile, scenario, golden)
        forced = self.intree(profile, scenario, "teacher_forced")
        budget = int(scenario.composition["budget"]["max_differing_tokens"])
        return check_token_budget(golden, free, forced, budget, calibration)

    def calibration(self, profile: Profile, scenario: Scenario, golden: ScenarioRecord) -> CalibrationRecord:
        """The scenario's calibration record on this golden key, verified against `golden`."""
        store = self.store(profile.oracle_of(scenario))
        path = store.calibration_path(profile.name, scenario.id)
        return read_record(path, profile.name, scenario.id, store.device_key, golden_identity(golden))

    def localize(self, profile: Profile, scenario: Scenario, row: int) -> Localization | None:
        """The first module whose output differs on the model call of `row` (memoized)."""
        key = (profile.name, scenario.id, row)
        if key not in self._localizations:
            spec = runnable_spec(profile.scenario_spec(scenario))
            oracle = profile.oracle_of(scenario)
            if profile.implementation != "universal-llama" or not can_localize(spec, oracle):
                self._localizations[key] = None
            else:
                golden = self.golden(profile, scenario).record
                expected = oracle_module_outputs(oracle, self.artifact(profile).model_dir, spec, row)
                actual = intree_module_outputs(self.runner(profile), self.intree_spec(profile, scenario), golden, row)
                self._localizations[key] = first_divergence(expected, actual, row)
        return self._localizations[key]


# Which logits rows a logits gate judges.
_GATE_ROWS: dict[str, Callable[[ScenarioRecord], Any]] = {
    "prefill_logits": lambda g: g.prefill_rows(),
    "decode_logits": lambda g: g.decode_rows(),
    "teacher_forced_logits": lambda g: range(len(g.tokens)),
    "compiled_decode": lambda g: range(len(g.tokens)),
}
# Checks that read the golden's logits only to explain a token difference.
_TOKEN_CHECKS = ("greedy_tokens", "decode_tokens", "eos_stop")
_ARRAY_CHECKS = {"mel": "mel", "encoder_output": "encoder"}


def decide_by_digest(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult | None:
    """Judge against a compact golden by hashes alone when that settles it; None when the
    check needs the full vectors (a difference to explain)."""
    if check in _GATE_ROWS:
        rows = list(_GATE_ROWS[check](golden))
        if not rows or actual.logits.ndim != 2 or actual.logits.shape[1:] != (golden.compact.vocab,):
            return None  # the full comparison says what is wrong (nothing to compare is an error there)
        if actual.logits.shape[0] != len(golden.compact.row_sha256):
            return None
        if golden.compact.mismatches(actual.logits, rows, actual.row_hashes()) or actual.tokens != golden.tokens:
            return None
        histogram = {b: (len(rows) * golden.compact.vocab if b == "0" else 0) for b in ULP_BUCKETS}
        return CheckResult(
            check,
            True,
            f"{len(rows)} steps bit-identical (sha256 of each vector's raw bits equals the compact golden's)",
            steps_compared=len(rows),
            per_step=[{"step": r, "max_abs_diff": 0.0, "max_ulp": 0, "n_differing": 0} for r in rows],
            details={"decided_by": "sha256", "ulp_histogram": histogram},
        )
    if check in _ARRAY_CHECKS:
        name = _ARRAY_CHECKS[check]
        if name in golden.arrays:
            return None  # the blob is at hand: the full comparison costs nothing more
        digest = golden.array_digests.get(name)
        if digest is None or name not in actual.arrays or array_sha256(actual.arrays[name]) != digest:
            return None
        shape = "x".join(str(n) for n in actual.arrays[name].shape)
        return CheckResult(check, True, f"{name} ({shape}) bit-identical (sha256 of raw bits)")
    if check in _TOKEN_CHECKS:
        return None if actual.tokens != golden.tokens else CHECKS[check][1](golden, actual)
    return CHECKS[check][1](golden, actual)  # judged on tokens / JSON only


def oracle_spec(profile: Profile, scenario: Scenario) -> dict[str, Any]:
    """What the oracle is asked to run: an in-tree composition (the Whisper fast path) is
    judged against the oracle's reference path, so the oracle never sees it."""
    spec = runnable_spec(profile.scenario_spec(scenario))
    if profile.intree_composition(scenario):
        spec = {k: v for k, v in spec.items() if k != "composition"}
    return spec


def runnable_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as a runner needs it: an audio path made absolute (the hash keeps it relative)."""
    if spec.get("audio"):
        return spec | {"audio": str(REPO_ROOT / spec["audio"])}
    return spec


def model_provenance(name: str) -> dict[str, Any]:
    """What a report says about a model's run: artifact (real or twin), oracle, goldens' hashes.

    Reads tracked manifests only (no blobs, no oracle), so the reporting process can call it.
    """
    from harness.vad_gate import available_vad_profiles, vad_model_provenance

    if name in available_vad_profiles():
        return vad_model_provenance(name)
    session = ParitySession()
    try:
        profile = session.profile(name)
        artifact = session.artifact(profile)
    except HarnessError as e:
        return {"error": str(e)}
    goldens = {}
    for scenario in profile.active_scenarios(device_facts().backend):
        try:
            store = session.store(profile.oracle_of(scenario))
        except HarnessError as e:
            goldens[scenario.id] = {"error": str(e)}
            continue
        path = store.manifest_path(profile.name, scenario.id)
        try:
            manifest = store.read_manifest(profile.name, scenario.id) or {}
        except HarnessError as e:  # the check itself reports it; the report is still written
            goldens[scenario.id] = {"manifest": str(path), "error": str(e)}
            continue
        goldens[scenario.id] = {
            "manifest": str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path),
            "tier": profile.tier_of(scenario),
            "oracle": profile.oracle_of(scenario),
            "blobs": {k: v["sha256"] for k, v in manifest.get("blobs", {}).items()},
            "oracle_environment": manifest.get("oracle_environment", {}),
        }
    return {
        "tier": profile.tier,
        "oracle": profile.oracle,
        "oracle_pins_hash": oracle_pins_hash(profile.oracle),
        "oracles": {
            oracle: oracle_pins_hash(oracle) for oracle in sorted({profile.oracle_of(s) for s in profile.scenarios})
        },
        "artifact": artifact.provenance(),
        "ran_twin": "twin" in artifact.identity,
        "oracle_defects": profile.oracle_defects,
        "goldens": goldens,
    }
