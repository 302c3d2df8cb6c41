"""Decoding one 30-second window, computing exactly what mlx-whisper 0.4.3's DecodingTask does.

One `DecodingTask` per window and temperature: encode the Mel window, build the prompt
(`<|startofprev|>` + previous text, the start-of-transcript sequence, an optional prefix),
then one decoder call per step. Each step takes the last position's logits (cast to
float32) and passes them through the logit filters in mlx-whisper's order —
`SuppressBlank`, `SuppressTokens`, `ApplyTimestampRules` — before the `GreedyDecoder`
picks the next token (argmax at T=0, `mx.random.categorical(logits / T)` otherwise).
The `MaximumLikelihoodRanker` picks one of `best_of` samples.

What changes bits or decisions is reproduced as the oracle does it:

- float32 running `sum_logprobs` on device; `avg_logprob = sum / (len(tokens) + 1)` in
  Python floats; `no_speech_prob` is the softmax at the start-of-transcript position of
  the FIRST step's logits; `compression_ratio` via CPython's zlib at level 6.
- The step loop computes one more step after every sequence has ended (the oracle
  overlaps a step with the completion check) and throws it away; that step's logits are
  still computed, and observed here, and at T>0 it draws from the sampler.
- Sampling: see `token_decoders.TemperatureSampler` (the random key is drawn once per compiled trace).
- `ApplyTimestampRules`' "timestamps must not decrease" rule never fires in mlx-whisper
  (it collects positions, not timestamp tokens, and masks an empty range). The default
  reproduces that; `DecodingOptions(fix_monotonic_timestamps=True)` applies
  openai-whisper's rule instead (the logits before the filters are unchanged, the chosen
  tokens and `avg_logprob` may change).

Instrumentation (hooks.py): a `DecodeObserver` sees every step's logits before the filters and the
token appended after them; `forced_tokens` (per batch member, its tokens up to its first
EOT) feeds given tokens instead of the chosen ones (teacher forcing), everything else
computed as usual.

Beam search (`DecodingOptions.beam_size`): mlx-whisper raises NotImplementedError, so its
reference is openai-whisper (20250625), and a beam-search task follows openai-whisper's
DecodingTask wherever that differs from mlx-whisper's: its `BeamSearchDecoder` (see there),
its step loop (no step past the end: it stops right after the update that completes the
search), and its `ApplyTimestampRules` (the monotonic rule, and the timestamp-vs-text
comparison on the logits after the grammar mask). Teacher forcing has no beam-search path.

The pieces, one module each: decoding_types (options, result), language (language
identification), inference (the decoder with its cache), logit_filters, token_decoders (the
sampler, greedy and beam-search decoders, the ranker); this module is the task and its step loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
import tiktoken

from models.whisper.audio import CHUNK_LENGTH
from models.whisper.decoding_types import DecodingOptions, DecodingResult, compression_ratio
from models.whisper.hooks import DecodeHooks, DecodeObserver, decode_entry
from models.whisper.inference import Inference
from models.whisper.language import detect_language
from models.whisper.logit_filters import ApplyTimestampRules, LogitFilter, SuppressBlank, SuppressTokens
from models.whisper.token_decoders import BeamSearchDecoder, GreedyDecoder, MaximumLikelihoodRanker, TemperatureSampler
from models.whisper.tokenizer import get_tokenizer


class DecodingTask:
    """One decode call: `run(mel)` encodes the window and samples until EOT or `sample_len`."""

    def __init__(
        self,
        model: Any,
        options: DecodingOptions,
        encoding: tiktoken.Encoding,
        *,
        sampler: TemperatureSampler | None = None,
        observer: DecodeObserver | None = None,
        forced_tokens: Sequence[Sequence[int]] | None = None,
    ):
        self.model = model
        self.tokenizer = get_tokenizer(
            encoding,
            multilingual=model.is_multilingual,
            num_languages=model.num_languages,
            language=options.language or "en",
            task=options.task,
        )
        self.options = self._verify_options(options)
        self.observer = observer or DecodeObserver()
        self.forced_tokens = forced_tokens

        self.n_group = options.beam_size or options.best_of or 1
        self.n_ctx = model.dims.n_text_ctx
        self.sample_len = options.sample_len or model.dims.n_text_ctx // 2

        self.sot_sequence = self.tokenizer.sot_sequence
        if options.without_timestamps:
            self.sot_sequence = self.tokenizer.sot_sequence_including_notimestamps
        self.initial_tokens = self._initial_tokens()
        self.sample_begin = len(self.initial_tokens)
        self.sot_index = self.initial_tokens.index(self.tokenizer.sot)

        self.inference = Inference(model)
        self.sequence_ranker = MaximumLikelihoodRanker(options.length_penalty)
        self.decoder: GreedyDecoder | BeamSearchDecoder
        if options.beam_size is not None:
            if forced_tokens is not None:
                raise ValueError(
                    "teacher forcing (forced_tokens) is not supported with beam search (beam_size): "
                    "a beam row's tokens come from the search itself"
                )
            self.decoder = BeamSearchDecoder(options.beam_size, self.tokenizer.eot, self.inference, options.patience)
        else:
            self.decoder = GreedyDecoder(options.temperature, self.tokenizer.eot, sampler)
        self.logit_filters = self._logit_filters()

    def _logit_filters(self) -> list[LogitFilter]:
        n_vocab = self.model.dims.n_vocab
        filters: list[LogitFilter] = []
        if self.options.suppress_blank:
            filters.append(SuppressBlank(self.tokenizer, self.sample_begin, n_vocab))
        if self.options.suppress_tokens:
            filters.append(SuppressTokens(self._suppress_tokens(), n_vocab))
        if not self.options.without_timestamps:
            precision = CHUNK_LENGTH / self.model.dims.n_audio_ctx  # 0.02 s per audio position
            max_initial_timestamp_index = None
            if self.options.max_initial_timestamp:
                max_initial_timestamp_index = round(self.options.max_initial_timestamp / precision)
            filters.append(
                ApplyTimestampRules(
                    self.tokenizer,
                    self.sample_begin,
                    max_initial_timestamp_index,
                    self.options.fix_monotonic_timestamps,
                    openai_whisper=self.beam_search,
                )
            )
        return filters

    @property
    def beam_search(self) -> bool:
        """Beam search follows openai-whisper's DecodingTask (see the module docstring)."""
        return self.options.beam_size is not None

    @staticmethod
    def _verify_options(options: DecodingOptions) -> DecodingOptions:
        if options.beam_size is not None and options.best_of is not None:
            raise ValueError("beam_size and best_of can't be given together")
        if options.temperature == 0 and options.best_of is not None:
            raise ValueError("best_of with greedy sampling (T=0) is not compatible")
        if options.patience is not None and options.beam_size is None:
            raise ValueError("patience requires beam_size to be given")
        if options.length_penalty is not None and not 0 <= options.length_penalty <= 1:
            raise ValueError("length_penalty (alpha) should be a value between 0 and 1")
        return options

    def _initial_tokens(self) -> tuple[int, ...]:
        tokens = list(self.sot_sequence)
        if prefix := self.options.prefix:
            prefix_tokens = self.tokenizer.encode(" " + prefix.strip()) if isinstance(prefix, str) else prefix
            if self.sample_len is not None:
                # Sliced as the oracle does: with the default sample_len the budget is 0, and
                # [-0:] keeps the whole prefix (a negative budget drops its head).
                prefix_tokens = prefix_tokens[-(self.n_ctx // 2 - self.sample_len) :]
            tokens = tokens + list(prefix_tokens)
        if prompt := self.options.prompt:
            prompt_tokens = self.tokenizer.encode(" " + prompt.strip()) if isinstance(prompt, str) else prompt
            tokens = [self.tokenizer.sot_prev, *prompt_tokens[-(self.n_ctx // 2 - 1) :], *tokens]
        return tuple(tokens)

    def _suppress_tokens(self) -> tuple[int, ...]:
        suppress = self.options.suppress_tokens
        if isinstance(suppress, str):
            suppress = [int(t) for t in suppress.split(",")]
        if -1 in suppress:
            suppress = [t for t in suppress if t >= 0]
            suppress.extend(self.tokenizer.non_speech_tokens)
        elif suppress is None or len(suppress) == 0:
            suppress = []
        else:
            if not isinstance(suppress, list):
                raise TypeError("suppress_tokens must be a list")
            suppress = list(suppress)
        tokenizer = self.tokenizer
        suppress.extend(
            [tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm]
        )
        # the no-speech probability is read separately, from the first step's logits
        suppress.append(tokenizer.no_speech)
        return tuple(sorted(set(suppress)))

    def _audio_features(self, mel: mx.array) -> mx.array:
        if self.options.fp16:
            mel = mel.astype(mx.float16)
        if mel.shape[-2:] == (self.model.dims.n_audio_ctx, self.model.dims.n_audio_state):
            audio_features = mel  # already encoded
        else:
            audio_features = self.model.embed_audio(mel)
        if audio_features.dtype != (mx.float16 if self.options.fp16 else mx.float32):
            raise TypeError(f"audio_features has an incorrect dtype: {audio_features.dtype}")
        return audio_features

    def _detect_language(
        self, audio_features: mx.array, tokens: mx.array
    ) -> tuple[list[str], list[dict[str, float]] | None, mx.array]:
        languages = [self.options.language] * audio_features.shape[0]
        language_probs = None
        if self.options.language is None or self.options.task == "lang_id":
            language_tokens, language_probs = detect_language(self.model, audio_features, self.tokenizer)
            languages = [max(probs, key=probs.get) for probs in language_probs]
            if self.options.language is None:
                tokens = np.array(tokens)
                tokens[:, self.sot_index + 1] = np.array(language_tokens)
                tokens = mx.array(tokens)
        return languages, language_probs, tokens

    def _forced_step(self, step: int, n_batch: int) -> mx.array | None:
        if self.forced_tokens is None:
            return None
        if len(self.forced_tokens) != n_batch:
            raise ValueError(f"teacher forcing: {len(self.forced_tokens)} forced sequences for a batch of {n_batch}")
        # Past a forced sequence's end comes EOT (what an ended sequence appends anyway).
        eot = self.tokenizer.eot
        return mx.array([member[step] if step < len(member) else eot for member in self.forced_tokens], mx.uint32)

    def _step(
        self, inputs: mx.array, audio_features: mx.array, tokens: mx.array, sum_logprobs: mx.array, step: int
    ) -> tuple[mx.array, mx.array, mx.array, mx.array, mx.array]:
        pre_logits = self.inference.logits(inputs, audio_features)
        logits = pre_logits[:, -1]  # the last position only
        step_logits = logits
        for logit_filter in self.logit_filters:
            logits = logit_filter.apply(logits, tokens)
        forced = self._forced_step(step, tokens.shape[0])
        tokens, completed, sum_logprobs = self.decoder.update(tokens, logits, sum_logprobs, forced)
        return tokens, completed, sum_logprobs, pre_logits, step_logits

    def _main_loop(self, audio_features: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        n_batch = tokens.shape[0]
        sum_logprobs = mx.zeros(n_batch)
        tokens, completed, sum_logprobs, pre_logits, step_logits = self._step(
            tokens, audio_features, tokens, sum_logprobs, 0
        )
        probs_at_sot = mx.softmax(pre_logits[:, self.sot_index], axis=-1)
        no_speech_probs = probs_at_sot[:, self.tokenizer.no_speech]
        mx.async_eval(completed, tokens, sum_logprobs, no_speech_probs)
        self.observer.on_step(step_logits, tokens[:, -1], True)

        for step in range(1, self.sample_len):
            if tokens.shape[-1] > self.n_ctx:
                break
            # As the oracle does: this step is queued before the previous one's `completed`
            # is read (the only host read per step: the logit filters read nothing back), so
            # the device computes it while the host waits. A step past the end is therefore
            # computed (and sampled) and then dropped.
            next_tokens, next_completed, next_sum_logprobs, _, step_logits = self._step(
                tokens[:, -1:], audio_features, tokens, sum_logprobs, step
            )
            mx.async_eval(next_completed, next_tokens, next_sum_logprobs)
            self.observer.on_step(step_logits, next_tokens[:, -1], not completed)
            if completed:
                break
            tokens, completed, sum_logprobs = next_tokens, next_completed, next_sum_logprobs
        return tokens, sum_logprobs, no_speech_probs

    def _beam_main_loop(self, audio_features: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """openai-whisper's step loop: no step past the end, and the context check after the update."""
        decoder = self.decoder
        assert isinstance(decoder, BeamSearchDecoder)
        sum_logprobs = mx.zeros(tokens.shape[0])
        no_speech_probs = mx.full((tokens.shape[0],), mx.nan)
        for step in range(self.sample_len):
            pre_logits = self.inference.logits(tokens if step == 0 else tokens[:, -1:], audio_features)
            if step == 0:
                probs_at_sot = mx.softmax(pre_logits[:, self.sot_index], axis=-1)
                no_speech_probs = probs_at_sot[:, self.tokenizer.no_speech]
            step_logits = logits = pre_logits[:, -1]
            for logit_filter in self.logit_filters:
                logits = logit_filter.apply(logits, tokens)
            tokens, completed, sum_logprobs = decoder.update(tokens, logits, sum_logprobs)
            self.observer.on_step(step_logits, tokens[:, -1], True)
            if completed or tokens.shape[-1] > self.n_ctx:
                break
        return tokens, sum_logprobs, no_speech_probs

    def _beam_candidates(
        self, tokens: mx.array, sum_logprobs: mx.array, n_audio: int
    ) -> tuple[list[list[list[int]]], list[list[float]]]:
        """Per audio, the finished sequences (sampled tokens up to EOT) and their sums."""
        decoder = self.decoder
        assert isinstance(decoder, BeamSearchDecoder)
        mx.eval(tokens, sum_logprobs)
        rows = tokens.reshape(n_audio, self.n_group, -1).tolist()
        sums = sum_logprobs.reshape(n_audio, self.n_group).tolist()
        sequences, group_logprobs = decoder.finalize(rows, sums)
        eot = self.tokenizer.eot
        return [[s[self.sample_begin : s.index(eot)] for s in group] for group in sequences], group_logprobs

    def run(self, mel: mx.array) -> list[DecodingResult]:
        self.inference.reset()
        self.decoder.reset()
        tokenizer = self.tokenizer
        n_audio = mel.shape[0]

        audio_features = self._audio_features(mel)
        self.observer.on_audio_features(audio_features)
        tokens = mx.broadcast_to(mx.array(self.initial_tokens), (n_audio, len(self.initial_tokens)))
        languages, language_probs, tokens = self._detect_language(audio_features, tokens)
        if self.options.task == "lang_id":
            return [
                DecodingResult(audio_features=features, language=language, language_probs=probs)
                for features, language, probs in zip(audio_features, languages, language_probs, strict=True)
            ]

        if self.n_group > 1:  # best_of samples or beam rows of every audio, group-major
            tokens = mx.broadcast_to(tokens[:, None, :], [n_audio, self.n_group, len(self.initial_tokens)])
            tokens = tokens.reshape((n_audio * self.n_group, len(self.initial_tokens)))
        self.observer.on_decode_begin(self.initial_tokens, tokens.shape[0], self.options.temperature)

        if self.beam_search:
            tokens, sum_logprobs, no_speech_probs = self._beam_main_loop(audio_features, tokens)
            token_lists, group_logprobs = self._beam_candidates(tokens, sum_logprobs, n_audio)
            self.observer.on_candidates(token_lists, group_logprobs)
            mx.eval(no_speech_probs)
            no_speech = no_speech_probs[:: self.n_group].tolist()
        else:
            tokens, sum_logprobs, no_speech_probs = self._main_loop(audio_features, tokens)
            no_speech_probs = no_speech_probs[:: self.n_group]
            tokens = tokens.reshape(n_audio, self.n_group, -1)
            sum_logprobs = sum_logprobs.reshape(n_audio, self.n_group)
            tokens, sum_logprobs = self.decoder.finalize(tokens, sum_logprobs)
            tokens = tokens[..., self.sample_begin :]
            mx.eval(tokens, sum_logprobs, no_speech_probs)
            token_lists = [[t[: t.index(tokenizer.eot)] for t in group] for group in tokens.tolist()]
            group_logprobs = sum_logprobs.tolist()
            no_speech = no_speech_probs.tolist()
        audio_features = audio_features[:: self.n_group]

        selected = self.sequence_ranker.rank(token_lists, group_logprobs)
        chosen_tokens = [group[i] for i, group in zip(selected, token_lists, strict=True)]
        texts = [tokenizer.decode(t).strip() for t in chosen_tokens]
        chosen_logprobs = [lps[i] for i, lps in zip(selected, group_logprobs, strict=True)]
        avg_logprobs = [lp / (len(t) + 1) for t, lp in zip(chosen_tokens, chosen_logprobs, strict=True)]

        return [
            DecodingResult(
                audio_features=features,
                language=language,
                tokens=toks,
                text=text,
                avg_logprob=avg_logprob,
                no_speech_prob=no_speech_prob,
                temperature=self.options.temperature,
                compression_ratio=compression_ratio(text),
            )
            for text, language, toks, features, avg_logprob, no_speech_prob in zip(
                texts, languages, chosen_tokens, audio_features, avg_logprobs, no_speech, strict=True
            )
        ]


def decode_batch(
    model: Any, mel: mx.array, encoding: tiktoken.Encoding, options: DecodingOptions, hooks: DecodeHooks
) -> list[DecodingResult]:
    """Decode a batch of Mel windows (`[batch, frames, n_mels]`)."""
    h = hooks
    task = DecodingTask(model, options, encoding, sampler=h.sampler, observer=h.observer, forced_tokens=h.forced_tokens)
    return task.run(mel)


decode = decode_entry(decode_batch)
decode.__name__ = decode.__qualname__ = "decode"
decode.__doc__ = """Decode one (`[frames, n_mels]`) or several Mel windows; `kwargs` override `options`."""
