"""Language identification (openai-whisper's `detect_language`): the most probable language
token after `<|startoftranscript|>`, from one decoder call with every other token masked."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from models.whisper.tokenizer import Tokenizer


def detect_language(model: Any, mel: mx.array, tokenizer: Tokenizer) -> tuple[mx.array, list[dict[str, float]]]:
    """Most probable language token per audio, and the probabilities of every language.

    `mel` may be a Mel window (`[n_mels, frames]`-shaped per audio as the encoder takes
    it) or already-encoded audio features. One decoder call on `<|startoftranscript|>`;
    every non-language logit is masked before argmax and softmax.
    """
    if tokenizer.language is None or tokenizer.language_token not in tokenizer.sot_sequence:
        raise ValueError("This model doesn't have language tokens so it can't perform lang id")
    single = mel.ndim == 2
    if single:
        mel = mel[None]
    if mel.shape[-2:] != (model.dims.n_audio_ctx, model.dims.n_audio_state):
        mel = model.embed_audio(mel)

    n_audio = mel.shape[0]
    logits = model.logits(mx.array([[tokenizer.sot]] * n_audio), mel)[0][:, 0]
    only_languages = mx.full(logits.shape[-1], -mx.inf, dtype=mx.float32)
    only_languages[list(tokenizer.all_language_tokens)] = 0.0
    logits += only_languages
    language_tokens = mx.argmax(logits, axis=-1)
    probs = np.array(mx.softmax(logits, axis=-1))
    language_probs = [
        {
            code: probs[i, token].item()
            for token, code in zip(tokenizer.all_language_tokens, tokenizer.all_language_codes, strict=True)
        }
        for i in range(n_audio)
    ]
    if single:
        return language_tokens[0], language_probs[0]
    return language_tokens, language_probs
