"""The records interface (docs/records.md, harness/records_schema.py): real records pass, and a
wrong field is an error naming exactly that field, the first one in the documented order.

The valid records are real ones: tracked goldens' `record`s, and generator outputs rebuilt
from them (the meta a generator writes: no scenario_id or mode, its own notes beside).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import RecordError
from harness.goldens.store import GoldenStore
from harness.paths import REPO_ROOT
from harness.records import ScenarioRecord, read_generator_output
from harness.records_schema import EXTRA_KEYS, RECORD_FIELDS, RECORDS_VERSION, Rule, check_meta, check_result

GOLDENS = REPO_ROOT / "goldens"


def _manifests() -> list[Path]:
    return sorted(p for p in GOLDENS.glob("*/*/*.json") if "record" in json.loads(p.read_text()))


def _record(profile: str, scenario: str, key_part: str = "mlx") -> dict[str, Any]:
    """A tracked golden's record meta (the first key folder whose name holds `key_part`)."""
    paths = sorted(p for p in GOLDENS.glob(f"{profile}/*/{scenario}.json") if key_part in p.parent.name)
    assert paths, f"no tracked golden {profile}/{scenario} under a {key_part} key"
    return json.loads(paths[0].read_text())["record"]


@pytest.fixture
def llm() -> dict[str, Any]:
    """A draft scenario: named arrays, step_info with draft caches, stream_text."""
    return _record("smollm2-135m", "spec-self-k2")


@pytest.fixture
def speech() -> dict[str, Any]:
    """Two decode calls (two windows) and a transcript."""
    return _record("whisper-tiny-en", "long-two-windows")


def _fails(meta: dict[str, Any], where: str = "oracle output fox") -> str:
    with pytest.raises(RecordError) as e:
        check_meta(meta, where)
    return str(e.value)


# -- real records pass -----------------------------------------------------------------------


def test_every_tracked_golden_record_passes_and_loads_through_the_store(tmp_path: Path) -> None:
    manifests = _manifests()
    kinds = set()
    for path in manifests:
        manifest = json.loads(path.read_text())
        check_meta(manifest["record"], str(path))
        store = GoldenStore(GOLDENS, tmp_path / "blobs", path.parent.name)  # no blobs: compact goldens load
        golden = store.load(manifest["profile"], manifest["scenario"])
        assert golden.record.tokens == manifest["record"]["tokens"]
        kinds.add("speech" if "decode_calls" in manifest["record"] else "llm")
    assert len(manifests) > 50 and kinds == {"llm", "speech"}


def test_segment_kinds_and_extras_are_all_among_the_tracked_records() -> None:
    """The perturbations below act on real instances of every optional field."""
    seen = {key for path in _manifests() for key in json.loads(path.read_text())["record"]}
    assert set(EXTRA_KEYS) | {"arrays"} <= seen


def test_a_generator_output_rebuilt_from_goldens_is_read_back(tmp_path: Path, llm, speech) -> None:
    notes = {"logits_dtype": "float32", "prefill_calls": 1, "cache_types": ["KVCache"], "options": {"fp16": False}}
    _write_output(tmp_path, {"llm": _as_generated(llm) | notes, "speech": _as_generated(speech) | notes})
    result, records, errors = read_generator_output(tmp_path)
    assert errors == {} and sorted(records) == ["llm", "speech"]
    assert records["llm"].tokens == llm["tokens"] and records["llm"].extra["step_info"] == llm["step_info"]
    assert records["speech"].extra["decode_calls"] == speech["decode_calls"]
    assert records["speech"].mode == "free" and records["speech"].scenario_id == "speech"
    assert not set(notes) & set(records["llm"].extra)  # generator notes never reach the record
    assert records["llm"].meta() == llm | {"scenario_id": "llm"}


# -- a wrong field is named, with what was expected ------------------------------------------


def test_a_string_token_is_named_with_its_index(llm) -> None:
    llm["tokens"][3] = "12"
    assert _fails(llm) == "oracle output fox: tokens[3]: expected an int token id, got '12'"


def test_a_bool_is_not_a_token(llm) -> None:
    llm["prompt_ids"][0] = True
    assert _fails(llm) == "oracle output fox: prompt_ids[0]: expected an int token id, got True"


def test_a_missing_required_key_is_named(speech) -> None:
    del speech["eos_ids"]
    assert _fails(speech) == (
        "oracle output fox: eos_ids: expected a list of int token ids, got nothing (the key is missing)"
    )


def test_a_negative_count_in_a_decode_call_is_named(speech) -> None:
    speech["decode_calls"][1]["n_steps"] = -1
    assert _fails(speech) == "oracle output fox: decode_calls[1].n_steps: expected a non-negative int, got -1"


def test_a_wrong_type_deep_in_the_transcript_is_named(speech) -> None:
    speech["transcript"]["segments"][1]["tokens"][0] = 2.5
    assert _fails(speech) == "oracle output fox: transcript.segments[1].tokens[0]: expected an int token id, got 2.5"


