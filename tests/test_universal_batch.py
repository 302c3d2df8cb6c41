"""Prompt-cache reuse (chat turns on one kept cache) and batched decoding, in-tree side.

mlx-lm is not importable here; the bit-exact comparison with its generate_step and
BatchGenerator runs through the oracle. These tests pin what that comparison rests on,
on the mini MiniCPM5 twin: the kept cache matters (and holds what mlx-lm's holds), the
batch's padding machinery (mask, per-row RoPE offsets, the roll to left padding) each
change a padded row's logits when broken, and bad arguments are named.

Not asserted: that a batch row equals decoding that prompt alone. It does on the CPU
backend for this model, but mlx-lm does not promise it (the batched shapes differ).
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import models.universal.batch as batch_module
from harness.artifacts.twins import build_twin
from models.universal import (
    BatchKVCache,
    ChatTokenizer,
    UniversalLlama,
    batch_greedy_steps,
    chat_turn_steps,
    greedy_steps,
    load_model,
)
from models.universal.masks import create_causal_mask

N = 5
TURN_1 = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
TURN_2 = [{"role": "user", "content": "Explain why the sky is blue, step by step."}]
LONG = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the storm."}]
SHORT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[UniversalLlama, ChatTokenizer]:
    path = tmp_path_factory.mktemp("twin") / "mini"
    build_twin("minicpm5-2b-mini", path)
    model, _ = load_model(path)
    return model, ChatTokenizer.from_dir(path)


@pytest.fixture(scope="module")
def model(twin: tuple[UniversalLlama, ChatTokenizer]) -> UniversalLlama:
    return twin[0]


@pytest.fixture(scope="module")
def ids(twin: tuple[UniversalLlama, ChatTokenizer]) -> dict[str, list[int]]:
    tokenizer = twin[1]

    def encode(messages: list[dict[str, Any]]) -> list[int]:
        rendered = tokenizer.render_chat_like_mlx_lm(messages, add_generation_prompt=True)
        return tokenizer.encode(rendered, add_special_tokens=False)

    return {"turn1": encode(TURN_1), "turn2": encode(TURN_2), "long": encode(LONG), "short": encode(SHORT)}


def bits(steps: list[Any]) -> np.ndarray:
    return np.stack([np.array(s.logits.astype(mx.float32)).view(np.uint32) for s in steps])


def same(a: list[Any], b: list[Any]) -> bool:
    return bool(np.array_equal(bits(a), bits(b)))


# --- prompt-cache reuse ----------------------------------------------------------------


@pytest.fixture(scope="module")
def turns(model: UniversalLlama, ids: dict[str, list[int]]) -> list[list[Any]]:
    return chat_turn_steps(model, [ids["turn1"], ids["turn2"]], N)


def test_first_turn_on_a_kept_cache_is_a_fresh_run(
    model: UniversalLlama, ids: dict[str, list[int]], turns: list[list[Any]]
) -> None:
    fresh = list(greedy_steps(model, ids["turn1"], N))
    assert same(turns[0], fresh)
    assert [s.token for s in turns[0]] == [s.token for s in fresh]
    assert [len(t) for t in turns] == [N, N] and [s.index for s in turns[1]] == list(range(N))


def test_second_turn_depends_on_the_kept_cache(
    model: UniversalLlama, ids: dict[str, list[int]], turns: list[list[Any]]
) -> None:
    fresh = list(greedy_steps(model, ids["turn2"], N))
    differing = [i for i in range(N) if not same([turns[1][i]], [fresh[i]])]
    assert differing == list(range(N))


def test_kept_cache_holds_the_prompt_and_every_token(model: UniversalLlama, ids: dict[str, list[int]]) -> None:
    # generate_step queues the step fed with each token before yielding it, so after n
    # steps mlx-lm's cache holds the prompt and all n tokens (the oracle records this too).
    cache = model.make_cache()
    list(greedy_steps(model, ids["turn1"], N, cache=cache))
    assert {c.offset for c in cache} == {len(ids["turn1"]) + N}
    list(greedy_steps(model, ids["turn2"], N, cache=cache))
    assert {c.offset for c in cache} == {len(ids["turn1"]) + len(ids["turn2"]) + 2 * N}


def test_a_cache_missing_the_last_token_gives_another_second_turn(
    model: UniversalLlama, ids: dict[str, list[int]], turns: list[list[Any]]
) -> None:
    # The perturbation a gate must catch: the last generated token not fed to the cache.
    cache = model.make_cache()
    list(greedy_steps(model, ids["turn1"], N, cache=cache))
    for c in cache:
        c.offset -= 1
    second = list(greedy_steps(model, ids["turn2"], N, cache=cache))
    assert not same(second, turns[1])


def test_teacher_forcing_a_turn_with_its_own_tokens_reproduces_it(
    model: UniversalLlama, ids: dict[str, list[int]], turns: list[list[Any]]
) -> None:
    own = [[s.token for s in t] for t in turns]
    forced = chat_turn_steps(model, [ids["turn1"], ids["turn2"]], N, forced_tokens=own)
    assert same(forced[0], turns[0]) and same(forced[1], turns[1])
    # Forcing a different last token of turn 1 changes what turn 2 starts from.
    other = [own[0][:-1] + [(own[0][-1] + 1) % model.config.vocab_size], own[1]]
    assert not same(chat_turn_steps(model, [ids["turn1"], ids["turn2"]], N, forced_tokens=other)[1], turns[1])


def test_kept_cache_arguments_are_checked(model: UniversalLlama, ids: dict[str, list[int]]) -> None:
    with pytest.raises(ValueError, match="^cache: "):
        list(greedy_steps(model, ids["turn1"], N, cache=model.make_cache()[:1]))
    with pytest.raises(ValueError, match="^n_tokens: "):
        list(greedy_steps(model, ids["turn1"], 0, cache=model.make_cache()))
    with pytest.raises(ValueError, match=f"^forced_tokens: {N - 1} given, {N} needed"):
        list(greedy_steps(model, ids["turn1"], N, cache=model.make_cache(), forced_tokens=[5] * (N - 1)))
    with pytest.raises(ValueError, match="^turn_prompts: "):
        chat_turn_steps(model, [], N)
    with pytest.raises(ValueError, match="^forced_tokens: 1 turns given, 2 expected"):
        chat_turn_steps(model, [ids["turn1"], ids["turn2"]], N, forced_tokens=[[5] * N])


# --- batched decoding ------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch(model: UniversalLlama, ids: dict[str, list[int]]) -> list[list[Any]]:
    assert len(ids["long"]) > len(ids["short"]) + 4  # the short row is padded
    return batch_greedy_steps(model, [ids["long"], ids["short"]], N)


def test_batch_returns_every_rows_steps(model: UniversalLlama, batch: list[list[Any]]) -> None:
    assert [len(row) for row in batch] == [N, N]
    for row in batch:
        assert [s.index for s in row] == list(range(N))
        assert all(s.logits.shape == (model.config.vocab_size,) for s in row)
        # Greedy: each token is the argmax of its row's logits.
        assert [s.token for s in row] == [int(np.argmax(np.array(s.logits.astype(mx.float32)))) for s in row]


def test_batch_teacher_forcing_with_own_tokens_reproduces_free_running(
    model: UniversalLlama, ids: dict[str, list[int]], batch: list[list[Any]]
) -> None:
    own = [[s.token for s in row] for row in batch]
    forced = batch_greedy_steps(model, [ids["long"], ids["short"]], N, forced_tokens=own)
    assert same(forced[0], batch[0]) and same(forced[1], batch[1])


def test_the_pad_token_is_invisible(
    model: UniversalLlama, ids: dict[str, list[int]], batch: list[list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pads sit after a row's prompt during prefill (causal) and are masked afterwards.
    monkeypatch.setattr(batch_module, "PAD_TOKEN", 7)
    again = batch_greedy_steps(model, [ids["long"], ids["short"]], N)
    assert same(again[0], batch[0]) and same(again[1], batch[1])


def test_prefill_rounds_pad_only_the_last_round(model: UniversalLlama, ids: dict[str, list[int]]) -> None:
    cache = [BatchKVCache([0, 0]) for _ in model.layers]
    batch_module._prefill_round(model, cache, [ids["long"][:-1], ids["short"][:-1]])
    pad = len(ids["long"]) - len(ids["short"])
    assert cache[0].left_padding.tolist() == [0, pad]
    assert cache[0].offset.tolist() == [len(ids["long"]) - 1, len(ids["short"]) - 1]
    mask = cache[0].make_mask(1)
    assert mask.shape == (2, 1, 1, len(ids["long"]))
    assert np.array(mask[1, 0, 0]).tolist() == [False] * pad + [True] * (len(ids["short"]))


def test_roll_moves_right_padding_to_the_left() -> None:
    cache = BatchKVCache([0, 0])
    keys = mx.broadcast_to(mx.arange(1, 4, dtype=mx.float32)[None, None, :, None], (2, 1, 3, 2))
    cache.prepare(right_padding=[0, 2])
    cache.update_and_fetch(keys, keys)
    cache.finalize()
    got, _ = cache.keys_and_values()
    assert np.array(got[:, 0, :, 0]).tolist() == [[1, 2, 3], [0, 0, 1]]
    assert cache.left_padding.tolist() == [0, 2] and cache.offset.tolist() == [3, 1]


@pytest.mark.parametrize("broken", ["mask", "rope_offset", "roll"])
def test_each_padding_mechanism_changes_the_padded_row_when_broken(
    broken: str,
    model: UniversalLlama,
    ids: dict[str, list[int]],
    batch: list[list[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if broken == "mask":  # plain causal mask: the padded row attends to its padding
        monkeypatch.setattr(BatchKVCache, "make_mask", lambda self, n, **_: create_causal_mask(n, self._idx))
    elif broken == "rope_offset":  # every row rotated at the buffer position, not its own length
        update = BatchKVCache.update_and_fetch

        def shared_offset(self: BatchKVCache, keys: mx.array, values: mx.array) -> Any:
            out = update(self, keys, values)
            self.offset = mx.full(self.offset.shape, self._idx)
            return out

        monkeypatch.setattr(BatchKVCache, "update_and_fetch", shared_offset)
    else:  # padding left on the right, unmasked
        monkeypatch.setattr(BatchKVCache, "finalize", lambda self: setattr(self, "_right_padding", None))
    perturbed = batch_greedy_steps(model, [ids["long"], ids["short"]], N)
    assert same(perturbed[0], batch[0])  # the unpadded row never sees padding
    assert not same(perturbed[1], batch[1])


def test_batch_arguments_are_checked(model: UniversalLlama, ids: dict[str, list[int]]) -> None:
    long, short = ids["long"], ids["short"]
    cases = {
        "prompts": dict(prompts=[]),
        "prompts[1]": dict(prompts=[long, []]),
        "n_tokens": dict(n_tokens=0),
        "prefill_step_size": dict(prefill_step_size=0),
        "prefill_batch_size": dict(prefill_batch_size=1),
        "forced_tokens": dict(forced_tokens=[[1] * N]),
        "forced_tokens[0]": dict(forced_tokens=[[1], [1] * N]),
    }
    for name, bad in cases.items():
        arguments = {"prompts": [long, short], "n_tokens": N} | bad
        with pytest.raises(ValueError, match=f"^{re.escape(name)}: "):
            batch_greedy_steps(model, **arguments)
    with pytest.raises(ValueError, match=r"^prompts\[0\]: token ids must be ints"):
        batch_greedy_steps(model, [[model.config.vocab_size]], N)
    # Rows needing different numbers of prefill rounds would start decoding at different times.
    with pytest.raises(ValueError, match=r"^prompts: with prefill_step_size 4 .* prefill rounds"):
        batch_greedy_steps(model, [long, short], N, prefill_step_size=4)


def test_batch_runs_rows_prefilled_over_several_rounds(model: UniversalLlama, ids: dict[str, list[int]]) -> None:
    long, short = ids["turn1"], ids["turn2"]
    a, b = len(long) - 1, len(short) - 1
    step = next(k for k in range(2, a) if -(-a // k) == -(-b // k) == 2 and a % k != b % k)
    rows = batch_greedy_steps(model, [long, short], 2, prefill_step_size=step)
    assert [[s.index for s in r] for r in rows] == [[0, 1], [0, 1]]
