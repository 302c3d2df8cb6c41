"""Paths of models/universal/ that no gate can take, held to what the oracle computes on the same
inputs, and the few defensive or error branches that coverage-exempt.yaml names (issue 53).

- The forward without a cache (model.py): every generation path passes a cache, as mlx-lm's
  generate does; here the minicpm5-2b-mini twin's logits without one, bit for bit against
  mlx-lm's model called the same way.
- apply_chat_template's `chat_template` option (tokenizer.py) where no twin has the form: a
  single template held as a string (a name is then the template's text) and a one-template list
  in tokenizer_config.json (a mapping: the name picks it), against mlx-lm's tokenizer.
- The tool-call format mlx-lm picks (response.py tool_format): tokenizer_config's
  tool_parser_type, a one-template mapping that mlx-lm never searches, and the pythonic format
  picked from the vocabulary, which the in-tree response refuses.
- A stream of no tokens (detokenize.stream_pieces), a config.json path given as a file
  (config.read_config_json) and a packed weight stored with another dtype (loader.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from models.universal import ChatTokenizer, LlamaConfig, TokenizerError, WeightLoadError, load_model
from models.universal.config import read_config_json
from models.universal.detokenize import stream_of, stream_pieces
from models.universal.response import ResponseBuilder, tool_format
from tests.oracle_call import oracle_answer
from tests.test_universal_llama import BASE_CONFIG, write_model_dir, write_tokenizer

TWIN = "minicpm5-2b-mini"
PROMPTS = {"five": [2, 130072, 435, 201, 751], "one": [394]}  # several queries ("causal") and one (no mask)
MESSAGES = [{"role": "user", "content": "hello world"}]
SINGLE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
MINICPM5_TOOLS = SINGLE + '{% if tools %}<function name="f"><param name="p">v</param></function>{% endif %}'
# name: (tokenizer_config.json settings replacing the chat template, chat_template.jinja or None,
#        added tokens, the `chat_template` option rendered with)
TOKENIZER_CASES: dict[str, tuple[dict[str, Any], str | None, list[str], str | None]] = {
    "file-one": ({}, SINGLE, [], "default"),  # a string there: "default" is the template's text
    "listed-one": ({"chat_template": [{"name": "default", "template": SINGLE}]}, None, [], "default"),
    "listed-minicpm5": ({"chat_template": [{"name": "default", "template": MINICPM5_TOOLS}]}, None, [], None),
    "file-minicpm5": ({}, MINICPM5_TOOLS, [], None),
    "parser-type": ({"tool_parser_type": "minicpm5"}, SINGLE, [], None),
    "pythonic-vocab": ({}, SINGLE, ["<|tool_call_start|>", "<|tool_call_end|>"], None),
}
ORACLE_GROUP = pytest.mark.xdist_group("oracle-mlx-lm-paths")

# mlx-lm's own answers: the model called without a cache (sha256 of its float32 logits), and, per
# tokenizer directory, apply_chat_template with the `chat_template` option and the tool parser
# mlx_lm's load picked (tokenizer_utils.load writes it into the tokenizer's init_kwargs).
ORACLE_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.utils import load_tokenizer

job = json.load(open(sys.argv[1]))
model, _ = load(job["model_dir"])
out = {"forward": {}, "rendered": {}, "tool_parser": {}}
for name, ids in job["prompts"].items():
    logits = model(mx.array([ids])).astype(mx.float32)
    out["forward"][name] = hashlib.sha256(np.array(logits).tobytes()).hexdigest()
for name, case in job["tokenizers"].items():
    tokenizer = load_tokenizer(Path(case["dir"]))
    options = {} if case["chosen"] is None else {"chat_template": case["chosen"]}
    out["rendered"][name] = tokenizer.apply_chat_template(
        job["messages"], tokenize=False, add_generation_prompt=True, **options
    )
    out["tool_parser"][name] = tokenizer._tokenizer.init_kwargs.get("tool_parser_type")
json.dump(out, open(sys.argv[2], "w"))
"""


def twin_dir() -> Path:
    from harness.artifacts.resolve import resolve_artifact
    from harness.profile.load import find_profile

    return Path(resolve_artifact(find_profile(TWIN)).model_dir)


def write_tokenizer_dir(path: Path, settings: dict[str, Any], template_file: str | None, added: list[str]) -> Path:
    path.mkdir(parents=True)
    write_tokenizer(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (path / "tokenizer_config.json").write_text(json.dumps(config | settings))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    if added:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        backend.add_special_tokens(added)
        backend.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps(BASE_CONFIG))
    return path


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: write_tokenizer_dir(root / name, *case[:3]) for name, case in TOKENIZER_CASES.items()}


