"""The checkpoint forms no other twin had are gated (issue 53: branch coverage of models/universal/
showed config.py's per-module `true` / `false` quantization entries and tagged floats, loader.py's
fp quantization modes inferred from uint8 scales, rope.py's collapsed YaRN range, the Mistral model
type's tokenizer routing, a tokenizer with no template / no named token / nothing to register, a
null decoder, an extra_special_tokens dict, repeated legacy extra tokens, the channel and XTML
thinking markers and a tool parser named in tokenizer_config.json walked by no gate).

The four twins of harness/artifacts/twins/llama_odd_forms.py pass `make parity` with every check
run; the facts each was built to carry are asserted on the in-tree side here (the gate compares
them with mlx-lm). An empty eos_token (tokenizer_files.py's unk fallback, no released checkpoint
writes one: exempt from the gates) is compared with what the oracle computed for it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from harness.profile.load import find_profile
from tests.conftest import parity_passes_every_check

MODELS = ("mistral-base-fp-mini", "llama-channel-think-mini", "llama-xtml-mini", "llama-tool-parser-mini")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("llama-odd-forms")]


def _model_dir(model: str) -> Path:
    from harness.artifacts.resolve import resolve_artifact

    return resolve_artifact(find_profile(model)).model_dir


def _tokenizer(model: str):
    from models.universal.tokenizer import ChatTokenizer

    return ChatTokenizer.from_dir(_model_dir(model))


@pytest.mark.parametrize("model", MODELS)
def test_make_parity_passes_with_every_check_run(model: str, tmp_path: Path) -> None:
    parity_passes_every_check(model, tmp_path)


def test_the_mistral_base_model_loads_its_fp_modes_and_per_module_entries() -> None:
    from models.universal.config import read_config_json
    from models.universal.loader import load_model

    path = _model_dir("mistral-base-fp-mini")
    assert read_config_json(path)["final_logit_softcapping"] == math.inf
    model, config = load_model(path)
    assert config.quantization.per_module == {"model.embed_tokens": None, "lm_head": config.quantization.default}
    layer = model.model.layers[0]
    modes = {name: getattr(m, "mode", None) for name, m in layer.named_modules() if name.endswith("_proj")}
    assert modes == {
        **dict.fromkeys(("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj"), "mxfp4"),
        **dict.fromkeys(("mlp.gate_proj", "mlp.up_proj"), "mxfp4"),
        "self_attn.v_proj": "nvfp4",
        "mlp.down_proj": "mxfp8",
    }
    assert not hasattr(model.model.embed_tokens, "mode") and model.lm_head.mode == "mxfp4"


def test_the_mistral_base_tokenizer_is_used_as_written_and_names_nothing() -> None:
    tokenizer = _tokenizer("mistral-base-fp-mini")
    # model_type mistral: tokenizer.json as written, whatever tokenizer_class says (the
    # LlamaTokenizer rebuild would name `</s>` its EOS and so make it one special id); no BOS.
    assert tokenizer.encode("a</s>") == [357, 286, 273, 341, 288]
    assert tokenizer.chat_templates == {} and tokenizer.special_tokens_map == {}
    assert tokenizer.eos_token_ids == {2}


def test_the_chat_twins_markers_and_registered_tokens() -> None:
    from models.universal.detokenize import stream_kind

    channel = _tokenizer("llama-channel-think-mini")
    assert channel.think_markers == ("<|channel>thought", "<channel|>")
    assert channel.encode("<|image|><|audio|>", add_special_tokens=False) == [2052, 2053]
    assert channel.decoder is None and stream_kind(channel.decoder) == "decode"
    xtml = _tokenizer("llama-xtml-mini")
    assert xtml.think_markers == ("<|open|>think<|sep|>", "<|close|>think<|sep|>")
    assert xtml.encode("<|open|><|end_of_msg|><|tool|>", add_special_tokens=False) == [2048, 2051, 2052]
    assert xtml.backend.get_vocab_size(with_added_tokens=True) == 2053  # each repeated token once


def test_the_tool_parser_comes_from_tokenizer_config_alone() -> None:
    from models.universal.response import tool_format

    tokenizer = _tokenizer("llama-tool-parser-mini")
    settings = json.loads((_model_dir("llama-tool-parser-mini") / "tokenizer_config.json").read_text())
    assert tokenizer.think_markers is None
    assert tool_format(tokenizer, settings) == "minicpm5"
    assert tool_format(tokenizer, {k: v for k, v in settings.items() if k != "tool_parser_type"}) is None


# mlx-lm 0.32.2 over transformers 5.24 on llama-spm-mini's files with tokenizer_config.json's
# eos_token "" (tokenizers never adds an empty token): the EOS maps to the unk id (0), and with no
# unk token to nothing; config.json's EOS 2 is added in both cases.
EMPTY_EOS_ORACLE = {"unk": {0, 2}, "no-unk": {2}}


@pytest.mark.parametrize("case", sorted(EMPTY_EOS_ORACLE))
def test_an_empty_eos_token_gives_the_oracles_eos_ids(case: str, tmp_path: Path) -> None:
    from models.universal.tokenizer import ChatTokenizer

    for file in _model_dir("llama-spm-mini").iterdir():
        shutil.copy(file, tmp_path / file.name)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text()) | {"eos_token": ""}
    if case == "no-unk":
        del settings["unk_token"]
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    assert ChatTokenizer.from_dir(tmp_path).eos_token_ids == EMPTY_EOS_ORACLE[case]
