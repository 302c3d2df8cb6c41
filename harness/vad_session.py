"""A VAD profile's session: its weights resolved and its in-tree model loaded once, its goldens
made or read once (a stale one is an error, as everywhere), each fixture judged once by the VAD
judges of harness/checks/vad.py. The pytest items and `python -m harness vad` share it; the
model profiles' session is harness/session.py.
"""

from __future__ import annotations

from typing import Any

from harness.artifacts.vad import resolve_vad_weights
from harness.checks.vad import Check, FixtureVerdict, gate_fixture
from harness.errors import NothingComparedError
from harness.goldens.vad import OracleResult, ensure_goldens
from harness.profile.vad import VadProfile


class VadRun:
    """One VAD profile's run in a parity session: the in-tree model loaded once, the goldens
    made or read once (a stale one is an error, as everywhere), each fixture judged once."""

    def __init__(self, profile: VadProfile, fixtures: list[str], update: bool = False):
        self.profile = profile
        self.fixtures = fixtures  # the fixtures this run judges (their goldens are made together)
        self.update = update  # regenerate the goldens from the package (`make vad ARGS=--update`)
        self._model: Any = None
        self._goldens: dict[str, OracleResult] | None = None
        self._verdicts: dict[str, FixtureVerdict] = {}

    def verdict(self, fixture: str) -> FixtureVerdict:
        """Every check of one fixture, judged once (harness/checks/vad.py `gate_fixture`)."""
        if fixture not in self._verdicts:
            from models.vad import load_model

            if self._model is None:
                self._model = load_model(resolve_vad_weights(self.profile))
            if self._goldens is None:
                wanted = sorted(set(self.fixtures) | {fixture})
                self._goldens = ensure_goldens(self.profile, wanted, update=self.update)
            elif fixture not in self._goldens:
                self._goldens |= ensure_goldens(self.profile, [fixture], update=self.update)
            self._verdicts[fixture] = gate_fixture(self.profile, self._model, self._goldens[fixture])
        return self._verdicts[fixture]

    def check(self, fixture: str, name: str) -> Check:
        verdict = self.verdict(fixture)
        found = next((c for c in verdict.checks if c.name == name), None)
        if found is None:
            failed = next((c for c in verdict.checks if not c.passed), None)
            raise NothingComparedError(
                f"{self.profile.name}/{fixture} {name}: not compared"
                + (f": {failed.name} failed first ({failed.detail})" if failed else "")
            )
        if found.nothing_exercised:
            raise NothingComparedError(found.detail)
        return found
