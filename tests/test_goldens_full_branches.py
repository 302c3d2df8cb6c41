"""A compact golden's full vectors on demand (harness/goldens/full.py): a full golden is its own
full record, an oracle's refusal or a differing tensor is an OracleError kept per scenario, and
the regeneration beside the in-tree side starts only the scenarios this cache lacks, on one pool,
and is waited for when a profile is released."""

from __future__ import annotations

import concurrent.futures
import shutil
import textwrap
import threading
from pathlib import Path

import pytest

from harness.errors import OracleError
from harness.session import ParitySession
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import FakeOracle, fake_session

# ids of distinct lengths: the fake oracle seeds by it
FOUR = VALID_PROFILE.format(name="tiny").split("scenarios:")[0] + textwrap.dedent(
    """\
    scenarios:
      - {id: a, prompt: "Hello", steps: 3}
      - {id: bb, prompt: "Hello there", steps: 3}
      - {id: ccc, prompt: "Hello again", steps: 3}
      - {id: dddd, prompt: "Hello at last", steps: 3}
    """
)
FULL_PROFILE = VALID_PROFILE.format(name="tiny") + "golden:\n  full_steps: all\n"


class _Refusing(FakeOracle):
    """The fake oracle, which cannot regenerate scenario bb (as an oracle out of memory)."""

    def run(self, model_dir, specs):
        environment, records, errors = super().run(model_dir, specs)
        if records.pop("bb", None) is not None:
            errors["bb"] = "out of memory"
        return environment, records, errors


class _OtherEncoder(FakeOracle):
    """The fake oracle with the same logits but another encoder tensor."""

    def run(self, model_dir, specs):
        environment, records, errors = super().run(model_dir, specs)
        for record in records.values():
            record.arrays["encoder"] = record.arrays["encoder"] + 1
        return environment, records, errors


