"""A parity session: wires profile -> artifact -> goldens / in-tree records -> checks.

One session object serves the pytest plugin and the CLI alike. It memoizes what is
expensive (artifact resolution, golden loading, in-tree runs) so that the checks of one
scenario share one oracle run and one in-tree run per mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness import settings
from harness.artifacts.resolve import ResolvedArtifact, resolve_artifact
from harness.checks import registry
from harness.checks.compare import (
    CheckResult,
    diff_vectors,
)
from harness.checks.context import FREE, RUNS, TEACHER_FORCED, CheckContext
from harness.checks.exercise import walked_paths
from harness.checks.localize import (
    Localization,
    can_localize,
    first_divergence,
    intree_module_outputs,
    oracle_module_outputs,
)
from harness.errors import (
    ArtifactError,
    GoldenError,
    HarnessError,
    InTreeRunError,
    NonDeterministicError,
    OracleError,
)
from harness.goldens.lifecycle import GoldenLifecycle, runnable_spec
from harness.goldens.store import Golden
from harness.oracle.venvs import oracle_pins_hash
from harness.paths import REPO_ROOT, shown
from harness.profile import Profile, Scenario
from harness.profile.load import find_profile
from harness.provenance import device_facts
from harness.records import ScenarioRecord
from harness.repeat import forced_run_repeats_free
from harness.runners import InTreeRunner, ModelHook
from harness.runners.llama import LlamaRunner
from harness.runners.oracle import OracleRunner
from harness.runners.whisper import WhisperRunner
from harness.timing import clock, in_tree_phase


def localize_enabled() -> bool:
    """`MLX_PARITY_LOCALIZE=0` skips localization (it costs one more run of each side)."""
    return settings.read().localize


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
    verify = first.arrays.get("verify_logits")  # a draft run: every verify row and step, not only the kept rows
    if verify is not None and (
        verify.tobytes() != second.arrays["verify_logits"].tobytes()
        or first.extra.get("step_info") != second.extra.get("step_info")
    ):
        raise NonDeterministicError(
            f"in-tree implementation is not deterministic on {label}: the draft runs' verify rows or steps differ"
        )


@dataclass
class ParitySession(GoldenLifecycle):
    model_hook: ModelHook | None = None
    oracle_runner: Callable[[str], OracleRunner] = OracleRunner  # tests inject a fake oracle
    _profiles: dict[str, Profile] = field(default_factory=dict)
    _artifacts: dict[str, ResolvedArtifact] = field(default_factory=dict)
    _goldens: dict[str, dict[str, Golden]] = field(default_factory=dict)
    _runners: dict[str, InTreeRunner] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], ScenarioRecord] = field(default_factory=dict)
    # A profile whose goldens could not be had fails every later check with the same error,
    # rather than running the oracle again for each one.
    _golden_errors: dict[str, HarnessError] = field(default_factory=dict)
    _scenario_errors: dict[tuple[str, str], HarnessError] = field(default_factory=dict)
    _localizations: dict[tuple[str, str, int], Localization | None] = field(default_factory=dict)
    _full_goldens: dict[tuple[str, str], ScenarioRecord] = field(default_factory=dict)
    _full_golden_errors: dict[tuple[str, str], HarnessError] = field(default_factory=dict)
    # Per profile, the scenarios a pytest run selected (absent: all): only their goldens are made.
    selected_scenarios: dict[str, set[str]] = field(default_factory=dict)
    # Faults for `make mutants`: per (profile, scenario), spec keys the in-tree run is given in
    # place of the profile's (the golden stays the profile's: a mutant is judged against it).
    intree_spec_edits: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Absent goldens are generated while the in-tree side runs its free runs (lifecycle's
    # overlap_enabled); the parity plugin's session turns it on.
    overlap_generation: bool = False
    _prefetched: dict[tuple[str, str], ScenarioRecord] = field(default_factory=dict)
    # Artifacts whose every file was read again this session (verify_artifact), and those
    # found corrupt that could not be mended (a hub snapshot): every later check says so.
    _verified_in_full: set[str] = field(default_factory=set)
    _artifact_rebuilds: dict[str, int] = field(default_factory=dict)
    _artifact_errors: dict[str, HarnessError] = field(default_factory=dict)
    # In-tree runs that raised, per (profile, scenario, compiled?): never run again in the session.
    _intree_errors: dict[tuple[str, str, bool], Exception] = field(default_factory=dict)

    def release(self, name: str) -> None:
        """Drop a profile's in-tree model and records once its last check has run, so a run
        over many profiles holds one profile's model at a time (a 7 GB runner, issue 14)."""
        self._runners.pop(name, None)
        for cache in (self._records, self._full_goldens, self._localizations, self._prefetched, self._intree_errors):
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
        if profile.name in self._artifact_errors:  # found corrupt in full and not mendable here
            raise self._artifact_errors[profile.name]
        if profile.name not in self._artifacts:
            with clock.phase("artifact"):
                self._artifacts[profile.name] = resolve_artifact(profile)
        return self._artifacts[profile.name]

    # -- goldens ---------------------------------------------------------------------------

    # -- in-tree -----------------------------------------------------------------------------

    def runner(self, profile: Profile) -> InTreeRunner:
        if profile.name not in self._runners:
            runners = {"universal-llama": LlamaRunner, "whisper": WhisperRunner}
            if profile.implementation not in runners:
                raise HarnessError(f"{profile.name}: no in-tree runner for implementation {profile.implementation!r}")
            model_dir = self.artifact(profile).model_dir
            with clock.phase("in-tree load"):
                self._runners[profile.name] = runners[profile.implementation](
                    model_dir, self.model_hook, label=f"{profile.name}/"
                )
        return self._runners[profile.name]

    def intree(self, profile: Profile, scenario: Scenario, mode: str) -> ScenarioRecord:
        """The in-tree record of a scenario, checked for determinism before any comparison. A
        run that raised is remembered: later checks of the scenario are errors naming it, never
        a rerun (an empty WAV's nine checks made nine runs; a one-off crash passed the retries)."""
        failed = self._intree_errors.get((profile.name, scenario.id, mode == "compiled"))
        if failed is not None:
            raise InTreeRunError(
                f"{profile.name}/{scenario.id}: the in-tree run already failed in this session, "
                f"not run again: {type(failed).__name__}: {failed}"
            )
        try:
            self._intree(profile, scenario, mode)
        except (GoldenError, ArtifactError, OracleError):
            raise  # the oracle's or the artifact's side: remembered where it is had
        except Exception as e:
            self._intree_errors[(profile.name, scenario.id, mode == "compiled")] = e
            raise
        if (profile.name, scenario.id, mode) not in self._records:
            raise HarnessError(
                f"{profile.name}/{scenario.id}: no {mode} in-tree run (no check of the scenario asks for it)"
            )
        return self._records[(profile.name, scenario.id, mode)]

    def _intree(self, profile: Profile, scenario: Scenario, mode: str) -> None:
        key = (profile.name, scenario.id, mode)
        if mode == "compiled":
            if key not in self._records:
                spec = self.intree_spec(profile, scenario)
                runner = self.runner(profile)
                with clock.phase(in_tree_phase("compiled")):
                    record = runner.run(spec, decode="compiled")
                with clock.phase(in_tree_phase("compiled", repeat=True)):
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
            wants_forced = any(TEACHER_FORCED in registry.get(c).needed for c in profile.checks(scenario))
            forced = self._run(profile, spec, golden) if wants_forced else None
            # Fed the same tokens, two runs must agree bit for bit. When the free run followed the
            # oracle's tokens (a speech run: its decode calls), the teacher-forced run is exactly
            # such a repeat; otherwise repeat it (harness/repeat.py).
            same_path = forced_run_repeats_free(free, forced, golden)
            repeat = forced if same_path else self._run(profile, spec, None, repeat=True)
            check_deterministic(f"{profile.name}/{scenario.id}", free, repeat)
            self._records[(profile.name, scenario.id, "free")] = free
            if forced is not None:
                self._records[(profile.name, scenario.id, "teacher_forced")] = forced

    def prefetch_intree(self, profile: Profile, done: Callable[[], bool]) -> None:
        """While the oracle generates the profile's absent goldens, run the free runs of its
        scenarios (those a check will ask for), in profile order, until the generator is done.
        The scenario's first check then uses the run as made: same runner, same spec, validated
        the same way; its determinism repeat and teacher-forced run come later, as always. A run
        that fails here is dropped: the check runs it again and reports the error there."""
        if profile.implementation not in ("universal-llama", "whisper"):
            return
        for scenario in self._scenarios_in_scope(profile):
            key = (profile.name, scenario.id)
            if done():
                return
            if key in self._prefetched or (*key, "free") in self._records:
                continue
            if not any(FREE in registry.get(c).needed for c in profile.checks(scenario)):
                continue  # a compiled-only scenario makes no free run
            try:
                self._prefetched[key] = self._run(profile, self.intree_spec(profile, scenario), None)
            except Exception:  # noqa: BLE001 - reported by the check that runs it again
                return

    def intree_spec(self, profile: Profile, scenario: Scenario) -> dict[str, Any]:
        """What the in-tree side runs: the profile's scenario (with a mutant's edits, if any)."""
        edits = self.intree_spec_edits.get((profile.name, scenario.id), {})
        return runnable_spec(profile.scenario_spec(scenario) | edits)

    def _run(
        self, profile: Profile, spec: dict[str, Any], forced: ScenarioRecord | None, repeat: bool = False
    ) -> ScenarioRecord:
        runner = self.runner(profile)
        with clock.phase(in_tree_phase("free" if forced is None else "teacher_forced", repeat)):
            record = runner.run(spec, forced=forced)
        record.validate(f"in-tree record {profile.name}/{spec['id']} ({record.mode})")
        return record

    # -- checks ------------------------------------------------------------------------------

    def run_check(self, profile: Profile, scenario: Scenario, check: str) -> CheckResult:
        rebuilds = self._artifact_rebuilds.get(profile.name, 0)
        result = self._judge(profile, scenario, check)
        if self._artifact_rebuilds.get(profile.name, 0) != rebuilds:  # what it judged ran on corrupt files
            result = self._judge(profile, scenario, check)
            result.summary += "; judged again after the artifact was found corrupt and made again"
        exercise = registry.get(check).exercises
        if exercise is not None:  # judged over the profile by harness/coverage.py
            golden = self.golden(profile, scenario).record
            result.details["walked"] = walked_paths(profile, scenario, check, exercise, golden, result)
        if not result.passed:
            note = self.recorded_elsewhere(profile, scenario)
            if note is not None:
                result.summary += f"; {note}"
                result.details["golden_recorded_on"] = self.golden(profile, scenario).manifest.get("recorded_on")
        return result

    def _failed_on_intact_files(self, profile: Profile, scenario: Scenario, check: str) -> bool:
        """A failure is blamed on the implementation only once the artifact's files are known
        intact: read in full (bit rot keeps size and mtime). False when a corrupt made-here
        artifact was just made again (what ran on it dropped): the check is judged again."""
        rebuilds = self._artifact_rebuilds.get(profile.name, 0)
        self.verify_artifact(profile, f"after {profile.name}/{scenario.id}/{check} failed")
        return self._artifact_rebuilds.get(profile.name, 0) == rebuilds

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
        # Rows of unequal count whose shared rows are all identical differ where a run stopped:
        # no module computed different bits, so there is nothing to localize.
        localizable = result.first_bad_step is not None and not result.details.get("shared_rows_identical")
        if not result.passed and spec.localized and localizable and localize_enabled():
            where = self.localize(profile, scenario, result.first_bad_step)
            if where is not None:
                result.summary += f"; {where.explain()}"
                result.details["localization"] = where.as_dict()
        return result

    def localize(self, profile: Profile, scenario: Scenario, row: int) -> Localization | None:
        """The first module whose output differs on the model call of `row` (memoized)."""
        key = (profile.name, scenario.id, row)
        if key not in self._localizations:
            with clock.phase("localization"):
                self._localizations[key] = self._localize(profile, scenario, row)
        return self._localizations[key]

    def _localize(self, profile: Profile, scenario: Scenario, row: int) -> Localization | None:
        spec = runnable_spec(profile.scenario_spec(scenario))
        oracle = profile.oracle_of(scenario)
        if profile.implementation != "universal-llama" or not can_localize(spec, oracle):
            return None
        golden = self.golden(profile, scenario).record
        expected = oracle_module_outputs(oracle, self.artifact(profile).model_dir, spec, row)
        actual = intree_module_outputs(self.runner(profile), self.intree_spec(profile, scenario), golden, row)
        return first_divergence(expected, actual, row)


def model_provenance(name: str) -> dict[str, Any]:
    """What a report says about a model's run: artifact (real or twin), oracle, goldens' hashes.

    Reads tracked manifests only (no blobs, no oracle), so the reporting process can call it.
    """
    from harness.goldens.vad import vad_model_provenance
    from harness.profile.vad import available_vad_profiles

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
            "manifest": shown(path),
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
