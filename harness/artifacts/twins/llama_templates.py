"""Llama twins whose chat templates are stored the other ways a checkpoint ships them (issue 53:
branch coverage showed every gated tokenizer kept one template, a string in tokenizer_config.json
or a chat_template.jinja, so models/universal/tokenizer_files.py's named templates and
tokenizer.py's choice among them were walked by no gate).

Both are llama-spm-mini's weights and pieces with a second, named template `tool_use` that
transformers picks when the request carries tools (`get_chat_template`):
- `llama-chat-templates-mini`: the default in chat_template.jinja, `tool_use` in
  additional_chat_templates/tool_use.jinja (transformers 5's folder for named templates), no
  template in tokenizer_config.json; no generation_config.json (config.json's EOS alone), and a
  tokenizer.json that carries a padding setting (its pad token becomes the named pad_token);
- `llama-chat-template-list-mini`: both templates as tokenizer_config.json's list form
  `[{"name": ..., "template": ...}]`.

And three more twins of one setting each (below): `llama-mha-mini` (as many KV heads as query
heads), `llama-spm-no-prefix-mini` (the LlamaTokenizer rebuild without a dummy prefix) and
`minicpm5-gpt2-class-mini` (the GPT2Tokenizer rebuild).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from harness.artifacts.twins.llama_spm import (
    BOS,
    CHAT_TEMPLATE,
    EOS,
    LLAMA_SPM_MINI,
    SPECIALS,
    UNK,
    _token_dict,
    _write_json,
    build_tokenizer,
    model_config,
    tokenizer_config,
)
from harness.artifacts.twins.minicpm5 import MINICPM5_2B_MINI, write_minicpm5
from harness.artifacts.twins.spec import TwinSpec
from harness.artifacts.twins.weights import write_weights

# The tools as a system-like preamble before the first user turn, then the default's turns.
TOOL_USE_TEMPLATE = (
    "{{ bos_token }}[AVAILABLE_TOOLS] {{ tools | tojson }} [/AVAILABLE_TOOLS]"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)
TEMPLATE_DIR = "additional_chat_templates"


def _special_tokens_map() -> dict[str, Any]:
    return {"bos_token": _token_dict(BOS), "eos_token": _token_dict(EOS), "unk_token": _token_dict(UNK)}


def _write_llama(spec: TwinSpec, out_dir: Path, tokenizer: Any, config: dict[str, Any], generation: bool) -> None:
    """llama-spm-mini's weights and config.json with this tokenizer.json and tokenizer_config.json;
    generation_config.json (BOS and EOS ids) when `generation`."""
    write_weights(out_dir, spec.shape, spec.seed, spec.quantization, spec.num_shards, None, spec.float_dtype)
    _write_json(out_dir / "config.json", model_config(spec))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map())
    if generation:
        ids = {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": SPECIALS.index(EOS)}
        _write_json(out_dir / "generation_config.json", ids)


def _write_files(spec: TwinSpec, out_dir: Path) -> None:
    tokenizer = build_tokenizer("llama")
    tokenizer.enable_padding(pad_id=SPECIALS.index(UNK), pad_token=UNK)
    config = tokenizer_config("llama")
    del config["chat_template"]
    _write_llama(spec, out_dir, tokenizer, config, generation=False)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    (out_dir / TEMPLATE_DIR).mkdir()
    (out_dir / TEMPLATE_DIR / "tool_use.jinja").write_text(TOOL_USE_TEMPLATE, encoding="utf-8")


def _write_list(spec: TwinSpec, out_dir: Path) -> None:
    config = tokenizer_config("llama")
    config["chat_template"] = [
        {"name": "default", "template": CHAT_TEMPLATE},
        {"name": "tool_use", "template": TOOL_USE_TEMPLATE},
    ]
    _write_llama(spec, out_dir, build_tokenizer("llama"), config, generation=True)


LLAMA_CHAT_TEMPLATES_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-chat-templates-mini",
    description="llama-spm-mini with its default template in chat_template.jinja and a named tool_use "
    "template in additional_chat_templates/, no generation_config.json, tokenizer.json padding",
    write=_write_files,
)
LLAMA_CHAT_TEMPLATE_LIST_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-chat-template-list-mini",
    description="llama-spm-mini with a default and a named tool_use template in tokenizer_config.json's list form",
    write=_write_list,
)


# Multi-head attention (as many KV heads as query heads): every other gated model groups its
# query heads, so the quantized attention's and the fused SDPA's ungrouped paths had no gate.
LLAMA_MHA_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-mha-mini",
    description="llama-spm-mini's tokenizer with multi-head attention (2 query heads, 2 KV heads): "
    "the quantized attention's ungrouped path",
    shape=dataclasses.replace(LLAMA_SPM_MINI.shape, num_key_value_heads=2),
)


def _write_no_prefix(spec: TwinSpec, out_dir: Path) -> None:
    tokenizer = build_tokenizer("llama")
    tokenizer.post_processor = None
    config = {**tokenizer_config("llama"), "add_prefix_space": False}
    _write_llama(spec, out_dir, tokenizer, config, generation=True)


# The LlamaTokenizer rebuild's other settings: add_prefix_space false (no dummy prefix, no Strip
# in the decoder) and a tokenizer.json without a post-processor (what transformers then adds).
LLAMA_SPM_NO_PREFIX_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-spm-no-prefix-mini",
    description="llama-spm-mini's LlamaTokenizer rebuilt with add_prefix_space false, from a tokenizer.json "
    "without a post-processor",
    write=_write_no_prefix,
)


def _write_gpt2_class(spec: TwinSpec, out_dir: Path) -> None:
    write_minicpm5(spec, out_dir)
    config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    # add_prefix_space: the rebuilt pre-tokenizer's, where tokenizer.json's has none, so the
    # prompt ids say which pipeline encoded them.
    _write_json(
        out_dir / "tokenizer_config.json", {**config, "add_prefix_space": True, "tokenizer_class": "GPT2Tokenizer"}
    )


# transformers' GPT2Tokenizer rebuild: every gated byte-level tokenizer was loaded as written.
MINICPM5_GPT2_CLASS_MINI = dataclasses.replace(
    MINICPM5_2B_MINI,
    twin_id="minicpm5-gpt2-class-mini",
    description="minicpm5-2b-mini's files with tokenizer_class GPT2Tokenizer and add_prefix_space: transformers "
    "rebuilds its byte-level BPE from the vocabulary and merges (GPT-2's pre-tokenizer, a prefix space)",
    write=_write_gpt2_class,
)
LLAMA_TEMPLATE_TWINS = (
    LLAMA_CHAT_TEMPLATES_MINI,
    LLAMA_CHAT_TEMPLATE_LIST_MINI,
    LLAMA_MHA_MINI,
    LLAMA_SPM_NO_PREFIX_MINI,
    MINICPM5_GPT2_CLASS_MINI,
)
