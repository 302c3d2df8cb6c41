"""A parity session: wires profile -> artifact -> goldens / in-tree records -> checks.

One session object serves the pytest plugin and the CLI alike. It memoizes what is
expensive (artifact resolution, golden loading, in-tree runs) so that the checks of one
scenario share one oracle run and one in-tree run per mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import settings
from harness.artifacts.keeper import ArtifactKeeper
from harness.artifacts.resolve import ResolvedArtifact
from harness.checks import registry
from harness.checks.compare import (
    CheckResult,
)
from harness.checks.context import FREE, RUNS, TEACHER_FORCED, CheckContext
from harness.checks.exercise import walked_paths
from harness.checks.localize import (
    Localization,
    can_localize,
    close_servers,
    first_divergence,
    localizes,
    module_outputs,
    oracle_module_outputs_beside,
)
from harness.errors import (
    ArtifactError,
    GoldenError,
    HarnessError,
    InTreeRunError,
    OracleError,
    RecordError,
)
from harness.goldens.calibration import CalibrationRecord
from harness.goldens.lifecycle import GoldenLifecycle
from harness.goldens.specs import runnable_spec
from harness.goldens.store import Golden, GoldenStore
from harness.paths import REPO_ROOT
from harness.profile import Profile, Scenario
from harness.profile.load import find_profile
from harness.progress import progress
from harness.records import ScenarioRecord
from harness.repeat import check_deterministic, forced_run_repeats_free
from harness.runners import InTreeRunner, ModelHook
from harness.runners.oracle import OracleRunner
from harness.timing import clock, in_tree_phase


def check_vocab(profile: str, scenario: str, record: ScenarioRecord, golden: ScenarioRecord) -> None:
    """Another width is a malformed record, not a difference of bits."""
    if record.tokens and golden.tokens and record.vocab != golden.vocab:
        raise RecordError(
            f"in-tree record {profile}/{scenario} ({record.mode}): logits rows of "
            f"{record.vocab} values, expected the oracle's vocabulary of {golden.vocab}"
        )


def localize_enabled() -> bool:
    """`MLX_PARITY_LOCALIZE=0` skips localization (it costs one more run of each side)."""
    return settings.read().localize


@dataclass
class ParitySession:
    model_hook: ModelHook | None = None
    oracle_runner: Callable[[str], OracleRunner] = OracleRunner  # tests inject a fake oracle
    _profiles: dict[str, Profile] = field(default_factory=dict)
    _runners: dict[str, InTreeRunner] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], ScenarioRecord] = field(default_factory=dict)
    _localizations: dict[tuple[str, str, int], Localization | None] = field(default_factory=dict)
    _localized: dict[str, Path] = field(default_factory=dict)  # profile -> the model its diagnose server loaded
    # Per profile, the scenarios a pytest run selected (absent: all): only their goldens are made.
    selected_scenarios: dict[str, set[str]] = field(default_factory=dict)
    # Faults for `make mutants`: per (profile, scenario), spec keys the in-tree run is given in
    # place of the profile's (the golden stays the profile's: a mutant is judged against it).
    intree_spec_edits: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Absent goldens are generated while the in-tree side runs its free runs (lifecycle's
    # overlap_enabled); the parity plugin's session turns it on.
    overlap_generation: bool = False
    _prefetched: dict[tuple[str, str], ScenarioRecord] = field(default_factory=dict)
    # In-tree runs that raised, per (profile, scenario, run: free, teacher_forced or compiled): never
    # run again in the session (a free run's failure is the teacher-forced run's too).
    _intree_errors: dict[tuple[str, str, str], Exception] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Its collaborators: the artifacts it holds, and the goldens' lifecycle (given the
        # artifacts, the oracle's runner, the in-tree work to overlap and the selection).
        self.artifacts = ArtifactKeeper(release=self.release)
        self.lifecycle = GoldenLifecycle(
            self.artifacts,
            lambda oracle: self.oracle_runner(oracle),
            self.prefetch_intree,
            self.selected_scenarios,
            lambda: self.overlap_generation,
        )

    def release(self, name: str) -> None:
        """Drop a profile's in-tree model and records once its last check has run, so a run
        over many profiles holds one profile's model at a time (a 7 GB runner, issue 14)."""
        runner = self._runners.pop(name, None)
        if hasattr(runner, "close"):  # an implementation in its own process: told `bye`
            runner.close()
        if name in self._localized:  # the oracle's diagnose server for its model
            close_servers(self._localized.pop(name))
        self.lifecycle.release(name)
        for cache in (self._records, self._localizations, self._prefetched, self._intree_errors):
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

    # -- what the checks and tools ask the session, answered by its collaborators -----------

    def artifact(self, profile: Profile) -> ResolvedArtifact:
        return self.artifacts.artifact(profile)

    def verify_artifact(self, profile: Profile, why: str) -> None:
        self.artifacts.verify(profile, why)

    def goldens(self, profile: Profile, regenerate: bool = False) -> dict[str, Golden]:
        return self.lifecycle.goldens(profile, regenerate)

    def golden(self, profile: Profile, scenario: Scenario) -> Golden:
        return self.lifecycle.golden(profile, scenario)

    def full_golden(self, profile: Profile, scenario: Scenario) -> ScenarioRecord:
        return self.lifecycle.full_golden(profile, scenario)

    def store(self, oracle: str) -> GoldenStore:
        return self.lifecycle.store(oracle)

    def provenance(self, profile: Profile, scenario: Scenario) -> dict[str, Any]:
        return self.lifecycle.provenance(profile, scenario)

    def calibration(self, profile: Profile, scenario: Scenario, golden: ScenarioRecord) -> CalibrationRecord:
        return self.lifecycle.calibration(profile, scenario, golden)

    def scenario_errors(self, profile_name: str) -> dict[tuple[str, str], HarnessError]:
        return self.lifecycle.scenario_errors(profile_name)

    def recorded_elsewhere(self, profile: Profile, scenario: Scenario) -> str | None:
        return self.lifecycle.recorded_elsewhere(profile, scenario)

    # -- in-tree -----------------------------------------------------------------------------

    def runner(self, profile: Profile) -> InTreeRunner:
        if profile.name not in self._runners:
            runner_class = profile.under_test.runner_class()
            model_dir = self.artifact(profile).model_dir
            with clock.phase("in-tree load"):
                self._runners[profile.name] = runner_class(model_dir, self.model_hook, label=f"{profile.name}/")
        return self._runners[profile.name]

    def intree(self, profile: Profile, scenario: Scenario, mode: str) -> ScenarioRecord:
        """The in-tree record of a scenario, checked for determinism before any comparison. A
        run that raised is remembered: later checks of the scenario are errors naming it, never
        a rerun (an empty WAV's nine checks made nine runs; a one-off crash passed the retries).
        A teacher-forced run that raised (a plug-in refusing it) errs only the checks judging it:
        the free run's judge on (issue 46 part 1)."""
        key = (profile.name, scenario.id)
        for _ in range(2):  # a remembered failure, else the run, then what the run left
            failed = self._intree_errors.get((*key, mode))
            if failed is None and mode == "teacher_forced":
                failed = self._intree_errors.get((*key, "free"))
            if failed is not None:
                what = "teacher-forced run" if (*key, "teacher_forced") in self._intree_errors else "run"
                raise InTreeRunError(
                    f"{profile.name}/{scenario.id}: the in-tree {what} already failed in this session, not run again "
                    f"(only the checks needing it err): {type(failed).__name__}: {failed}"
                )
            if (*key, mode) in self._records:
                return self._records[(*key, mode)]
            try:
                self._intree(profile, scenario, mode)
            except (GoldenError, ArtifactError, OracleError):
                raise  # the oracle's or the artifact's side: remembered where it is had
            except Exception as e:
                self._intree_errors[(*key, "compiled" if mode == "compiled" else "free")] = e
                raise
        raise HarnessError(
            f"{profile.name}/{scenario.id}: no {mode} in-tree run (no check of the scenario asks for it)"
        )

    def _intree(self, profile: Profile, scenario: Scenario, mode: str) -> None:
        key = (profile.name, scenario.id, mode)
        if mode == "compiled":
            if key not in self._records:
                spec = self.intree_spec(profile, scenario)
                if scenario.compiled_variant is not None:  # the in-tree side's choice: never hashed
                    spec = spec | {"compiled_variant": scenario.compiled_variant}
                runner = self.runner(profile)
                with clock.phase(in_tree_phase("compiled")):
                    record = runner.run(spec, decode="compiled")
                with clock.phase(in_tree_phase("compiled", repeat=True)), progress.phase("the determinism repeat"):
                    repeat = runner.run(spec, decode="compiled")
                record.validate(f"in-tree record {profile.name}/{spec['id']} (compiled decode)")
                check_deterministic(f"{profile.name}/{scenario.id} (compiled decode)", record, repeat)
                self._records[key] = record
            return
        if (profile.name, scenario.id, "free") not in self._records:
            golden = self.golden(profile, scenario).record
            spec = self.intree_spec(profile, scenario)
            free = self._prefetched.pop((profile.name, scenario.id), None) or self._run(profile, spec, None)
            # Teacher forcing only where a check judges it (beam search has no forced path).
            wants_forced = TEACHER_FORCED in profile.planned(scenario).needs
            forced = self._forced_run(profile, scenario, spec, golden) if wants_forced else None
            # Fed the same tokens, two runs must agree bit for bit. When the free run followed the
            # oracle's tokens (a speech run: its decode calls), the teacher-forced run is exactly
            # such a repeat; otherwise repeat it (harness/repeat.py).
            same_path = forced_run_repeats_free(free, forced, golden)
            repeat = forced if same_path else self._run(profile, spec, None, repeat=True)
            check_vocab(profile.name, scenario.id, free, golden)
            check_deterministic(f"{profile.name}/{scenario.id}", free, repeat)
            self._records[(profile.name, scenario.id, "free")] = free
            if forced is not None:
                self._records[(profile.name, scenario.id, "teacher_forced")] = forced

    def _forced_run(
        self, profile: Profile, scenario: Scenario, spec: dict[str, Any], golden: ScenarioRecord
    ) -> ScenarioRecord | None:
        """The teacher-forced run, or None where it raised: remembered for the checks judging it
        alone (the free run's checks judge on)."""
        try:
            forced = self._run(profile, spec, golden)
            check_vocab(profile.name, scenario.id, forced, golden)
            return forced
        except (GoldenError, ArtifactError, OracleError):
            raise
        except Exception as e:
            self._intree_errors[(profile.name, scenario.id, "teacher_forced")] = e
            return None

    def prefetch_intree(self, profile: Profile, done: Callable[[], bool]) -> None:
        """While the oracle generates the profile's absent goldens, run the free runs of its
        scenarios (those a check will ask for), in profile order, until the generator is done.
        The scenario's first check then uses the run as made: same runner, same spec, validated
        the same way; its determinism repeat and teacher-forced run come later, as always. A run
        that fails here is dropped: the check runs it again and reports the error there."""
        for scenario in self.lifecycle.scenarios_in_scope(profile):
            key = (profile.name, scenario.id)
            if done():
                return
            if key in self._prefetched or (*key, "free") in self._records:
                continue
            if FREE not in profile.planned(scenario).needs:
                continue  # a compiled-only scenario makes no free run
            try:
                self._prefetched[key] = self._run(profile, self.intree_spec(profile, scenario), None)
            except Exception:  # noqa: BLE001 - reported by the check that runs it again
                return

    def intree_spec(self, profile: Profile, scenario: Scenario) -> dict[str, Any]:
        """What the in-tree side runs: the profile's scenario (with a mutant's edits, if any)."""
        edits = self.intree_spec_edits.get((profile.name, scenario.id), {})
        return runnable_spec(profile.planned(scenario).spec_dict() | edits)

    def _run(
        self, profile: Profile, spec: dict[str, Any], forced: ScenarioRecord | None, repeat: bool = False
    ) -> ScenarioRecord:
        runner = self.runner(profile)
        why = progress.phase("the determinism repeat") if repeat else contextlib.nullcontext()
        with clock.phase(in_tree_phase("free" if forced is None else "teacher_forced", repeat)), why:
            record = runner.run(spec, forced=forced)
        record.validate(f"in-tree record {profile.name}/{spec['id']} ({record.mode})")
        return record

    # -- checks ------------------------------------------------------------------------------

    def forget_runs(self, profile: Profile, scenario: Scenario) -> None:
        """Drop the scenario's in-tree runs and localizations: the next check makes them anew."""
        for cache in (self._records, self._localizations, self._prefetched, self._intree_errors):
            for key in [k for k in cache if k[:2] == (profile.name, scenario.id)]:
                del cache[key]

    def run_check(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        rebuilds = self.artifacts.rebuilt(profile.name)
        result = self._judge(profile, scenario, check)
        if self.artifacts.rebuilt(profile.name) != rebuilds:  # what it judged ran on corrupt files
            result = self._judge(profile, scenario, check)
            result.summary += "; judged again after the artifact was found corrupt and made again"
        exercise = registry.get(check).exercises
        if exercise is not None:  # judged over the profile by harness/coverage.py
            golden = self.golden(profile, scenario).record
            result.details["walked"] = walked_paths(profile, scenario, check, exercise, golden, result)
        hello = getattr(self._runners.get(profile.name), "hello", None)
        if hello:  # an implementation in its own process: who it said it is, for the report (L6)
            result.details["implementation_hello"] = {k: hello.get(k) for k in ("name", "version", "environment")}
        if not result.passed:
            note = self.recorded_elsewhere(profile, scenario)
            if note is not None:
                result.summary += f"; {note}"
                result.details["machine_note"] = note
                result.details["golden_recorded_on"] = self.golden(profile, scenario).manifest.get("recorded_on")
        return result

    def _failed_on_intact_files(self, profile: Profile, scenario: Scenario, check: str) -> bool:
        """A failure is blamed on the implementation only once the artifact's files are known
        intact: read in full (bit rot keeps size and mtime). False when a corrupt made-here
        artifact was just made again (what ran on it dropped): the check is judged again."""
        rebuilds = self.artifacts.rebuilt(profile.name)
        self.verify_artifact(profile, f"after {profile.name}/{scenario.id}/{check} failed")
        return self.artifacts.rebuilt(profile.name) == rebuilds

    def context(self, profile: Profile, scenario: Scenario) -> CheckContext:
        """What any check of the scenario may ask for, each made on first use and kept."""

        def streamed(seconds: float) -> ScenarioRecord:
            with clock.phase(in_tree_phase("streamed")):
                return self.runner(profile).run_streamed(self.intree_spec(profile, scenario), seconds)

        return CheckContext(
            label=f"{profile.name}/{scenario.id}",
            scenario=scenario,
            audio=str(REPO_ROOT / scenario.audio) if scenario.audio else None,
            golden=lambda: self.golden(profile, scenario).record,
            full_golden=lambda: self.full_golden(profile, scenario),
            intree=lambda mode: self.intree(profile, scenario, mode),
            calibration=lambda golden: self.calibration(profile, scenario, golden),
            streamed=streamed,
        )

    def _judge(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        """The row's judge on the scenario's context; the in-tree runs it needs are made first
        (their own phases), the judging is timed apart."""
        spec = registry.get(check)
        if spec.compare is not None:
            self.golden(profile, scenario)
        for run in spec.needed:
            if run in RUNS:
                self.intree(profile, scenario, run)
        with clock.phase("judging"):
            result = spec.judge(self.context(profile, scenario))
        if not result.passed and not self._failed_on_intact_files(profile, scenario, check):
            return result  # judged again by run_check; nothing to localize on corrupt files
        # Unequal row counts, every shared row identical: a run stopped early; nothing to localize.
        localizable = result.first_bad_step is not None and not result.details.get("shared_rows_identical")
        if not result.passed and spec.localized and localizable and localize_enabled():
            where = self.localize(profile, scenario, result.first_bad_step)
            if where is not None:
                result.summary += f"; {where.explain()}"
                if where.row != result.first_bad_step:
                    result.summary += f" (localized at step {where.row}, this scenario's earliest)"
                result.details["localization"] = where.as_dict()
            elif not localizes(profile, self.runner(profile)):
                result.summary += (
                    f"; first diverging module: unavailable ({profile.under_test.name} has no module taps)"
                )
        return result

    def localize(self, profile: Profile, scenario: Scenario, row: int) -> Localization | None:
        """The first module whose output differs on the model call of `row`, once per scenario:
        a check failing at a later row than one already localized gets that localization (the
        scenario's earliest divergence explains the later ones); an earlier row is localized anew."""
        done = {r: loc for (m, s, r), loc in self._localizations.items() if (m, s) == (profile.name, scenario.id)}
        earlier = [r for r in done if r <= row]
        if earlier:
            return done[min(earlier)]
        with clock.phase("localization"):
            found = self._localize(profile, scenario, row)
        self._localizations[(profile.name, scenario.id, row)] = found
        return found

    def _localize(self, profile: Profile, scenario: Scenario, row: int) -> Localization | None:
        planned = profile.planned(scenario)
        spec, oracle = runnable_spec(planned.spec_dict()), planned.oracle
        if not localizes(profile, self.runner(profile)) or not can_localize(spec, oracle):
            return None
        golden = self.golden(profile, scenario).record
        # Both runs end one step after the tapped call (nothing later can change it), and the
        # oracle's runs in its own process while the in-tree side runs here.
        upto = row + 2
        short = {"n_tokens": min(spec["n_tokens"], upto)}
        forced = dataclasses.replace(golden, tokens=golden.tokens[:upto])
        model_dir = self._localized[profile.name] = self.artifact(profile).model_dir
        # What runs after the generation (mlx-lm's stream_generate for a stop, its server for a
        # response) calls the model after the tapped call: left out, it cannot change that call.
        tapped = spec | short | {"stop": None, "response": None}
        expected = oracle_module_outputs_beside(oracle, model_dir, tapped, row)
        with progress.phase(f"localization (row {row})"):
            mine = self.intree_spec(profile, scenario) | short
            actual = module_outputs(self.runner(profile), mine, forced, row)
        return first_divergence(expected.result(), actual, row)