@pytest.fixture
def clone(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Compact goldens of FOUR as tracked, without any full vector in the cache (a fresh clone),
    and a machine where the oracle may run beside the in-tree side."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test may itself run on a worker
    monkeypatch.setenv("MLX_PARITY_OVERLAP", "1")
    monkeypatch.setattr("harness.goldens.specs.os.cpu_count", lambda: 2)
    write_profile(isolated, text=FOUR)
    fake_session(isolated).goldens(fake_session(isolated).profile("tiny"))
    shutil.rmtree(isolated / "cache" / "blobs")
    return isolated


def _session(root: Path, overlap: bool, oracle=FakeOracle) -> ParitySession:
    session = fake_session(root)
    session.lifecycle.oracle_runner = oracle
    session.lifecycle.overlap_generation = lambda: overlap
    return session


def _pending(session: ParitySession) -> set[str]:
    return {key[1] for key in session.lifecycle.full.pending}


def test_a_full_golden_is_its_own_full_record(isolated: Path) -> None:
    """A format-1 golden already has every vector: get returns its record, the oracle never runs."""
    write_profile(isolated, text=FULL_PROFILE)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    golden = session.goldens(profile)["plain"]
    assert not golden.record.is_compact
    FakeOracle.counter = isolated / "runs.txt"
    try:
        assert session.full_golden(profile, profile.scenario("plain")) is golden.record
        assert not FakeOracle.counter.exists()
    finally:
        FakeOracle.counter = None


def test_a_regenerated_tensor_that_hashes_differently_is_not_reproducible(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same logits, another encoder tensor: an OracleError naming the tensor, nothing kept."""
    monkeypatch.setattr(FakeOracle, "with_arrays", True)
    write_profile(isolated)
    fake_session(isolated).goldens(fake_session(isolated).profile("tiny"))
    shutil.rmtree(isolated / "cache" / "blobs")
    session = _session(isolated, overlap=False, oracle=_OtherEncoder)
    profile = session.profile("tiny")
    with pytest.raises(OracleError, match=r"tiny/plain is not reproducible: regenerated tensor 'encoder' hashes"):
        session.full_golden(profile, profile.scenario("plain"))
    assert not (isolated / "cache" / "blobs" / "full-index").exists()


def test_an_oracle_refusal_beside_is_kept_and_raised_by_its_check(clone: Path) -> None:
    """The background regeneration records the oracle's error for bb; bb's own request raises it
    (not re-run), while the other scenarios' vectors are ready."""
    session = _session(clone, overlap=True, oracle=_Refusing)
    profile = session.profile("tiny")
    assert session.full_golden(profile, profile.scenario("a")).tokens
    assert _pending(session) == {"bb", "ccc", "dddd"}
    concurrent.futures.wait(session.lifecycle.full.pending.values())
    full = session.lifecycle.full
    assert set(full.errors) == {("tiny", "bb")} and {("tiny", "ccc"), ("tiny", "dddd")} <= set(full.done)
    with pytest.raises(OracleError, match=r"tiny/bb: the oracle cannot regenerate: out of memory") as raised:
        session.full_golden(profile, profile.scenario("bb"))
    assert raised.value is full.errors[("tiny", "bb")]


def test_scenarios_whose_vectors_this_cache_holds_are_not_started_beside(clone: Path) -> None:
    """bb's vectors were regenerated by an earlier run: the first failure starts only ccc and dddd."""
    earlier = _session(clone, overlap=False)
    profile = earlier.profile("tiny")
    earlier.full_golden(profile, profile.scenario("bb"))
    session = _session(clone, overlap=True)
    session.full_golden(profile, profile.scenario("a"))
    assert _pending(session) == {"ccc", "dddd"}
    concurrent.futures.wait(session.lifecycle.full.pending.values())


def test_nothing_is_started_beside_when_the_cache_holds_every_other_scenario(clone: Path) -> None:
    """With every other scenario's vectors cached, no pool is made and nothing is pending."""
    earlier = _session(clone, overlap=False)
    profile = earlier.profile("tiny")
    for sid in ("bb", "ccc", "dddd"):
        earlier.full_golden(profile, profile.scenario(sid))
    session = _session(clone, overlap=True)
    assert session.full_golden(profile, profile.scenario("a")).tokens
    assert session.lifecycle.full._pool is None and not session.lifecycle.full.pending


def test_a_later_failure_reuses_the_one_pool(clone: Path) -> None:
    """The second batch started beside (once the selection grew) runs on the pool of the first:
    one oracle beside the in-tree side at a time."""
    session = _session(clone, overlap=True)
    profile = session.profile("tiny")
    session.goldens(profile)
    session.lifecycle.selected_scenarios["tiny"] = {"a", "bb"}
    session.full_golden(profile, profile.scenario("a"))
    pool = session.lifecycle.full._pool
    assert pool is not None and _pending(session) == {"bb"}
    session.lifecycle.selected_scenarios["tiny"] = {"a", "bb", "ccc", "dddd"}
    session.full_golden(profile, profile.scenario("ccc"))
    assert session.lifecycle.full._pool is pool and _pending(session) == {"bb", "dddd"}
    concurrent.futures.wait(session.lifecycle.full.pending.values())


def test_release_waits_for_the_regeneration_beside_then_drops_the_vectors(clone: Path) -> None:
    """Releasing a profile waits for its background regenerations (dddd's is held until a timer
    lets it go), so none lands after its vectors were dropped."""
    gate = threading.Event()

    class _Held(FakeOracle):
        def run(self, model_dir, specs):
            if any(spec["id"] == "dddd" for spec in specs):
                gate.wait(5)
            return super().run(model_dir, specs)

    session = _session(clone, overlap=True, oracle=_Held)
    profile = session.profile("tiny")
    session.full_golden(profile, profile.scenario("a"))
    full = session.lifecycle.full
    futures = list(full.pending.values())
    assert len(futures) == 3 and not all(f.done() for f in futures)
    timer = threading.Timer(0.1, gate.set)
    timer.start()
    session.release("tiny")
    assert gate.is_set() and all(f.done() for f in futures)
    assert not any(key[0] == "tiny" for key in full.done)
