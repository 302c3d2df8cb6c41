"""L2 budget calibration: counting, near-tie explanation, refusal of non-benign changes, recording."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.checks.token_budget import token_differences
from harness.errors import HarnessError
from harness.paths import REPO_ROOT
from harness.profile.load import load_profile
from harness.tools.calibrate import first_divergences, max_logit_diff, summarize, write_budget


def test_differing_tokens_counts_each_changed_run_once_by_its_longer_side() -> None:
    """The one count the gate and make calibrate share."""

    def differing(a: list[int], b: list[int]) -> int:
        return token_differences(a, b)[0]

    assert differing([1, 2, 3], [1, 2, 3]) == 0
    assert differing([1, 2, 3, 4], [1, 9, 3, 4]) == 1  # one flip
    assert differing([1, 2, 3], [1, 2, 7, 3]) == 1  # one insertion ("dog" -> "dog.")
    assert differing([1, 2, 3, 4], [1, 8, 9, 4]) == 2
    assert differing([], [5, 6]) == 2


def _call(chosen: list[int], offset: int = 0) -> dict:
    return {"chosen": chosen, "row_offset": offset, "tokens": chosen, "temperature": 0.0}


def test_a_flip_within_the_logit_error_is_a_near_tie_and_a_wide_one_is_not() -> None:
    ref = np.zeros((2, 4), np.float32)
    ref[0, 1], ref[1, 2], ref[1, 3] = 5.0, 1.00, 0.99  # step 1: token 2 by a 0.01 gap over token 3
    var = ref.copy()
    var[1, 3] += 0.02  # a change that moves token 3 by 0.02: enough to flip a 0.01 gap
    d = first_divergences([_call([1, 2])], ref, [_call([1, 3])], var)
    assert d == [
        {
            "decode_call": 0,
            "step": 1,
            "reference_token": 2,
            "variant_token": 3,
            "reference_gap": pytest.approx(0.01, abs=1e-6),
            "logit_error": pytest.approx(0.02, abs=1e-6),
            "near_tie": True,
        }
    ]
    wide = ref.copy()
    wide[1, 2] = 9.0  # the reference prefers token 2 by 8: an error of 0.02 cannot flip that
    var_wide = wide.copy()
    var_wide[1, 3] += 0.02
    (d,) = first_divergences([_call([1, 2])], wide, [_call([1, 3])], var_wide)
    assert not d["near_tie"]
    assert max_logit_diff([_call([1, 2])], wide, [_call([1, 3])], var_wide) == pytest.approx(0.02, abs=1e-6)


def test_summary_derives_the_budget_and_refuses_unexplained_flips(tmp_path: Path) -> None:
    ref = np.zeros((2, 4), np.float32)
    ref[0, 1], ref[1, 2], ref[1, 3] = 5.0, 1.0, 0.99
    tie = ref.copy()
    tie[1, 3] += 0.02
    np.save(tmp_path / "a.reference.npy", ref)
    np.save(tmp_path / "a.batch2.npy", tie)

    def run(chosen: list[int]) -> dict:
        return {"decode_calls": [_call(chosen)], "transcript": {"text": "", "segments": [{"tokens": chosen}]}}

    result = {"clips": {"a": {"reference": run([1, 2]), "batch2": run([1, 3])}}}
    summary = summarize(result, tmp_path, ["batch2"])
    assert summary["budget"] == 1 and summary["unexplained"] == []
    np.save(tmp_path / "a.batch2.npy", ref)  # same logits, other token: not a logit error (not benign)
    summary = summarize(result, tmp_path, ["batch2"])
    assert summary["unexplained"] and "batch2/a decode call 0 step" in summary["unexplained"][0]


def test_write_budget_rewrites_the_budget_line_and_keeps_a_valid_profile(tmp_path: Path) -> None:
    source = REPO_ROOT / "profiles" / "whisper-tiny-en.yaml"
    data = yaml.safe_load(source.read_text())
    assert any((s.get("composition") or {}).get("kind") == "whisper-fast" for s in data["scenarios"])
    shutil.copy(source, tmp_path / source.name)
    profile = load_profile(tmp_path / source.name)
    assert write_budget(profile, 3) >= 1
    written = load_profile(tmp_path / source.name)
    budgets = [s.composition["budget"] for s in written.scenarios if written.intree_composition(s)]
    assert budgets and all(b == {"max_differing_tokens": 3} for b in budgets)
    # A profile whose budget is not one flow-mapping line is refused, not half rewritten.
    text = (tmp_path / source.name).read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("budget: {"))
    indent = line[: len(line) - len(line.lstrip())]
    block = f"{indent}budget:\n{indent}  max_differing_tokens: 3"
    (tmp_path / source.name).write_text(text.replace(line, block, 1))
    with pytest.raises(HarnessError, match="one-line"):
        write_budget(load_profile(tmp_path / source.name), 1)
    assert json.dumps(load_profile(tmp_path / source.name).name) == '"whisper-tiny-en"'


def test_paths_outside_the_repository_are_shown_whole(tmp_path) -> None:
    """calibrate --write printed each record relative to the repository and crashed, after
    writing it, when MLX_PARITY_GOLDENS put the goldens elsewhere (the budgets then unwritten)."""
    from harness.paths import REPO_ROOT, shown

    assert shown(REPO_ROOT / "goldens" / "x.json") == "goldens/x.json"
    assert shown(tmp_path / "x.json") == str(tmp_path / "x.json")