@pytest.fixture(scope="module")
def oracle(tokenizer_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mlx-lm's answers for everything below (one oracle venv start)."""
    job = {
        "model_dir": str(twin_dir()),
        "prompts": PROMPTS,
        "messages": MESSAGES,
        "tokenizers": {n: {"dir": str(d), "chosen": TOKENIZER_CASES[n][3]} for n, d in tokenizer_dirs.items()},
    }
    return oracle_answer("mlx-lm", ORACLE_SCRIPT, job, tmp_path_factory.mktemp("mlx-lm-paths"))


def settings_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "tokenizer_config.json").read_text())


@ORACLE_GROUP
@pytest.mark.parametrize("name", list(PROMPTS))
def test_the_forward_without_a_cache_is_mlx_lms(name: str, oracle: dict[str, Any]) -> None:
    model, _ = load_model(twin_dir())
    logits = model(mx.array([PROMPTS[name]])).astype(mx.float32)
    assert hashlib.sha256(np.array(logits).tobytes()).hexdigest() == oracle["forward"][name]


@ORACLE_GROUP
@pytest.mark.parametrize("name", list(TOKENIZER_CASES))
def test_the_chat_template_option_renders_as_mlx_lm(
    name: str, tokenizer_dirs: dict[str, Path], oracle: dict[str, Any]
) -> None:
    chosen = TOKENIZER_CASES[name][3]
    options = {} if chosen is None else {"chat_template": chosen}
    rendered = ChatTokenizer.from_dir(tokenizer_dirs[name]).render_chat_like_mlx_lm(MESSAGES, **options)
    assert rendered == oracle["rendered"][name]


@ORACLE_GROUP
def test_the_cases_tell_a_name_from_a_template_text(oracle: dict[str, Any]) -> None:
    # Not vacuous: in mlx-lm's own answers, "default" is the text of the one template held as a
    # string and picks the template of the one-template list.
    assert oracle["rendered"]["file-one"] == "default"
    assert oracle["rendered"]["listed-one"] == "[user] hello world"


@ORACLE_GROUP
@pytest.mark.parametrize("name", list(TOKENIZER_CASES))
def test_the_tool_format_is_the_one_mlx_lm_picks(
    name: str, tokenizer_dirs: dict[str, Path], oracle: dict[str, Any]
) -> None:
    tokenizer = ChatTokenizer.from_dir(tokenizer_dirs[name])
    assert tool_format(tokenizer, settings_of(tokenizer_dirs[name])) == oracle["tool_parser"][name]


@ORACLE_GROUP
def test_the_tool_formats_differ_between_cases(oracle: dict[str, Any]) -> None:
    assert oracle["tool_parser"]["file-minicpm5"] == oracle["tool_parser"]["parser-type"] == "minicpm5"
    assert oracle["tool_parser"]["listed-minicpm5"] is None  # a mapping: mlx-lm never searches it
    assert oracle["tool_parser"]["pythonic-vocab"] == "pythonic"


def test_the_pythonic_format_is_refused_in_tree(tokenizer_dirs: dict[str, Path]) -> None:
    tokenizer = ChatTokenizer.from_dir(tokenizer_dirs["pythonic-vocab"])
    with pytest.raises(TokenizerError, match="tool parser 'pythonic' is not implemented in-tree"):
        ResponseBuilder(tokenizer, None, tool_format(tokenizer, settings_of(tokenizer_dirs["pythonic-vocab"])))


def test_a_stream_of_no_tokens_hands_out_nothing(tokenizer_dirs: dict[str, Path]) -> None:
    stream = stream_of(ChatTokenizer.from_dir(tokenizer_dirs["file-one"]))
    assert stream_pieces(stream, [3, 4]) != []
    assert stream_pieces(stream, []) == []
    assert stream.tokens == [] and stream.current_text() == ""


def test_a_config_json_path_reads_as_its_directory(tmp_path: Path) -> None:
    path = write_model_dir(tmp_path / "m")
    assert read_config_json(path / "config.json") == read_config_json(path)
    assert LlamaConfig.from_file(path / "config.json") == LlamaConfig.from_file(path)


def test_a_packed_weight_of_another_dtype_is_named(tmp_path: Path) -> None:
    def retype(weights: dict[str, mx.array]) -> None:
        weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"].astype(mx.int32)

    with pytest.raises(
        WeightLoadError, match=r"layers\.0\.mlp\.up_proj\.weight: packed weight stored as mlx\.core\.int32"
    ):
        load_model(write_model_dir(tmp_path / "m", edit_weights=retype))
