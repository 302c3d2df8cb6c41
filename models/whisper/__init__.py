"""In-tree Whisper (speech to text) on MLX, computing what mlx-whisper 0.4.3 computes.

Stages, one module each, data flowing one way: `audio` (load, pad/trim, log-Mel),
`model` (dimensions, attention, encoder, decoder), `load` (strict checkpoint loading);
tokenizer, decoding and transcription build on these.

    model = load_model(model_dir)
    mel = log_mel_spectrogram(load_audio("speech.wav"), n_mels=model.dims.n_mels)
    audio_features = model.embed_audio(pad_or_trim(mel, N_FRAMES, axis=-2)[None])
    logits, kv_cache, cross_qk = model.logits(tokens, audio_features)
"""

from models.whisper.audio import (
    CHUNK_LENGTH,
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    N_SAMPLES_PER_TOKEN,
    SAMPLE_RATE,
    TOKENS_PER_SECOND,
    load_audio,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
)
from models.whisper.load import load_model
from models.whisper.model import KVCache, ModelDimensions, Whisper

__all__ = [
    "CHUNK_LENGTH",
    "FRAMES_PER_SECOND",
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_SAMPLES",
    "N_SAMPLES_PER_TOKEN",
    "SAMPLE_RATE",
    "TOKENS_PER_SECOND",
    "KVCache",
    "ModelDimensions",
    "Whisper",
    "load_audio",
    "load_model",
    "log_mel_spectrogram",
    "mel_filters",
    "pad_or_trim",
]
