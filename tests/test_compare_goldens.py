"""tools/compare-goldens.py: what may move when oracle scripts are regenerated, and what may not."""

from __future__ import annotations

import copy
import importlib.util
import math

from harness.paths import REPO_ROOT

_spec = importlib.util.spec_from_file_location("compare_goldens", REPO_ROOT / "tools" / "compare-goldens.py")
assert _spec and _spec.loader
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

MANIFEST = {
    "blobs": {"logits_head": {"sha256": "aa", "shape": [3, 8], "dtype": "float32"}},
    "compact": {"logits": {"row_sha256": ["r0", "r1", "r2"]}},
    "record": {"tokens": [5, 6, 7], "stream_text": ["a", "b"]},
    "provenance": {"oracle": {"name": "mlx-lm", "generator_sha256": "g1", "common_sha256": {"lm_steps": "c1"}}},
    "generated_at": "2026-12-01T00:00:00Z",
    "recorded_on": {"processor": "AMD EPYC"},
}


def _moved(**changes: object) -> dict:
    new = copy.deepcopy(MANIFEST)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = new
        for key in parents:
            node = node[key]
        node[leaf] = value
    return new


def test_script_hashes_and_dates_may_move() -> None:
    new = _moved(generated_at="2026-12-03T00:00:00Z", provenance__oracle__generator_sha256="g2")
    new["provenance"]["oracle"]["common_sha256"] = {"lm_steps": "c2", "oracle_base": "c3"}
    kinds = dict(compare.differences(MANIFEST, new))
    assert kinds == {
        "generated_at": "when",
        "provenance.oracle.generator_sha256": "script",
        "provenance.oracle.common_sha256": "script",
    }


def test_a_row_hash_a_token_or_a_blob_is_bits() -> None:
    row = copy.deepcopy(MANIFEST)
    row["compact"]["logits"]["row_sha256"][1] = "rX"
    token = _moved(record__tokens=[5, 6, 8])
    blob = copy.deepcopy(MANIFEST)
    blob["blobs"]["logits_head"]["sha256"] = "bb"
    longer = _moved(record__stream_text=["a", "b", "c"])
    retyped = _moved(record__tokens=[5.0, 6, 7])
    assert compare.differences(MANIFEST, row) == [("compact.logits.row_sha256[1]", "BITS")]
    assert compare.differences(MANIFEST, token) == [("record.tokens[2]", "BITS")]
    assert compare.differences(MANIFEST, blob) == [("blobs.logits_head.sha256", "BITS")]
    assert compare.differences(MANIFEST, longer) == [("record.stream_text", "BITS")]
    assert compare.differences(MANIFEST, retyped) == [("record.tokens[0]", "BITS")]
    assert compare.differences(MANIFEST, {k: v for k, v in MANIFEST.items() if k != "record"}) == [("record", "BITS")]


def test_a_non_finite_number_is_the_same_whether_written_bare_or_as_text() -> None:
    bare = _moved(record__tokens=[float("-inf"), 1.5])
    assert compare.differences(bare, _moved(record__tokens=["-Infinity", 1.5])) == []
    assert compare.differences(bare, _moved(record__tokens=["Infinity", 1.5])) == [("record.tokens[0]", "BITS")]


def test_a_derived_logsumexp_may_move_one_float64_ulp_and_no_more() -> None:
    """The harness's own float64 summary of a row (numpy's SIMD exp differs between CPUs): one ULP
    is `derived`; two ULPs, a logsumexp elsewhere than a compact golden, or a row hash is BITS."""
    lse = 13.1663612866952
    base = copy.deepcopy(MANIFEST)
    base["compact"]["logits"]["logsumexp"] = [1.5, lse]
    one = copy.deepcopy(base)
    one["compact"]["logits"]["logsumexp"][1] = 13.166361286695198  # H200's Xeon against the EPYC: one ULP
    assert math.nextafter(lse, 0) == 13.166361286695198
    assert compare.differences(base, one) == [("compact.logits.logsumexp[1]", "derived")]
    two = copy.deepcopy(base)
    two["compact"]["logits"]["logsumexp"][1] = math.nextafter(math.nextafter(lse, 0), 0)
    assert compare.differences(base, two) == [("compact.logits.logsumexp[1]", "BITS")]
    elsewhere = _moved(record__tokens=[5, 6, 7.000000000000001])
    assert compare.differences(_moved(record__tokens=[5, 6, 7.0]), elsewhere) == [("record.tokens[2]", "BITS")]
