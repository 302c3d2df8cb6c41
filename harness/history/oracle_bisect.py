"""`python -m harness bisect --model M --check SCENARIO[/CHECK] --oracle-versions mlx-lm=A..B`:
the first release of an oracle's library that changed the bits of a scenario.

The released versions between A and B come from the package index. Each one the search needs
gets a venv of its own (the oracle's pins with only that distribution's version changed, built
like every oracle venv and kept in the cache) and runs the oracle's own generator on the
scenario against this checkout's artifact. The search is a bisection for the first release
whose logits differ from A's in any bit (it assumes one change point; each release it looked
at is listed with its bits, so a second change would show); the change is then explained step
by step against the release before it: elements that differ, max ULP, KL(before‖after).
A release that cannot be installed with the other pins, or whose generator fails, is named
and left out.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import HarnessError, UsageError


@dataclass
class Release:
    version: str
    logits: np.ndarray | None = None
    tokens: list[int] | None = None
    error: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.logits.tobytes()).hexdigest()[:16] if self.logits is not None else "-"


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", version))


def parse_range(text: str) -> tuple[str, str, str]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)=([^.]+(?:\.[^.]+)*?)\.\.(.+)", text)
    if not match:
        raise UsageError(f"--oracle-versions {text!r}: expected DIST=FIRST..LAST, e.g. mlx-lm=0.32.0..0.32.2")
    return match.group(1), match.group(2), match.group(3)


def between(released: list[str], first: str, last: str) -> list[str]:
    """The released versions from `first` to `last`, oldest first (both must be releases)."""
    for v in (first, last):
        if v not in released:
            raise UsageError(f"{v} is not a released version (the index has {', '.join(sorted(released, key=_key))})")
    lo, hi = _key(first), _key(last)
    return sorted((v for v in released if lo <= _key(v) <= hi), key=_key)


def first_change(versions: list[str], same_as_first: Any) -> int | None:
    """Index of the first version whose bits differ from versions[0]'s (bisection; None: none
    does). `same_as_first(i)` is True, False, or None when version i cannot be judged (its
    neighbours are tried instead)."""
    lo, hi = 0, len(versions) - 1
    while same_as_first(hi) is None and hi > lo:
        hi -= 1
    if hi == lo or same_as_first(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe = mid
        while same_as_first(probe) is None and probe < hi - 1:
            probe += 1
        verdict = same_as_first(probe)
        if verdict is None:  # everything between lo and hi is unjudgeable
            return hi
        lo, hi = (probe, hi) if verdict else (lo, probe)
    return hi


def explain(before: Release, after: Release) -> list[str]:
    from harness.checks.compare import agreement, diff_vectors

    lines = []
    if before.tokens != after.tokens:
        step = next((i for i, (a, b) in enumerate(zip(before.tokens, after.tokens, strict=False)) if a != b), None)
        lines.append(f"tokens differ from step {step}")
    assert before.logits is not None and after.logits is not None
    if before.logits.shape != after.logits.shape:
        return lines + [f"logits shape {before.logits.shape} -> {after.logits.shape}"]
    for step in range(before.logits.shape[0]):
        diff = diff_vectors(before.logits[step], after.logits[step])
        if diff.equal:
            continue
        kl = agreement(before.logits[step], after.logits[step], diff).get("kl")
        lines.append(
            f"step {step}: {diff.n_differing}/{diff.n_elements} elements differ, max ULP {diff.max_ulp}, "
            f"max |diff| {diff.max_abs_diff:.3g}, KL {kl:.3g}"
        )
    return lines


def release_runner(oracle: str, dist: str, version: str) -> Any:
    """The oracle's generator in a venv with `dist` at `version` (harness/oracle/venvs.py release_env)."""
    from harness.oracle.venvs import release_env
    from harness.runners.oracle import OracleRunner

    runner = OracleRunner(oracle)
    runner.process._env = release_env(oracle, dist, version)
    return runner


def run(args: argparse.Namespace) -> int:
    from harness.oracle.venvs import index_versions
    from harness.session import ParitySession

    dist, first, last = parse_range(args.oracle_versions)
    session = ParitySession()
    profile = session.profile(args.model)
    scenario = profile.scenario(args.check.split("/")[0])
    oracle = profile.planned(scenario).oracle
    versions = between(index_versions(dist), first, last)
    if len(versions) < 2:
        raise UsageError(f"{dist} {first}..{last} holds {len(versions)} release(s): nothing to bisect")
    from harness.goldens.specs import oracle_spec

    spec = oracle_spec(profile, scenario)
    model_dir = session.artifact(profile).model_dir
    releases: dict[int, Release] = {}

    def release(i: int) -> Release:
        if i not in releases:
            got = Release(versions[i])
            try:
                _, records, errors = release_runner(oracle, dist, versions[i]).run(model_dir, [spec])
                if spec["id"] in errors:
                    got.error = errors[spec["id"]]
                else:
                    got.logits, got.tokens = records[spec["id"]].logits, records[spec["id"]].tokens
            except HarnessError as e:
                got.error = str(e).splitlines()[0]
            releases[i] = got
            print(f"  {dist} {got.version}: {got.error or 'logits ' + got.digest}", flush=True)
        return releases[i]

    def same_as_first(i: int) -> bool | None:
        base, other = release(0), release(i)
        if base.logits is None:
            raise HarnessError(f"{dist} {versions[0]} cannot make the scenario: {base.error}")
        if other.logits is None:
            return None
        return base.logits.shape == other.logits.shape and base.logits.tobytes() == other.logits.tobytes()

    print(f"bisecting {dist} {', '.join(versions)} on {profile.name}/{scenario.id} ({oracle}'s generator):")
    if args.every_release:  # each release looked at, not a bisection's few
        index = next((i for i in range(1, len(versions)) if same_as_first(i) is False), None)
        for i in range(len(versions)):
            release(i)
    else:
        index = first_change(versions, same_as_first)
    if index is None:
        print(f"no release in {first}..{last} changed the bits of {profile.name}/{scenario.id}")
        return 0
    before = max((i for i in releases if i < index and releases[i].logits is not None), default=0)
    if before != index - 1:
        release(index - 1)
        before = index - 1 if releases[index - 1].logits is not None else before
    print(f"first release that changed the bits: {dist} {versions[index]} (against {versions[before]}):")
    for line in explain(releases[before], releases[index]):
        print(f"  {line}")
    return 0
