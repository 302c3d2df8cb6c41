"""A compact golden's full vectors, on demand: what a failing check needs to explain itself.

A compact golden keeps per-row hashes, the top-k and the logsumexp; a check that finds a
differing row needs the oracle's whole vector. It comes from this cache's full-vector index
(vectors the oracle made here before, hashed against the golden's rows), else the oracle
regenerates the scenario and every row must hash as the golden says (else: not reproducible
here, and the error says why, naming the machine that recorded it when that differs).

Once per scenario, never per check. And a failure is seldom alone: after the first
regeneration in a profile the oracles regenerate, beside the in-tree side, every other selected
scenario whose vectors this cache lacks (each by its own oracle), one after the other in the
run's order, so the failures that follow find theirs ready (`MLX_PARITY_OVERLAP=0`, an xdist
worker or a one-core machine: one scenario at a time, as it is needed).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from harness import settings
from harness.errors import HarnessError, OracleError
from harness.goldens.specs import oracle_spec, overlap_enabled
from harness.profile import Profile, Scenario
from harness.progress import progress
from harness.records import ScenarioRecord, array_sha256
from harness.timing import clock, oracle_phase

Key = tuple[str, str]  # (profile, scenario)


@dataclass
class FullVectors:
    owner: Any  # the GoldenLifecycle: goldens, stores, artifacts, the oracle runner, the selection
    done: dict[Key, ScenarioRecord] = field(default_factory=dict)
    errors: dict[Key, HarnessError] = field(default_factory=dict)
    pending: dict[Key, concurrent.futures.Future] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    def release(self, name: str) -> None:
        for key in [k for k in self.pending if k[0] == name]:
            concurrent.futures.wait([self.pending[key]])
        with self._lock:
            for key in [k for k in self.done if k[0] == name]:
                del self.done[key]

    def reproduced_here(self, profile: Profile, scenario: Scenario) -> bool:
        """The oracle made this golden's full vectors on this machine and they hash as it says."""
        return (profile.name, scenario.id) in self.done

    def get(self, profile: Profile, scenario: Scenario) -> ScenarioRecord:
        golden = self.owner.golden(profile, scenario).record
        if not golden.is_compact:
            return golden
        key = (profile.name, scenario.id)
        if key in self.pending:  # the background regeneration has (or will have) it
            with clock.phase(oracle_phase(profile.planned(scenario).oracle)):
                concurrent.futures.wait([self.pending[key]])
        if key in self.done:
            return self.done[key]
        if key in self.errors:  # the oracle is not re-run for every failing check
            raise self.errors[key]
        cached = self._cached(profile, scenario)
        if cached is not None:
            return self._keep(key, cached)
        self.owner.artifacts.verify(profile, "before the oracle regenerates full vectors")
        self._start_the_others(profile, scenario)
        with (
            clock.phase(oracle_phase(profile.planned(scenario).oracle)),
            progress.task(f"{profile.name}/{scenario.id}: regenerating the oracle's full vectors"),
        ):
            out = self.regenerate(profile, [scenario])[scenario.id]
        if isinstance(out, HarnessError):
            with self._lock:
                self.errors[key] = out
            raise out
        return self._keep(key, out)

    def _keep(self, key: Key, full: ScenarioRecord) -> ScenarioRecord:
        with self._lock:
            self.done[key] = full
        return full

    def _cached(self, profile: Profile, scenario: Scenario) -> ScenarioRecord | None:
        """The full vectors from this cache's index, when it holds every one of them."""
        golden = self.owner.golden(profile, scenario).record
        store = self.owner.store(profile.planned(scenario).oracle)
        logits = store.full_logits(golden.compact)
        arrays = dict(golden.arrays)
        missing = {name: digest for name, digest in golden.array_digests.items() if name not in arrays}
        if missing:
            arrays |= store.full_arrays(missing) or {}
        if logits is None or set(arrays) != set(golden.array_digests):
            return None
        return _full(golden, logits, arrays, f"{profile.name}/{scenario.id}")

    def regenerate(self, profile: Profile, scenarios: list[Scenario]) -> dict[str, ScenarioRecord | HarnessError]:
        """One oracle process for `scenarios` (one oracle); each record checked against its
        golden's hashes and kept in this cache's full-vector index, or the reason it cannot be."""
        oracle = profile.planned(scenarios[0]).oracle
        specs = [oracle_spec(profile, s) for s in scenarios]
        model_dir = self.owner.artifacts.artifact(profile).model_dir
        _, records, errors = self.owner.oracle_runner(oracle).run(model_dir, specs)
        out: dict[str, ScenarioRecord | HarnessError] = {}
        for scenario in scenarios:
            if scenario.id in errors:
                out[scenario.id] = OracleError(
                    f"{profile.name}/{scenario.id}: the oracle cannot regenerate: {errors[scenario.id]}"
                )
                continue
            try:
                out[scenario.id] = self._checked(profile, scenario, records[scenario.id])
            except HarnessError as e:
                out[scenario.id] = e
        return out

    def _checked(self, profile: Profile, scenario: Scenario, again: ScenarioRecord) -> ScenarioRecord:
        golden = self.owner.golden(profile, scenario).record
        compact = golden.compact
        where = f"golden {profile.name}/{scenario.id}"
        bad_rows = compact.mismatches(again.logits, range(len(compact.row_sha256)))
        if again.tokens != golden.tokens or bad_rows or len(again.logits) != len(compact.row_sha256):
            elsewhere = self.owner.recorded_elsewhere(profile, scenario)
            raise OracleError(
                f"{where} is not reproducible on this machine: the oracle regenerated "
                f"{len(again.logits)} rows (golden {len(compact.row_sha256)}), rows {bad_rows[:5]} hash "
                "differently: the oracle is not deterministic here or the golden is corrupted"
                + (f"; {elsewhere}" if elsewhere else "")
            )
        for name, digest in golden.array_digests.items():
            if name not in again.arrays or array_sha256(again.arrays[name]) != digest:
                raise OracleError(f"{where} is not reproducible: regenerated tensor {name!r} hashes differently")
        store = self.owner.store(profile.planned(scenario).oracle)
        store.remember_full(compact, again.logits)
        store.remember_arrays({name: again.arrays[name] for name in golden.array_digests})
        arrays = {name: again.arrays[name] for name in golden.array_digests}
        return _full(golden, again.logits, arrays, f"{profile.name}/{scenario.id}")

    def _start_the_others(self, profile: Profile, failing: Scenario) -> None:
        """Regenerate, beside the in-tree side, the other selected scenarios (each by its own
        oracle) whose full vectors this cache lacks, in the run's order (once per profile)."""
        if settings.read().xdist_worker or not overlap_enabled(self.owner.overlap_generation()):
            return
        others = []
        for s in self.owner.scenarios_in_scope(profile):
            key = (profile.name, s.id)
            if s.id == failing.id or key in self.pending or key in self.done or key in self.errors:
                continue
            try:
                if self.owner.golden(profile, s).record.is_compact and self._cached(profile, s) is None:
                    others.append(s)
            except HarnessError:
                continue  # that scenario's own check reports it
        if not others:
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="oracle-full")
        futures: dict[str, Future] = {s.id: Future() for s in others}
        for s in others:
            self.pending[(profile.name, s.id)] = futures[s.id]
        self._pool.submit(self._beside, profile, others, futures)

    def _beside(self, profile: Profile, scenarios: list[Scenario], futures: dict[str, Future]) -> None:
        """One scenario at a time, in the run's order: the next failing scenario waits at most
        for its own regeneration, which started while the ones before it ran."""
        for scenario in scenarios:
            started = time.perf_counter()
            try:
                out = self.regenerate(profile, [scenario])[scenario.id]
            except BaseException as e:  # noqa: BLE001 - its check regenerates it in the foreground
                futures[scenario.id].set_exception(e)
                continue
            finally:
                clock.add_beside(oracle_phase(profile.planned(scenario).oracle), time.perf_counter() - started)
            with self._lock:
                if isinstance(out, HarnessError):
                    self.errors[(profile.name, scenario.id)] = out
                else:
                    self.done[(profile.name, scenario.id)] = out
            futures[scenario.id].set_result(None)


def _full(golden: ScenarioRecord, logits, arrays, label: str) -> ScenarioRecord:
    full = dataclasses.replace(golden, logits=logits, arrays=arrays, compact=None, array_digests={})
    full.validate(f"full golden {label}")
    return full
