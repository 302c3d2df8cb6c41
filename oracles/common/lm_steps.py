"""mlx-lm's decoding as the mlx-lm and mlx-optiq oracles run it: prompt encoding, a logit tap,
forced first tokens, and a tapped `generate_step` run.

Imports mlx and mlx_lm, so it is for those two oracle venvs only; the generators load this
file by path (their venvs do not have this repository on sys.path).
"""

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step


class LogitTap:
    """Stands in for the model inside generate_step and keeps each call's last-position logits."""

    def __init__(self, model):
        self._model = model
        self.rows = []

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.rows.append(out[:, -1, :])
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def encode_prompt(tokenizer, scenario):
    """What mlx-lm's generate does with a prompt: template for chats, plain encode otherwise."""
    if scenario["kind"] == "chat":
        rendered = tokenizer.apply_chat_template(
            scenario["messages"],
            tokenize=False,
            add_generation_prompt=True,
            **scenario.get("template_kwargs", {}),
        )
        return rendered, tokenizer.encode(rendered, add_special_tokens=False)
    return None, tokenizer.encode(scenario["prompt"], add_special_tokens=True)


def force_prefix(forced, prompt_length):
    """A logits processor (mlx-lm's own hook) that makes the first sampled tokens `forced`.

    Only the processed logits change: the tap has already recorded the model's raw ones.
    """

    def processor(tokens, logits):
        index = tokens.size - prompt_length
        if index >= len(forced):
            return logits
        keep = mx.arange(logits.shape[-1]) == forced[index]
        return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))

    return processor


def tapped_steps(model, prompt_ids, n_tokens, cache, prefill_step_size, options):
    """Greedy `generate_step` on a LogitTap of `model`: (tokens, each step's logits, prefill calls).

    The tapped calls are the prefill chunks, one per produced token, and the look-ahead step
    generate_step computes before it stops; the rows kept are those of the produced tokens.
    """
    tap = LogitTap(model)
    tokens = []
    for token, _logprobs in generate_step(
        mx.array(prompt_ids),
        tap,
        max_tokens=n_tokens,
        prompt_cache=cache,
        prefill_step_size=prefill_step_size,
        **options,
    ):
        tokens.append(int(token))
    n_chunks = len(tap.rows) - (n_tokens + 1)
    return tokens, tap.rows[n_chunks : n_chunks + n_tokens], n_chunks + 1


def stack_rows(rows):
    """The logits rows as one float32 (rows, vocabulary) array."""
    return np.stack([np.array(r.astype(mx.float32)).reshape(-1) for r in rows])


def step_record(rendered, prompt_ids, tokens, tokenizer, rows):
    """The fields every scenario record starts with: prompt, tokens, EOS ids, logits dtype."""
    return {
        "rendered_prompt": rendered,
        "prompt_ids": [int(t) for t in prompt_ids],
        "tokens": tokens,
        "eos_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
        "logits_dtype": str(rows[0].dtype),
    }
