"""Four Llama twins in the checkpoint forms no other twin has (issue 53: branch coverage showed
these paths of models/universal/ walked by no gate). Each combines the forms that do not exclude
one another; the split is forced by the vocabulary: mlx-lm's thinking markers are the first of
`<|channel>`/`<channel|>` or the XTML tokens the vocabulary has, a tool-call split without
thinking markers needs neither, and a base model has no chat template at all.

- `mistral-base-fp-mini`: a small base model pretrained from scratch with Mistral's architecture.
  config.json: model_type mistral, weights in the three fp quantization modes (mxfp4 by default,
  v_proj nvfp4 and down_proj mxfp8 with no per-module entry, so their mode is inferred from the
  uint8 scales' shapes), the embedding kept in float by a `false` entry and lm_head named by a
  `true` one; YaRN whose correction range collapses (low == high == 0 after clamping); an
  infinite `final_logit_softcapping` as transformers 5 writes it (`{"__float__": "Infinity"}`).
  Tokenizer: tokenizer.json without added tokens or post-processor (`</s>` is a plain piece, no
  BOS is added), a tokenizer_config.json naming no token and no template, with Mistral's
  `tokenizer_class` (LlamaTokenizerFast), which transformers ignores for model_type mistral
  (its LlamaTokenizer rebuild would make `</s>` a special token).
- `llama-channel-think-mini`: Gemma-4-style `<|channel>`/`<channel|>` thinking markers and
  `<|turn>` turns; model-specific tokens in tokenizer_config.json's `extra_special_tokens` as a
  dict, one of them an `{"__type": "AddedToken"}` object, registered at load time; a tokenizer.json
  whose decoder is null: transformers' LlamaTokenizer rebuilds its own, mlx-lm picks its naive
  (decode-based) streaming detokenizer from the file.
- `llama-xtml-mini`: the XTML structural tokens (`<|open|>`, `<|close|>`, `<|sep|>`,
  `<|end_of_msg|>`), whose thinking markers span several tokens; the legacy layout (no
  added_tokens_decoder) with special_tokens_map.json repeating tokenizer_config.json's
  `extra_special_tokens` and adding one.
- `llama-tool-parser-mini`: `tool_parser_type: minicpm5` in tokenizer_config.json and a ChatML
  template that shows the tools as JSON (nothing mlx-lm would infer a parser from), no thinking
  markers; a byte-level BPE trained on minicpm5-2b-mini's text, so the call markup is a few
  pieces and mlx-lm's BPE detokenizer holds a lone space back (a marker then shares its piece
  with text, which the SentencePiece stream, flushing every token, never does).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from tokenizers import AddedToken, Tokenizer

from harness.artifacts.twins.bpe import SpecialToken, live_id_ranges
from harness.artifacts.twins.bpe import build_tokenizer as build_byte_level
from harness.artifacts.twins.llama_spm import (
    BOS,
    EOS,
    LLAMA_SPM_MINI,
    LLAMA_SPM_MINI_SHAPE,
    SPECIALS,
    UNK,
    _token_dict,
    _write_json,
    build_tokenizer,
    model_config,
    tokenizer_config,
)
from harness.artifacts.twins.minicpm5 import BPE_VOCAB_SIZE as MINICPM5_BPE_VOCAB
from harness.artifacts.twins.minicpm5 import training_text as minicpm5_text
from harness.artifacts.twins.spec import TwinSpec
from harness.artifacts.twins.weights import make_module_tensors, plan_modules, write_weights

# --- mistral-base-fp-mini ------------------------------------------------------------------

BASE_MAX_POSITIONS = 128
# mxfp4 for every quantized module unless its last name is here; nvfp4 and mxfp8 are stored with
# no per-module entry (the loader infers their mode from the packed shapes and uint8 scales).
DEFAULT_FP = ("mxfp4", 32, 4)
STORED_FP = {"v_proj": ("nvfp4", 16, 4), "down_proj": ("mxfp8", 32, 8)}
FLOAT_MODULES = ("model.embed_tokens",)  # `false` in the per-module map
# YaRN with beta_slow 6 over 32 original positions (head dim 64, theta 10000): the correction
# dimensions of both betas are negative, ceil(-0.57) = 0 and the floor clamps to 0, so low ==
# high and the ramp needs mlx-lm's +0.001.
BASE_YARN = (("beta_slow", 6.0), ("factor", 4.0), ("original_max_position_embeddings", 32), ("rope_type", "yarn"))


def _quantization() -> dict[str, Any]:
    mode, group, bits = DEFAULT_FP
    return {"group_size": group, "bits": bits, "mode": mode, "model.embed_tokens": False, "lm_head": True}


def _write_fp_weights(spec: TwinSpec, out_dir: Path) -> None:
    """The mini shape's seeded float32 draws (weights.py), quantized per module as STORED_FP
    says; one model.safetensors, no index."""
    tensors: dict[str, mx.array] = {}
    for module in plan_modules(spec.shape):
        drawn = make_module_tensors(module, spec.seed, None)
        if module.is_norm or module.name in FLOAT_MODULES:
            tensors.update(drawn)
            continue
        mode, group, bits = STORED_FP.get(module.name.rsplit(".", 1)[-1], DEFAULT_FP)
        weight, scales = mx.quantize(drawn[f"{module.name}.weight"], group_size=group, bits=bits, mode=mode)
        tensors[f"{module.name}.weight"], tensors[f"{module.name}.scales"] = weight, scales
    mx.eval(list(tensors.values()))
    mx.save_safetensors(str(out_dir / "model.safetensors"), dict(sorted(tensors.items())), metadata={"format": "mlx"})


def _save_edited(tokenizer: Tokenizer, out_dir: Path, changes: dict[str, Any]) -> None:
    """tokenizer.json with these top-level keys replaced (None: null, as tokenizers writes an unset part)."""
    data = json.loads(tokenizer.to_str()) | changes
    Tokenizer.from_str(json.dumps(data)).save(str(out_dir / "tokenizer.json"))


def _write_base(spec: TwinSpec, out_dir: Path) -> None:
    _write_fp_weights(spec, out_dir)
    config = model_config(spec) | {
        "architectures": ["MistralForCausalLM"],
        "final_logit_softcapping": {"__float__": "Infinity"},
        "model_type": "mistral",
        "quantization": _quantization(),
        "quantization_config": _quantization(),
        "sliding_window": None,
    }
    _write_json(out_dir / "config.json", dict(sorted(config.items())))
    _save_edited(build_tokenizer("llama"), out_dir, {"added_tokens": [], "post_processor": None})
    settings = {
        "added_tokens_decoder": {},
        "clean_up_tokenization_spaces": False,
        "model_max_length": BASE_MAX_POSITIONS,
        "tokenizer_class": "LlamaTokenizerFast",
    }
    _write_json(out_dir / "tokenizer_config.json", settings)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": 2})


MISTRAL_BASE_FP_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="mistral-base-fp-mini",
    description="a Mistral-architecture base model: mxfp4/nvfp4/mxfp8 weights (a float embedding by a false "
    "entry, lm_head by a true one), a collapsed YaRN range, an infinite float tag in config.json; a "
    "tokenizer.json without added tokens, no named token, no chat template",
    rope_scaling=BASE_YARN,
    max_positions=BASE_MAX_POSITIONS,
    write=_write_base,
)

# --- the chat twins: llama-spm-mini's pieces plus added tokens, vocabulary padded ---------------

# The vocabulary exactly as large as the tokenizer (tokens registered at load time included):
# mlx-lm's streaming detokenizers index a table of the tokenizer's size by the generated id.
CHANNEL_SHAPE = dataclasses.replace(LLAMA_SPM_MINI_SHAPE, vocab_size=LLAMA_SPM_MINI_SHAPE.vocab_size + 6)
XTML_SHAPE = dataclasses.replace(LLAMA_SPM_MINI_SHAPE, vocab_size=LLAMA_SPM_MINI_SHAPE.vocab_size + 5)
TURN_START, TURN_END, CHANNEL_START, CHANNEL_END = "<|turn>", "<turn|>", "<|channel>", "<channel|>"
IMAGE, AUDIO, TOOL = "<|image|>", "<|audio|>", "<|tool|>"
XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")

# Thinking on: the model's turn opens the thought channel (the prompt ends inside it).
CHANNEL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|turn>' + message['role'] + '\\n' + message['content'] + '<turn|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\\n' }}"
    "{% if enable_thinking %}{{ '<|channel>thought\\n' }}{% endif %}{% endif %}"
)
XTML_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|open|>' + message['role'] + '<|sep|>' + message['content'] + '<|end_of_msg|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|open|>assistant<|sep|>' }}"
    "{% if enable_thinking %}{{ '<|open|>think<|sep|>' }}{% endif %}{% endif %}"
)
# ChatML with the tools as JSON in a system turn: no tool-call syntax in it.
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools (JSON):\\n' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# A byte-level BPE trained on minicpm5-2b-mini's text (its prose and its chat template, so the
# tool-call markup tokenizes into a few pieces), over a 2048-id vocabulary: the trainer's 1824
# tokens from id 3, placeholders, the ChatML markers at the top.
TOOL_SPECIALS = [
    SpecialToken(UNK, 0),
    SpecialToken(EOS, 1),
    SpecialToken(BOS, 2),
    SpecialToken(IM_START, LLAMA_SPM_MINI_SHAPE.vocab_size - 2),
    SpecialToken(IM_END, LLAMA_SPM_MINI_SHAPE.vocab_size - 1),
]


def _added_token(content: str) -> dict[str, Any]:
    return {**_token_dict(content), "special": True}


def _write_chat(
    spec: TwinSpec,
    out_dir: Path,
    added: tuple[str, ...],
    settings: dict[str, Any],
    token_map: dict[str, Any] | None,
    tokenizer_changes: dict[str, Any] | None = None,
) -> None:
    """Weights, config.json and generation_config.json (the spec's one EOS id), llama-spm-mini's
    tokenizer.json with `added` special tokens from id 2048 (and top-level `tokenizer_changes`),
    tokenizer_config.json = `settings`, special_tokens_map.json when given."""
    (eos_id,) = spec.eos_token_ids
    write_weights(out_dir, spec.shape, spec.seed, spec.quantization, spec.num_shards, None, spec.float_dtype)
    _write_json(out_dir / "config.json", model_config(spec) | {"eos_token_id": eos_id})
    tokenizer = build_tokenizer("llama")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    _save_edited(tokenizer, out_dir, tokenizer_changes or {})
    _write_json(out_dir / "tokenizer_config.json", dict(sorted(settings.items())))
    if token_map is not None:
        _write_json(out_dir / "special_tokens_map.json", token_map)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": eos_id})


def _write_channel(spec: TwinSpec, out_dir: Path) -> None:
    added = (TURN_START, TURN_END, CHANNEL_START, CHANNEL_END)
    settings = tokenizer_config("llama")
    for i, token in enumerate(added):
        settings["added_tokens_decoder"][str(LLAMA_SPM_MINI_SHAPE.vocab_size + i)] = _added_token(token)
    settings |= {
        "chat_template": CHANNEL_TEMPLATE,
        "eos_token": TURN_END,
        "extra_special_tokens": {"image_token": IMAGE, "audio_token": {"__type": "AddedToken", **_added_token(AUDIO)}},
    }
    _write_chat(spec, out_dir, added, settings, None, {"decoder": None})


def _write_xtml(spec: TwinSpec, out_dir: Path) -> None:
    settings = {
        "add_bos_token": True,
        "bos_token": BOS,
        "chat_template": XTML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": XTML[3],
        "extra_special_tokens": list(XTML),
        "model_max_length": 4096,
        "unk_token": UNK,
    }
    token_map = {
        "bos_token": _token_dict(BOS),
        "eos_token": _token_dict(XTML[3]),
        "extra_special_tokens": [*XTML, TOOL],
        "unk_token": _token_dict(UNK),
    }
    _write_chat(spec, out_dir, XTML, settings, token_map)


def _write_tool_parser(spec: TwinSpec, out_dir: Path) -> None:
    vocab_size = spec.shape.vocab_size
    tokenizer = build_byte_level(minicpm5_text(), MINICPM5_BPE_VOCAB, vocab_size, TOOL_SPECIALS, len(SPECIALS))
    write_weights(out_dir, spec.shape, spec.seed, None, 1, live_id_ranges(tokenizer, vocab_size), spec.float_dtype)
    (eos_id,) = spec.eos_token_ids
    _write_json(out_dir / "config.json", model_config(spec) | {"eos_token_id": eos_id})
    tokenizer.save(str(out_dir / "tokenizer.json"))
    settings = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {str(t.token_id): _added_token(t.content) for t in TOOL_SPECIALS},
        "bos_token": BOS,
        "chat_template": TOOLS_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "tool_parser_type": "minicpm5",
        "unk_token": UNK,
    }
    _write_json(out_dir / "tokenizer_config.json", settings)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": eos_id})


LLAMA_CHANNEL_THINK_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-channel-think-mini",
    description="llama-spm-mini's pieces with Gemma-4-style <|channel>/<channel|> thinking markers and <|turn> "
    "turns, model-specific tokens in an extra_special_tokens dict (one an AddedToken object), a null decoder",
    shape=CHANNEL_SHAPE,
    eos_token_ids=(LLAMA_SPM_MINI_SHAPE.vocab_size + 1,),  # <turn|>
    write=_write_channel,
)
LLAMA_XTML_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-xtml-mini",
    description="llama-spm-mini's pieces with the XTML structural tokens (multi-token thinking markers), legacy "
    "layout with special_tokens_map.json repeating the extra special tokens",
    shape=XTML_SHAPE,
    eos_token_ids=(LLAMA_SPM_MINI_SHAPE.vocab_size + 3,),  # <|end_of_msg|>
    write=_write_xtml,
)
LLAMA_TOOL_PARSER_MINI = dataclasses.replace(
    LLAMA_SPM_MINI,
    twin_id="llama-tool-parser-mini",
    description="llama-spm-mini's shape with a byte-level BPE (minicpm5's training text), tool_parser_type "
    "minicpm5 in tokenizer_config.json, a ChatML template showing the tools as JSON, no thinking markers",
    eos_token_ids=(LLAMA_SPM_MINI_SHAPE.vocab_size - 1,),  # <|im_end|>
    write=_write_tool_parser,
)
ODD_FORM_TWINS = (MISTRAL_BASE_FP_MINI, LLAMA_CHANNEL_THINK_MINI, LLAMA_XTML_MINI, LLAMA_TOOL_PARSER_MINI)
