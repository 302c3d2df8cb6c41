"""`python -m harness quality` end to end on real weights (SmolLM2) and the MiniCPM5 mini twin:
the oracle in its venv, the in-tree cross-check equal bit for bit, the cache serving a second
run and mending a corrupt entry, a perturbed in-tree model caught as a parity failure (exit 1),
bad input refused with nothing written. Windows are cut short (the CPU's quantized matmul costs
~0.1 s per token): what is proven is the path, not the figures."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main as harness_main
from harness.errors import ArtifactError
from harness.paths import REPO_ROOT
from harness.profile.load import find_profile
from harness.quality import cli, store
from harness.quality.run import measure_pair
from harness.quality.sides import ResolvedSide, check_pair_sides

pytestmark = pytest.mark.slow


def _copy_profile(root: Path, source: str, name: str, corpus: str, pairs: list[str] | None = None) -> None:
    text = (REPO_ROOT / "profiles" / f"{source}.yaml").read_text()
    head, _, quality = text.partition("\nquality:\n")
    lines = quality.splitlines()
    kept = [f"  corpus: {corpus}"]
    keep_pair = True
    for line in lines[1:]:  # the shipped corpus line is replaced
        if line.startswith("    - id: "):
            keep_pair = pairs is None or line.split(": ", 1)[1] in pairs
        if keep_pair:
            kept.append(line)
    head = head.replace(f"name: {source}\n", f"name: {name}\n", 1)
    (root / "profiles" / f"{name}.yaml").write_text(head + "\nquality:\n" + "\n".join(kept) + "\n")


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profiles, reports and quality results in a temporary tree; venvs and artifacts shared."""
    for sub in ("profiles", "reports", "results"):
        (tmp_path / sub).mkdir()
    monkeypatch.setenv("MLX_PARITY_PROFILES", str(tmp_path / "profiles"))
    monkeypatch.setenv("MLX_PARITY_REPORTS", str(tmp_path / "reports"))
    monkeypatch.setenv("MLX_PARITY_QUIET", "1")
    monkeypatch.setattr(store, "results_dir", lambda: tmp_path / "results")
    return tmp_path


def _report(tree: Path, n: int) -> dict:
    reports = sorted((tree / "reports").glob("quality-*/quality.json"), key=lambda p: p.stat().st_mtime_ns)
    assert len(reports) == n
    return json.loads(reports[-1].read_text())


SMOL_CORPUS = "{path: fixtures/corpus/kjv-genesis-1-12.txt, context: 16, stride: 16, chunk: 4, max_windows: 1}"


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
def test_smollm2_kv8_measured_cached_and_mended(tree: Path) -> None:
    _copy_profile(tree, "smollm2-135m", "q-smol", SMOL_CORPUS, pairs=["kv8-g64"])
    assert harness_main(["quality", "--model", "q-smol"]) == 0
    first = _report(tree, 1)
    (pair,) = first["pairs"]
    assert pair["source"] == "computed" and pair["ran"] == "real"
    assert pair["cross_check"]["status"] == "equal", pair["cross_check"]
    assert pair["summary"]["positions"] == 15 and pair["summary"]["quantized_positions"] == 11
    assert pair["quality"]["status"] in ("PASS", "FAIL")  # the profile states thresholds for kv8
    (html,) = (tree / "reports").glob("quality-*/index.html")
    assert "KL" in html.read_text() and "data:image/png;base64," in html.read_text()

    assert harness_main(["quality", "--model", "q-smol"]) == 0  # served from the cache, the same figures
    second = _report(tree, 2)
    assert second["pairs"][0]["source"] == "cached"
    assert second["pairs"][0]["summary"] == pair["summary"]

    (entry,) = (tree / "results").iterdir()
    np.save(entry / "kl.npy", np.zeros((1, 15), np.float32))  # corrupt: its sha256 is not the recorded one
    assert harness_main(["quality", "--model", "q-smol"]) == 0
    third = _report(tree, 3)["pairs"][0]
    assert third["source"].startswith("recomputed: corrupt cache entry") and "kl: sha256" in third["source"]
    assert third["summary"] == pair["summary"]


def test_a_perturbed_intree_model_is_a_parity_failure(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy_profile(tree, "smollm2-135m", "q-smol", SMOL_CORPUS, pairs=["kv8-g64"])

    def perturb(model) -> None:  # the final norm's first weight, a little off
        w = model.model.norm.weight
        model.model.norm.weight = w.at[0].add(1e-3)

    monkeypatch.setattr(cli, "measure_pair", functools.partial(measure_pair, model_hook=perturb))
    assert harness_main(["quality", "--model", "q-smol"]) == 1
    (pair,) = _report(tree, 1)["pairs"]
    assert pair["cross_check"]["status"] == "differs"
    assert "window 0: candidate logits sha256" in pair["cross_check"]["detail"]
    assert "position 0" in pair["cross_check"]["detail"]
    (entry,) = (tree / "results").iterdir()
    assert not list(entry.glob("crosscheck-*.json"))  # a perturbed run's cross-check is never cached


def test_minicpm5_mini_twin_pair(tree: Path) -> None:
    corpus = "{path: fixtures/corpus/kjv-genesis-1-12.txt, context: 16, stride: 16, max_windows: 1}"
    _copy_profile(tree, "minicpm5-2b-mini", "q-mini", corpus)
    assert harness_main(["quality", "--model", "q-mini"]) == 0
    (pair,) = _report(tree, 1)["pairs"]
    assert pair["ran"] == "twin" and pair["control"]["identity"]["source"] == "twin"
    assert pair["cross_check"]["status"] == "equal", pair["cross_check"]
    assert pair["summary"]["kl"]["mean"]["value"] > 0  # 4-bit against its float draws: a real difference


def test_a_corpus_shorter_than_one_window_is_refused(tree: Path) -> None:
    corpus = "{path: fixtures/corpus/kjv-genesis-1-12.txt, context: 20000, chunk: 64}"
    _copy_profile(tree, "smollm2-135m", "q-smol", corpus, pairs=["kv8-g64"])
    assert harness_main(["quality", "--model", "q-smol"]) == 2
    assert not list((tree / "reports").iterdir()) and not list((tree / "results").iterdir())


def test_pairs_that_cannot_be_compared_are_refused(tmp_path: Path) -> None:
    def side(name: str, vocab: int, tokenizer: str, ran: str, source: str) -> ResolvedSide:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"vocab_size": vocab}))
        return ResolvedSide(d, {"identity": {"source": source}, "tokenizer": tokenizer}, ran, name)

    real = side("real-4bit", 100, "aaaa", "real", "hub")
    with pytest.raises(ArtifactError, match=r"quality.pairs\[0\]: the tokenizers differ: control other .*vocab 200"):
        check_pair_sides("quality.pairs[0]", side("other", 200, "bbbb", "real", "hub"), real)
    with pytest.raises(ArtifactError, match=r"control.twin: the candidate ran the real artifact"):
        check_pair_sides("quality.pairs[0]", side("float-twin", 100, "aaaa", "twin", "twin"), real)
    check_pair_sides("quality.pairs[0]", side("same", 100, "aaaa", "real", "hub"), real)  # comparable


def test_the_shipped_profiles_validate() -> None:
    for name in ("smollm2-135m", "minicpm5-2b", "minicpm5-2b-mini"):
        assert find_profile(name).quality is not None
