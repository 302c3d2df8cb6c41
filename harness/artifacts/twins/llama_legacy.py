"""A Llama twin whose special tokens are spelled the legacy way (issue 53: branch coverage showed
that every gated tokenizer_config.json lists its tokens in `added_tokens_decoder`, so the paths
by which transformers collects them from older layouts were walked by no gate).

`llama-legacy-tokens-mini`: llama-spm-mini's tokenizer.json (its three specials only), with
- no `added_tokens_decoder` and no `tokenizer_class` in tokenizer_config.json (the tokenizer.json
  is used as written), its EOS as an `{"__type": "AddedToken"}` object and a model-specific
  named token (`image_token`);
- special_tokens_map.json holding the named tokens as objects, `additional_special_tokens` and
  `extra_special_tokens` (a string and an object) that tokenizer.json does not have, so they are
  registered at load time, with new ids past the trained vocabulary;
- a ChatML template that writes those markers into every prompt (so `prompt_identity` compares
  how they were registered: split into characters, they would not be one id each);
- config.json's vocab_size padded to 2112 (the embedding has rows for the added ids, as
  checkpoints pad theirs) and generation_config.json without an eos_token_id (config.json's and
  the tokenizer's EOS are used).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

from harness.artifacts.twins.llama_spm import (
    BOS,
    EOS,
    LLAMA_SPM_MINI,
    LLAMA_SPM_MINI_SHAPE,
    MAX_POSITIONS,
    SPECIALS,
    UNK,
    build_tokenizer,
    model_config,
)
from harness.artifacts.twins.spec import TwinSpec
from harness.artifacts.twins.weights import write_weights

IM_START, IM_END, IMAGE, TOOL = "<|im_start|>", "<|im_end|>", "<|image|>", "<|tool|>"
PAD = "<pad>"
PADDED_VOCAB = 2112

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _token(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_layout(
    spec: TwinSpec, out_dir: Path, tokenizer: Any, config: dict[str, Any], token_map: dict[str, Any]
) -> None:
    """llama-spm-mini's weights, config.json (the padded vocabulary) and this tokenizer.json,
    tokenizer_config.json (ChatML template, Llama's BOS settings added) and special_tokens_map.json;
    generation_config.json without an eos_token_id."""
    write_weights(out_dir, spec.shape, spec.seed, spec.quantization, spec.num_shards, None, spec.float_dtype)
    _write_json(out_dir / "config.json", model_config(spec))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    common = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "chat_template": CHATML}
    common |= {"clean_up_tokenization_spaces": False, "model_max_length": MAX_POSITIONS, "unk_token": UNK}
    _write_json(out_dir / "tokenizer_config.json", dict(sorted({**common, **config}.items())))
    _write_json(out_dir / "special_tokens_map.json", token_map)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": SPECIALS.index(BOS)})


def _write(spec: TwinSpec, out_dir: Path) -> None:
    config = {"eos_token": {"__type": "AddedToken", **_token(EOS), "special": True}, "image_token": IMAGE}
    token_map = {
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": _token(BOS),
        "eos_token": _token(EOS),
        "extra_special_tokens": [IMAGE, {**_token(TOOL)}],
        "unk_token": _token(UNK),
    }
    _write_layout(spec, out_dir, build_tokenizer("llama"), config, token_map)


LLAMA_LEGACY_TOKENS_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-legacy-tokens-mini",
    description="llama-spm-mini's pieces with special tokens in the legacy layout (special_tokens_map.json, "
    "no added_tokens_decoder), ChatML markers registered at load time, vocab_size padded to 2112",
    shape=dataclasses.replace(LLAMA_SPM_MINI_SHAPE, vocab_size=PADDED_VOCAB),
    write=_write,
)


def _write_additional(spec: TwinSpec, out_dir: Path) -> None:
    tokenizer = build_tokenizer("llama")
    tokenizer.add_tokens([AddedToken(PAD, special=False, normalized=False)])  # id 2048, not special
    additional = [IM_START, {"__type": "AddedToken", **_token(IM_END), "special": True}]
    config = {"additional_special_tokens": additional, "eos_token": EOS, "pad_token": PAD}
    token_map = {"bos_token": _token(BOS), "eos_token": _token(EOS), "pad_token": PAD, "unk_token": _token(UNK)}
    _write_layout(spec, out_dir, tokenizer, config, token_map)


# additional_special_tokens alone (no extra_special_tokens anywhere), one of them an AddedToken
# object in tokenizer_config.json, and a pad token tokenizer.json added as a plain (non-special)
# token: transformers 5 registers the additional ones as special (one id each) and makes the pad
# token special because a named token has its content.
LLAMA_ADDITIONAL_TOKENS_MINI = dataclasses.replace(
    LLAMA_LEGACY_TOKENS_MINI,
    twin_id="llama-additional-tokens-mini",
    description="llama-spm-mini's pieces with additional_special_tokens alone (ChatML markers, one an "
    "AddedToken object) and a non-special pad token in tokenizer.json named pad_token",
    write=_write_additional,
)