def test_a_draft_cache_hash_that_is_not_hex_is_named(llm) -> None:
    i = next(i for i, step in enumerate(llm["step_info"]) if "draft_cache" in step)
    llm["step_info"][i]["draft_cache"][0]["sha256"] = "xyz"
    assert _fails(llm) == (
        f"oracle output fox: step_info[{i}].draft_cache[0].sha256: expected 64 lowercase hex digits or null, got 'xyz'"
    )


def test_a_segment_that_does_not_start_where_the_last_ended_is_named(speech) -> None:
    end = speech["decode_calls"][0]["n_steps"] * speech["decode_calls"][0]["batch"]
    speech["decode_calls"][1]["row_offset"] = end + 1
    assert _fails(speech) == (
        f"oracle output fox: decode_calls[1].row_offset: expected {end} (where decode call 0 ends), got {end + 1}"
    )


def test_segments_that_do_not_cover_the_tokens_are_named(speech) -> None:
    n = len(speech["tokens"])
    speech["tokens"].append(speech["tokens"][-1])
    assert _fails(speech) == (
        f"oracle output fox: decode_calls: expected segments covering the {n + 1} tokens, "
        f"got segments covering {n} rows"
    )


def test_member_tokens_must_match_the_batch() -> None:
    beam = _record("whisper-tiny-en", "fox-beam5", key_part="torch")
    assert beam["decode_calls"][0]["batch"] == 5
    beam["decode_calls"][0]["member_tokens"].pop()
    assert re.fullmatch(
        r"oracle output fox: decode_calls\[0\]\.member_tokens: expected one list per batch member \(5\), got .*",
        _fails(beam),
    )


def test_step_info_must_have_one_entry_per_token(llm) -> None:
    llm["step_info"].pop()
    n = len(llm["tokens"])
    assert _fails(llm) == f"oracle output fox: step_info: expected one entry per token ({n}), got {n - 1} entries"


def test_stream_text_must_have_one_entry_per_turn() -> None:
    turns = _record("llama-spm-mini", "turns-first-space")
    assert len(turns["turns"]) == len(turns["stream_text"]) > 1
    turns["stream_text"].pop()
    n = len(turns["turns"])
    assert _fails(turns) == f"oracle output fox: stream_text: expected one entry per segment ({n}), got {n - 1} entries"


def test_a_second_segment_list_is_refused() -> None:
    turns = _record("llama-spm-mini", "turns-first-space")
    turns["rows"] = copy.deepcopy(turns["turns"])
    assert _fails(turns) == (
        "oracle output fox: rows: expected to be absent (the record's segments are its turns), "
        "got a second segment list"
    )


def test_an_unknown_mode_and_a_bad_array_name_are_named(llm) -> None:
    bad = llm | {"mode": "forced"}
    assert _fails(bad) == "oracle output fox: mode: expected 'free' or 'teacher_forced', got 'forced'"
    bad = llm | {"arrays": ["verify_logits", "verify_logits"]}
    assert _fails(bad) == (
        "oracle output fox: arrays[1]: expected a tensor name not listed before it, got 'verify_logits'"
    )
    bad = llm | {"arrays": ["../logits"]}
    assert _fails(bad).startswith("oracle output fox: arrays[0]: expected a tensor name (letters, digits, _ or -;")


def test_a_server_response_field_is_named() -> None:
    meta = _record("minicpm5-2b-mini", "response-split")
    assert meta["server_response"]["forced"]
    meta["server_response"]["forced"][0]["ids"][0] = "x"
    assert _fails(meta) == "oracle output fox: server_response.forced[0].ids[0]: expected an int token id, got 'x'"


def test_the_first_wrong_field_in_documented_order_is_the_one_named(speech) -> None:
    speech["transcript"]["language"] = None  # later in the order
    speech["decode_calls"][0]["needs_fallback"] = 0  # earlier: a decode call comes before the transcript
    del speech["eos_ids"]  # earlier still
    speech["tokens"][0] = False  # the first
    assert _fails(speech) == "oracle output fox: tokens[0]: expected an int token id, got False"
    speech["tokens"][0] = 1
    assert "eos_ids: expected" in _fails(speech)
    speech["eos_ids"] = [50256]
    assert _fails(speech) == "oracle output fox: decode_calls[0].needs_fallback: expected true or false, got 0"
    speech["decode_calls"][0]["needs_fallback"] = False
    assert _fails(speech) == "oracle output fox: transcript.language: expected a string, got None"


def test_keys_the_interface_does_not_name_are_accepted(llm, speech) -> None:
    check_meta(llm | {"prefill_calls": 3, "something_new": {"x": 1}}, "oracle output fox")
    speech["decode_calls"][0]["fast_filters"] = {"suppress": []}
    speech["decode_calls"][0]["not_documented"] = 1
    check_meta(speech, "oracle output fox")
    speech["decode_calls"][0]["fast_filters"] = []
    assert _fails(speech) == "oracle output fox: decode_calls[0].fast_filters: expected a JSON object, got []"


def test_from_meta_checks_before_it_coerces(llm) -> None:
    """The old path coerced "12" into 12 silently; now the field is named."""
    llm["tokens"][3] = "12"
    with pytest.raises(RecordError, match=r"^golden x: tokens\[3\]: expected an int token id, got '12'$"):
        ScenarioRecord.from_meta(llm, np.zeros((len(llm["tokens"]), 4), np.float32), "golden x")


