"""The SentencePiece and decode-based streams are gated (issue 31: the audit found that every gated
artifact had a byte-level BPE tokenizer, so a fault in SentencePieceStream or DecodeStream passed
every gate).

Three tiny Llama twins (harness/artifacts/twins/llama_spm.py, docs/twins.md "SentencePiece Llama
twins") differ only in tokenizer.json's decoder shape; per twin: the detokenizer class mlx-lm 0.32.2
picks (asked inside the oracle venv) corresponds to the in-tree stream `stream_kind` picks, `make
parity` passes with every scenario's checks run, and each stream fault of
harness/tools/mutant_faults_streams.py is killed by `detokenize` on the scenario named for it
while the unmutated implementation passes there."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from harness.artifacts.twins import build_twin
from harness.profile.load import find_profile
from harness.tools.mutant_faults_streams import SPM, SPM_KEEP_SPACE, STREAM_MUTANTS, UNIGRAM
from tests.conftest import parity_passes_every_check

# model -> (mlx-lm's detokenizer class, its trim_space; the in-tree stream class, its trim_first_space)
PICKS = {
    SPM: ("SPMStreamingDetokenizer", True, "SentencePieceStream", True),
    SPM_KEEP_SPACE: ("SPMStreamingDetokenizer", False, "SentencePieceStream", False),
    UNIGRAM: ("NaiveStreamingDetokenizer", None, "DecodeStream", None),
}

ORACLE_SNIPPET = """
import json, sys
from pathlib import Path
from mlx_lm.tokenizer_utils import load
tokenizer = load(Path(sys.argv[1]))
detokenizer = tokenizer.detokenizer
print(json.dumps({"class": type(detokenizer).__name__, "trim_space": getattr(detokenizer, "trim_space", None)}))
"""


def _models() -> list:
    return [pytest.param(m, marks=[pytest.mark.slow, pytest.mark.xdist_group(m)], id=m) for m in PICKS]


def _model_dir(model: str) -> Path:
    from harness.artifacts.resolve import resolve_artifact

    return resolve_artifact(find_profile(model)).model_dir


@pytest.mark.parametrize("model", _models())
def test_the_oracle_and_the_in_tree_side_pick_corresponding_streams(model: str) -> None:
    from harness.oracle.venvs import ensure_oracle_env
    from models.universal.detokenize import stream_for, stream_of
    from models.universal.tokenizer import ChatTokenizer

    oracle_class, trim_space, intree_class, trim_first_space = PICKS[model]
    model_dir = _model_dir(model)
    cmd, env = ensure_oracle_env("mlx-lm").command("-c", ORACLE_SNIPPET, str(model_dir))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"class": oracle_class, "trim_space": trim_space}

    tokenizer = ChatTokenizer.from_dir(model_dir)
    # The detokenize check's stream (tokenizer.json's decoder, as mlx-lm reads it) and the response
    # check's (the loaded tokenizer's decoder) are the same kind.
    for stream in (stream_for(model_dir, tokenizer), stream_of(tokenizer)):
        assert type(stream).__name__ == intree_class
        assert getattr(stream, "trim_first_space", None) == trim_first_space


@pytest.mark.parametrize("model", _models())
def test_make_parity_passes_and_walks_the_finalize_flush(model: str, tmp_path: Path) -> None:
    stdout = parity_passes_every_check(model, tmp_path)
    assert f"exercise {model} detokenize: finalize() flushes held text: multibyte-held-end" in stdout


@pytest.mark.parametrize(
    "mutant",
    [pytest.param(m, marks=[pytest.mark.slow, pytest.mark.xdist_group(m.model)], id=m.name) for m in STREAM_MUTANTS],
)
def test_each_stream_fault_is_killed_by_detokenize_on_its_scenario(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["detokenize"] == "failed", judged["summaries"]
    # Only the stream is faulted: every logits and token gate of the scenario still passes.
    assert {c for c, o in judged["outcomes"].items() if o != "passed"} == {"detokenize"}, judged["summaries"]


@pytest.mark.parametrize(
    ("model", "scenario"),
    [
        pytest.param(
            model, scenario, marks=[pytest.mark.slow, pytest.mark.xdist_group(model)], id=f"{model}-{scenario}"
        )
        for model, scenario in sorted({(m.model, m.scenario) for m in STREAM_MUTANTS})
    ],
)
def test_the_unmutated_streams_pass_where_the_faults_are_judged(model: str, scenario: str) -> None:
    from harness.tools.mutants import judge

    clean = dataclasses.replace(STREAM_MUTANTS[0], name="unmutated", model=model, scenario=scenario, patch=None)
    judged = judge(clean)
    assert not judged["killed"] and set(judged["outcomes"].values()) == {"passed"}, judged["summaries"]
    assert judged["equivalent"]  # nothing patched: bit for bit the unmutated run


def test_the_three_twins_share_weights_and_pieces_and_differ_in_the_decoder(tmp_path: Path) -> None:
    """Built twice, a twin is byte-identical; the three share their weights and their vocabulary
    (Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then the trained pieces), and their
    decoders are the three shapes mlx-lm's tokenizer_utils.load tells apart."""
    identities = {m: build_twin(m, tmp_path / m) for m in PICKS}
    assert build_twin(SPM, tmp_path / "again")["files"] == identities[SPM]["files"]
    weights = {m: i["files"]["model-00001-of-00001.safetensors"] for m, i in identities.items()}
    assert len({json.dumps(w, sort_keys=True) for w in weights.values()}) == 1
    decoders, vocabularies = {}, {}
    for model in PICKS:
        tokenizer = json.loads((tmp_path / model / "tokenizer.json").read_text(encoding="utf-8"))
        decoders[model] = tokenizer["decoder"]
        vocab = tokenizer["model"]["vocab"]
        vocabularies[model] = [p for p, _ in vocab] if isinstance(vocab, list) else sorted(vocab, key=vocab.get)
    assert vocabularies[SPM] == vocabularies[SPM_KEEP_SPACE] == vocabularies[UNIGRAM]
    assert vocabularies[SPM][:4] == ["<unk>", "<s>", "</s>", "<0x00>"] and vocabularies[SPM][258] == "<0xFF>"
    spm = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    assert decoders[SPM] == {
        "type": "Sequence",
        "decoders": [*spm, {"type": "Strip", "content": " ", "start": 1, "stop": 0}],
    }
    assert decoders[SPM_KEEP_SPACE] == {"type": "Sequence", "decoders": spm}
    assert decoders[UNIGRAM]["type"] == "Sequence"
    assert [d["type"] for d in decoders[UNIGRAM]["decoders"]] == ["ByteFallback", "Metaspace"]


