"""Every field an oracle writes is compared or deliberately ignored (harness/records_fields.py):
a new field is refused by name until a judge compares it or the table says why none does, the
table lists only fields its generators really write, and every field of the tracked goldens is
compared or listed."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import RecordError
from harness.paths import REPO_ROOT
from harness.records import read_generator_output
from harness.records_fields import IGNORED_FIELDS, LEVELS, check_fields, compared, unlisted

GOLDENS = REPO_ROOT / "goldens"


def _records() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(GOLDENS.glob("*/*/*.json")):
        manifest = json.loads(path.read_text())
        if "record" in manifest:
            out.append((path, manifest["record"]))
    return out


def _golden(profile: str, scenario: str, key_part: str) -> dict[str, Any]:
    paths = sorted(p for p in GOLDENS.glob(f"{profile}/*/{scenario}.json") if key_part in p.parent.name)
    assert paths, f"no tracked golden {profile}/{scenario} under a {key_part} key"
    record = json.loads(paths[0].read_text())["record"]
    return {k: v for k, v in copy.deepcopy(record).items() if k not in ("scenario_id", "mode")}


def _write(out: Path, scenarios: dict[str, dict[str, Any]]) -> None:
    for sid, meta in scenarios.items():
        np.save(out / f"{sid}.logits.npy", np.zeros((len(meta["tokens"]), 8), np.float32))
        for name in meta.get("arrays", []):
            np.save(out / f"{sid}.{name}.npy", np.zeros((2, 3), np.float32))
    (out / "result.json").write_text(json.dumps({"scenarios": scenarios, "environment": {"mlx": "0.32.4"}}))


def test_a_new_top_level_field_of_an_oracle_is_refused_naming_it_and_the_table(tmp_path: Path) -> None:
    meta = _golden("smollm2-135m", "plain", "mlx") | {"logits_dtype": "float32", "prefill_calls": 2}
    meta["kv_bytes"] = 123
    _write(tmp_path, {"plain": meta})
    with pytest.raises(RecordError) as e:
        read_generator_output(tmp_path)
    message = str(e.value)
    assert message.startswith("oracle output plain: kv_bytes: a field the oracle writes that no judge compares")
    assert "harness/records_fields.py IGNORED_FIELDS does not list" in message and "'kv_bytes'" in message


def test_a_new_field_of_a_decode_call_or_a_candidate_is_named_by_its_path(tmp_path: Path) -> None:
    meta = _golden("whisper-tiny-en", "long-two-windows", "mlx")
    meta["decode_calls"][1]["beam_rows"] = 5
    with pytest.raises(RecordError, match=r"decode_calls\[1\]\.beam_rows: .*'decode_calls\[\]\.beam_rows'"):
        check_fields(meta, "oracle output long")
    del meta["decode_calls"][1]["beam_rows"]
    meta["decode_calls"][0]["candidates"] = [{"tokens": [1, 2], "sum_logprob": -0.5, "avg": -0.25}]
    assert unlisted(meta) == [("decode_calls[0].candidates[0].avg", "decode_calls[].candidates[].avg")]


def test_an_implementation_may_write_its_own_notes(tmp_path: Path) -> None:
    """An implementation's record (plugins, docs/protocol.md) is compared against the oracle's:
    its extra notes (dspark's drafting stats) reach no judge and are no oracle field."""
    meta = _golden("smollm2-135m", "plain", "mlx") | {"dspark": {"n_drafted": 3}}
    _write(tmp_path, {"plain": meta})
    _, records, _ = read_generator_output(tmp_path, oracle=False)
    assert "dspark" not in records["plain"].extra
    with pytest.raises(RecordError, match="dspark"):
        read_generator_output(tmp_path)


def test_listed_fields_pass_and_never_reach_the_record(tmp_path: Path) -> None:
    meta = _golden("smollm2-135m", "plain", "mlx")
    notes = {k: 1 for k in IGNORED_FIELDS if "." not in k}
    _write(tmp_path, {"plain": meta | notes})
    _, records, _ = read_generator_output(tmp_path)
    assert not set(notes) & set(records["plain"].meta())


def _string_constants(path: Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_every_ignored_field_is_written_by_the_generators_it_names() -> None:
    """No stale entry: each listed field's name is a string of every source said to write it,
    and its level is one the walk visits."""
    for key, ignored in IGNORED_FIELDS.items():
        level, _, name = key.rpartition(".")
        assert level in LEVELS, f"{key}: {level!r} is no level the walk visits"
        assert ignored.reason and ignored.written_by, key
        for source in ignored.written_by:
            assert name in _string_constants(REPO_ROOT / source), f"{key}: {source} does not write {name!r}"


def test_every_field_of_the_tracked_goldens_is_compared_or_listed() -> None:
    records = _records()
    assert len(records) > 50
    found = {(key, path.relative_to(GOLDENS).as_posix()) for path, record in records for _, key in unlisted(record)}
    assert not found, sorted(found)[:10]


def test_decode_calls_record_their_candidates_where_the_oracle_writes_them() -> None:
    """The mlx-whisper goldens carry each decode call's finished candidates (compared by
    fallback_decisions); openai-whisper's do not, and the `beam` note is the ignored one."""
    mlx = [r for p, r in _records() if "decode_calls" in r and "-mlx" in p.parent.name]
    torch = [r for p, r in _records() if "decode_calls" in r and "-torch" in p.parent.name]
    assert mlx and torch
    assert all("candidates" in call for r in mlx for call in r["decode_calls"])
    assert all("candidates" not in call and "beam" in call for r in torch for call in r["decode_calls"])
    assert "candidates" in compared("decode_calls[]") and "beam" not in compared("decode_calls[]")


# The functions that build an oracle's records, by source: every key they write is a field of
# the interface (docs/records.md) or listed as ignored, so a field added there without a word
# fails here before any scenario of any device writes it.
BUILDERS = {
    "oracles/common/lm_steps.py": ("step_record",),
    "oracles/common/lm_speculative.py": ("run_speculative",),
    "oracles/mlx-lm/generate.py": (
        "run_scenario",
        "run_draft",
        "stop_as_stream_generate",
        "run_chat_turns",
        "run_batch",
    ),
    "oracles/mlx-optiq/generate.py": ("run_generate_step_path", "run_ngram_path", "run_child"),
    "oracles/common/whisper_run.py": ("decode_call_entry", "scenario_meta"),
    "oracles/openai-whisper/generate.py": ("call_extra",),
    "oracles/mlx-whisper/generate.py": ("candidates", "scenario_record"),
}
# Keys those functions write that never reach result.json's records: popped before it is
# written (`_arrays`, `cache`, mlx-optiq's per-process `environment`), a tensor's name in `_arrays`
# (its file is compared: `arrays`), a turn's `messages` handed to the chat template (a spec, not
# a record), or a scenario's error entry.
NOT_FIELDS = {"_arrays", "cache", "environment", "verify_logits", "messages", "error"}


def _rule_names(rule: Any) -> set[str]:
    names = set()
    for name, child, _ in rule.fields or ():
        names |= {name} | _rule_names(child)
    return names | (_rule_names(rule.item) if rule.item is not None else set())


def _record_key(target: ast.expr) -> bool:
    """`meta["key"] = ...` or `entry["key"] = ...`: a key set on a record (options dicts aside)."""
    return (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and target.value.id in ("meta", "entry")
        and isinstance(target.slice, ast.Constant)
        and isinstance(target.slice.value, str)
    )


def _written_keys(path: Path, functions: tuple[str, ...]) -> dict[str, set[str]]:
    """Per function: the string keys of its dict displays and of its `meta["key"] = ...` assignments."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            keys = set()
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict):
                    keys |= {k.value for k in inner.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if isinstance(inner, ast.Assign | ast.AugAssign):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    for t in targets:
                        if _record_key(t):
                            keys.add(t.slice.value)
            out[node.name] = keys
    return out


def test_every_key_the_record_builders_write_is_compared_or_listed() -> None:
    from harness.records_schema import RECORD_FIELDS, Rule

    known = _rule_names(Rule("record", fields=RECORD_FIELDS)) | {k.rpartition(".")[2] for k in IGNORED_FIELDS}
    seen = set()
    for source, functions in BUILDERS.items():
        written = _written_keys(REPO_ROOT / source, functions)
        assert set(written) == set(functions), f"{source}: no function {sorted(set(functions) - set(written))}"
        for function, keys in written.items():
            stray = keys - known - NOT_FIELDS
            assert not stray, f"{source} {function} writes {sorted(stray)}: judge them or list them in IGNORED_FIELDS"
            seen |= keys
    # the scan reads what the builders write: every listed field, and the candidates
    assert {k.rpartition(".")[2] for k in IGNORED_FIELDS} | {"candidates", "server_response", "verify_step"} <= seen
