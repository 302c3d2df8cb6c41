"""Every field an oracle writes is compared or listed as deliberately ignored (issue 53 part 4,
harness/records_fields.py): an unlisted field in an oracle's output is refused by name, a listed
one is read past, an implementation's process may carry notes of its own, and the list holds
only fields some generator writes, each with a reason and each named in docs/records.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import RecordError
from harness.paths import REPO_ROOT
from harness.records import read_generator_output
from harness.records_fields import IGNORED_FIELDS, RECORD_FIELD_NAMES, unlisted_fields

GOLDEN = REPO_ROOT / "goldens" / "smollm2-135m"


def _generated() -> dict[str, Any]:
    """A tracked golden's record as a generator writes it (the id is the key, no mode)."""
    path = sorted(GOLDEN.glob("*mlx*/plain.json"))[0]
    record = json.loads(path.read_text())["record"]
    return {k: v for k, v in record.items() if k not in ("scenario_id", "mode")}


def _write(out: Path, meta: dict[str, Any], width: int = 50_000) -> None:
    np.save(out / "s.logits.npy", np.zeros((len(meta["tokens"]), width), np.float32))
    (out / "result.json").write_text(json.dumps({"scenarios": {"s": meta}, "environment": {}}))


def test_an_unlisted_field_from_an_oracle_is_refused_by_name(tmp_path: Path) -> None:
    _write(tmp_path, _generated() | {"prefill_calls": 1, "beam_candidates": [[1, 2]], "zz_note": 0})
    with pytest.raises(RecordError) as e:
        read_generator_output(tmp_path)
    message = str(e.value)
    assert "oracle output s" in message and "'beam_candidates', 'zz_note'" in message
    assert "prefill_calls" not in message and "IGNORED_FIELDS" in message


def test_every_listed_field_is_read_past_and_never_reaches_the_record(tmp_path: Path) -> None:
    _write(tmp_path, _generated() | {name: None for name in IGNORED_FIELDS})
    _, records, _ = read_generator_output(tmp_path)
    assert not set(IGNORED_FIELDS) & set(records["s"].meta())


def test_an_implementations_process_may_carry_notes_of_its_own(tmp_path: Path) -> None:
    _write(tmp_path, _generated() | {"my_timing_ms": 3.5})
    _, records, _ = read_generator_output(tmp_path, oracle=False)
    assert records["s"].tokens == _generated()["tokens"]


def test_the_records_own_fields_are_never_unlisted() -> None:
    assert unlisted_fields({name: None for name in RECORD_FIELD_NAMES}) == []
    assert not RECORD_FIELD_NAMES & set(IGNORED_FIELDS)


@pytest.mark.parametrize("name", sorted(IGNORED_FIELDS))
def test_each_ignored_field_is_written_by_a_generator_explained_and_documented(name: str) -> None:
    sources = "".join(p.read_text() for p in (REPO_ROOT / "oracles").rglob("*.py"))
    assert f'"{name}"' in sources, f"{name} is listed as ignored but no generator writes it: a stale entry"
    assert len(IGNORED_FIELDS[name].split()) >= 8, f"{name}: a reason says where what it tells is judged"
    assert f"`{name}`" in (REPO_ROOT / "docs" / "records.md").read_text()


def test_a_wrong_record_from_an_implementations_process_blames_the_implementation(tmp_path: Path) -> None:
    """Hostile probe 2, L4: a plug-in's malformed record was worded "oracle output ...\""""
    meta = _generated()
    meta["tokens"][0] = "12"
    _write(tmp_path, meta)
    with pytest.raises(RecordError, match=r"^implementation output s: tokens\[0\]: expected an int token id"):
        read_generator_output(tmp_path, oracle=False)
    with pytest.raises(RecordError, match=r"^oracle output s: tokens\[0\]"):
        read_generator_output(tmp_path)


def test_a_token_id_past_the_vocabulary_is_refused_by_name(tmp_path: Path) -> None:
    """Hostile probe 2, L5: ids >= the vocabulary ended in a raw IndexError inside a check."""
    meta = _generated()
    meta["tokens"][2] = 50_000  # the written logits are 50,000 wide
    _write(tmp_path, meta)
    with pytest.raises(RecordError, match=r"implementation output s: tokens\[2\]: expected a token id below .* 50000 "):
        read_generator_output(tmp_path, oracle=False)