def test_the_response_stream_reads_the_decoder_of_tokenizer_json_as_mlx_lm_does(tmp_path: Path) -> None:
    """A LlamaTokenizer whose tokenizer_config sets add_prefix_space: false makes transformers
    rebuild the backend's decoder without its Strip step; mlx-lm picks its detokenizer from
    tokenizer.json's decoder (SPM, trimming the first space). The response check's stream
    (`stream_of`, from a loaded ChatTokenizer) must read the same decoder as `stream_for`."""
    import shutil

    from models.universal.detokenize import stream_for, stream_of, stream_pieces
    from models.universal.tokenizer import ChatTokenizer

    copy = tmp_path / "model"
    shutil.copytree(_model_dir(SPM), copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps(config | {"add_prefix_space": False}))
    tokenizer = ChatTokenizer.from_dir(copy)
    from_file, from_loaded = stream_for(copy, tokenizer), stream_of(tokenizer)
    assert stream_pieces(from_loaded, [992, 358]) == stream_pieces(from_file, [992, 358]) == ["In", " the"]


SHAPES_SNIPPET = """
import json, sys
from mlx_lm import tokenizer_utils as t
out = []
for d in json.loads(sys.stdin.read()):
    out.append("sentencepiece" if t._is_spm_decoder(d) else "sentencepiece-keep-space" if t._is_spm_decoder_no_space(d)
               else "byte-level" if t._is_bpe_decoder(d) else "decode")
print(json.dumps(out))
"""


def test_decoder_shapes_pick_the_stream_mlx_lm_picks_types_included() -> None:
    """mlx-lm matches tokenizer.json's decoder by exact shape, types included (True is not 1, a
    key more is another shape); the in-tree `stream_kind` must pick as it does, variant by variant."""
    from harness.oracle.venvs import ensure_oracle_env
    from models.universal.detokenize import stream_kind

    replace = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
    strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
    steps = [replace, {"type": "ByteFallback"}, {"type": "Fuse"}]
    variants = [
        {"type": "Sequence", "decoders": [*steps, strip]},
        {"type": "Sequence", "decoders": steps},
        {"type": "Sequence", "decoders": [*steps, strip | {"start": True}]},  # a bool where mlx-lm wants an int
        {"type": "Sequence", "decoders": [*steps, strip | {"start": 1.0}]},
        {"type": "Sequence", "decoders": [*steps, strip], "extra": None},
        {"type": "Sequence", "decoders": [replace | {"content": " "}, {"type": "ByteFallback"}]},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        None,
    ]
    cmd, env = ensure_oracle_env("mlx-lm").command("-c", SHAPES_SNIPPET)
    out = subprocess.run(
        cmd, input=json.dumps(variants), capture_output=True, text=True, env=env, check=False, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [stream_kind(v) for v in variants] == json.loads(out.stdout.strip().splitlines()[-1])