def test_a_golden_manifest_with_a_wrong_record_field_is_refused_by_the_store(tmp_path: Path) -> None:
    source = next(p for p in _manifests() if p.parent.parent.name == "smollm2-135m" and p.stem == "plain")
    manifest = json.loads(source.read_text())
    manifest["record"]["eos_ids"] = ["2"]
    target = tmp_path / "goldens" / "smollm2-135m" / source.parent.name / "plain.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(manifest))
    store = GoldenStore(tmp_path / "goldens", tmp_path / "blobs", source.parent.name)
    with pytest.raises(RecordError) as e:
        store.load("smollm2-135m", "plain")
    assert str(e.value) == f"{target}: eos_ids[0]: expected an int token id, got '2'"


# -- result.json and its version --------------------------------------------------------------


def _as_generated(record: dict[str, Any]) -> dict[str, Any]:
    """A golden's record as a generator writes it: the id is the scenarios key, no mode."""
    return {k: v for k, v in copy.deepcopy(record).items() if k not in ("scenario_id", "mode")}


def _write_output(out: Path, scenarios: dict[str, Any], **top: Any) -> Path:
    for sid, meta in scenarios.items():
        if "error" in meta:
            continue
        width = max(meta["tokens"], default=0) + 1  # as wide as the vocabulary the ids come from
        np.save(out / f"{sid}.logits.npy", np.zeros((len(meta["tokens"]), width), np.float32))
        for name in meta.get("arrays", []):
            np.save(out / f"{sid}.{name}.npy", np.zeros((2, 3), np.float32))
    result = {"scenarios": scenarios, "environment": {"mlx": "0.32.4"}} | top
    (out / "result.json").write_text(json.dumps(result))
    return out / "result.json"


@pytest.mark.parametrize("version", [None, RECORDS_VERSION])
def test_records_version_absent_or_1_is_read(tmp_path: Path, llm, version) -> None:
    top = {} if version is None else {"records_version": version}
    _write_output(tmp_path, {"fox": _as_generated(llm)}, **top)
    _, records, _ = read_generator_output(tmp_path)
    assert records["fox"].tokens == llm["tokens"]


@pytest.mark.parametrize(("version", "shown"), [(2, "2"), ("1", "'1'"), (True, "True"), (0, "0")])
def test_any_other_records_version_is_refused_naming_the_supported_one(tmp_path: Path, llm, version, shown) -> None:
    path = _write_output(tmp_path, {"fox": _as_generated(llm)}, records_version=version)
    with pytest.raises(RecordError) as e:
        read_generator_output(tmp_path)
    assert str(e.value) == (
        f"{path}: records_version: expected 1 (the records version this harness reads; absent means 1), got {shown}"
    )


def test_a_wrong_record_in_a_generator_output_names_the_scenario_and_field(tmp_path: Path, speech) -> None:
    meta = _as_generated(speech)
    meta["decode_calls"][1]["n_steps"] = -1
    _write_output(tmp_path, {"long": meta})
    with pytest.raises(RecordError) as e:
        read_generator_output(tmp_path)
    assert str(e.value) == "oracle output long: decode_calls[1].n_steps: expected a non-negative int, got -1"


def test_error_entries_and_the_result_keys(tmp_path: Path, llm) -> None:
    _write_output(tmp_path, {"fox": _as_generated(llm), "bad": {"error": "ValueError: no"}})
    _, records, errors = read_generator_output(tmp_path)
    assert sorted(records) == ["fox"] and errors == {"bad": "ValueError: no"}
    with pytest.raises(RecordError, match=r"^r: scenarios\['bad'\]\.error: expected a string \(the oracle's message\)"):
        check_result({"scenarios": {"bad": {"error": 3}}, "environment": {}}, "r")
    with pytest.raises(RecordError) as e:
        check_result({"scenarios": {}}, "r")
    assert str(e.value) == "r: environment: expected a JSON object (the oracle's versions and device), got None"
    with pytest.raises(RecordError) as e:
        check_result({"scenarios": [], "environment": {}}, "r")
    assert str(e.value) == "r: scenarios: expected a JSON object of records by scenario id, got []"


# -- the page and the checker say the same ------------------------------------------------------


def _field_names(fields: tuple[tuple[str, Rule, bool], ...]) -> set[str]:
    names = set()
    for name, rule, _ in fields:
        names.add(name)
        while rule.item is not None:
            rule = rule.item
        if rule.fields is not None:
            names |= _field_names(rule.fields)
    return names


def test_every_checked_field_is_documented() -> None:
    page = (REPO_ROOT / "docs" / "records.md").read_text()
    names = _field_names(RECORD_FIELDS)
    assert {"member_tokens", "draft_cache", "pieces", "initial_state"} <= names  # the walk reaches nested fields
    undocumented = sorted(n for n in names if f"`{n}`" not in page)
    assert not undocumented, f"fields checked but not named in docs/records.md: {undocumented}"
    assert '"records_version": 1' in page and f"version {RECORDS_VERSION}" in page
