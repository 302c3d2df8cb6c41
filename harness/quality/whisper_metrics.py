"""The Whisper quality metrics as the harness computes them from in-tree logits, and the word
error count both sides' transcripts are judged by.

`kl_per_step` is the op sequence of mlx-lm 0.32.2's `mlx_lm.tuner.losses.kl_div_loss` on a
device without Metal (this CPU, CUDA): `mlx.nn.losses.kl_div_loss(logits_q - logsumexp(logits_q),
logits_p - logsumexp(logits_p), axis=-1, reduction="none")`, i.e. per row
sum(exp(log p) * (log p - log q)) = KL(p || q), with p the control and q the candidate, in
float32. The oracle computes the same sequence in its venv (oracles/common/whisper_quality.py),
so the two agree bit for bit when their logits do.

The transcript normalizer is ours (openai-whisper's EnglishTextNormalizer is not in the
mlx-whisper venv): lower case, every character that is neither a letter, a digit, an
apostrophe inside a word nor whitespace becomes a space, then split on whitespace.
"""

from __future__ import annotations

import re

import numpy as np

_NOT_WORD = re.compile(r"[^\w\s']|_")
_EDGE_APOSTROPHES = re.compile(r"(^|\s)'+|'+(?=\s|$)")


def kl_per_step(control_logits: np.ndarray, candidate_logits: np.ndarray) -> np.ndarray:
    """KL(control || candidate) per row of two [steps, vocab] float32 logit arrays, in float32."""
    import mlx.core as mx
    import mlx.nn as nn

    if control_logits.shape != candidate_logits.shape or control_logits.ndim != 2:
        raise ValueError(f"KL needs two [steps, vocab] arrays, got {control_logits.shape} and {candidate_logits.shape}")
    logits_p = mx.array(control_logits.astype(np.float32, copy=False))
    logits_q = mx.array(candidate_logits.astype(np.float32, copy=False))
    kl = nn.losses.kl_div_loss(
        logits_q - mx.logsumexp(logits_q, axis=-1, keepdims=True),
        logits_p - mx.logsumexp(logits_p, axis=-1, keepdims=True),
        axis=-1,
        reduction="none",
    )
    return np.array(kl)


def argmax_per_step(logits: np.ndarray) -> np.ndarray:
    """The top token of each row (mx.argmax: the first of equal maxima), as int64."""
    import mlx.core as mx

    return np.array(mx.argmax(mx.array(logits), axis=-1)).astype(np.int64)


def normalize_words(text: str) -> list[str]:
    """Lower case, punctuation stripped (an apostrophe inside a word kept), split on whitespace."""
    text = _NOT_WORD.sub(" ", text.lower())
    return _EDGE_APOSTROPHES.sub(" ", text).split()


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word-level Levenshtein distance, reference word count) of the normalized transcripts:
    substitutions + deletions + insertions turning the reference into the hypothesis."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, start=1):
        current = [i]
        for j, other in enumerate(hyp, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1], len(ref)
