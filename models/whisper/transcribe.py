"""Transcribing a whole clip: mlx-whisper 0.4.3's seek loop over 30-second windows.

The clip's log-Mel is computed once with a window of zero padding; each window is
decoded with the temperature ladder (a result too repetitive — compression ratio above
the threshold — or too improbable — average log-probability below the threshold — is
decoded again at the next temperature, unless the window looks silent); windows the
model calls silent are skipped; otherwise the timestamp tokens cut the text into
segments and decide where the next window starts. Previous text is the next window's
prompt unless conditioning is off or the window needed a temperature above 0.5.

Reproduced as mlx-whisper does it (they change outputs):

- `clip_timestamps`: a later clip does not move `seek` forward to its start; decoding
  goes on from wherever the previous clip stopped. `fix_clip_start=True` jumps to each
  clip's start, as openai-whisper does.
- A segment emptied because it is instantaneous or blank gets a `"words": []` key; others
  have none (without word timestamps).

With `word_timestamps=True` every segment gets its words (`timing.add_word_timestamps`),
and a window that does not end on a single timestamp is cut at its last word's end rather
than at its last timestamp. `hallucination_silence_threshold` (with word timestamps)
skips silence before a stretch of anomalous words, as mlx-whisper does. Word times and the
segment times they move are numpy float64 inside the loop (their rounding is numpy's);
the result holds them as Python floats (an int 0 where the reference clamps to `0`), which
is what the reference's values serialise to.

The stages, one module each: seek_loop (the loop and its window step), fallback (the
temperature ladder's decisions), segments (a window's tokens as segments), hallucination
(the hallucination-silence pass); this module computes the clip's Mel and runs the loop.
"""

from __future__ import annotations

from typing import Any

import tiktoken

from models.whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from models.whisper.seek_loop import WAIT, SeekLoop


def transcribe(model: Any, audio: Any, encoding: tiktoken.Encoding, **options: Any) -> dict[str, Any]:
    """Transcribe `audio` (a path or a 16 kHz waveform) with `model`, as mlx_whisper.transcribe.

    `encoding` is the model's vocabulary (`tokenizer.load_encoding`). `options` are
    mlx_whisper.transcribe's keyword arguments (`SeekLoop`'s) and `DecodingOptions` fields.
    `observer` sees the Mel, each decode call's steps and outcome. `forced_calls` replays a
    reference run: decode call i starts at `forced_calls[i].seek`, runs at its temperature,
    is fed its tokens, and falls back as the reference did; everything else is computed as
    usual. `decode_fn` runs one decode call (`decoding.decode`'s signature): the fast path
    passes its own.

    `prepend_punctuations`, `append_punctuations` and `hallucination_silence_threshold`
    only act with word timestamps, as in mlx_whisper.transcribe.

    Returns `{"text", "segments", "language"}`.
    """
    loop = SeekLoop(model, encoding, **options)
    # A whole window of zero padding after the clip, so every window can be sliced full.
    mel = log_mel_spectrogram(audio, n_mels=model.dims.n_mels, padding=N_SAMPLES)
    loop.observer.on_mel(mel)
    content_frames = mel.shape[-2] - N_FRAMES
    loop.begin(lambda: pad_or_trim(mel, N_FRAMES, axis=-2), content_frames)
    while (window := loop.next_window(content_frames)) is not None:
        assert window != WAIT, "a clip of known length never waits"
        seek, segment_size = window
        loop.run_window(mel[seek : seek + segment_size], seek, segment_size)
    return loop.result()
