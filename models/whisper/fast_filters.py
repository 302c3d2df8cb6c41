"""logit_filters.py's filters as array operations, for the fast path's compiled decoder step.

`decoding.DecodingTask` applies `SuppressBlank`, `SuppressTokens` and `ApplyTimestampRules`
in Python, building a numpy mask per row from the token list each step: the host has to
read every token before the next step can be built. Here the same three filters are one
function of arrays: the per-step facts the rules read from the token list (how many tokens
were sampled, the last and the penultimate one, the last timestamp) are carried as int32
arrays (`FilterState`) and updated on the device with the chosen token. Every mask is 0 or
-inf, added in decoding.py's order (blank, suppress, timestamps), so the filtered logits
are the same values decoding.py computes from the same logits and tokens
(tests/test_whisper_fast.py checks the masks and the filtered logits bit for bit).

`FastFilters` is plain data (`to_dict` / `from_dict`): the fast path's records carry it per
decode call, so the L2 gate (harness/checks/token_budget.py) can apply the very same rules to the
oracle's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from models.whisper.logit_filters import ApplyTimestampRules, LogitFilter, SuppressBlank, SuppressTokens


class FilterState(NamedTuple):
    """What the filters read from the tokens sampled so far, per batch row (`[B]` int32);
    `n_sampled` is a scalar: every row has sampled as many tokens."""

    n_sampled: mx.array
    last: mx.array  # the last sampled token, -1 before any
    penultimate: mx.array  # the one before it, -1 before two
    last_timestamp: mx.array  # the last sampled timestamp token, -1 before any

    @classmethod
    def initial(cls, n_batch: int) -> FilterState:
        none = mx.full((n_batch,), -1, mx.int32)
        return cls(mx.array(0, mx.int32), none, none, none)

    @classmethod
    def from_sampled(cls, rows: Sequence[Sequence[int]], timestamp_begin: int) -> FilterState:
        """The state after `rows` (each row's sampled tokens, all the same length)."""
        lengths = {len(r) for r in rows}
        if len(lengths) != 1:
            raise ValueError(f"filter state: every row must have sampled as many tokens, got lengths {sorted(lengths)}")
        n = lengths.pop()

        def at(row: Sequence[int], back: int) -> int:
            return int(row[-back]) if n >= back else -1

        def last_ts(row: Sequence[int]) -> int:
            return next((int(t) for t in reversed(row) if t >= timestamp_begin), -1)

        return cls(
            mx.array(n, mx.int32),
            mx.array([at(r, 1) for r in rows], mx.int32),
            mx.array([at(r, 2) for r in rows], mx.int32),
            mx.array([last_ts(r) for r in rows], mx.int32),
        )

    def advance(self, tokens: mx.array, timestamp_begin: int) -> FilterState:
        """The state once `tokens` (`[B]`) are appended."""
        tokens = tokens.astype(mx.int32)
        return FilterState(
            self.n_sampled + 1,
            tokens,
            self.last,
            mx.where(tokens >= timestamp_begin, tokens, self.last_timestamp),
        )


@dataclass(frozen=True)
class TimestampRules:
    """ApplyTimestampRules' parameters."""

    begin: int  # the first timestamp token
    eot: int
    no_timestamps: int
    max_initial_index: int | None
    fix_monotonic: bool


@dataclass(frozen=True)
class FastFilters:
    """The logit filters of one decode call (None: that filter is not applied)."""

    n_vocab: int
    blank: tuple[int, ...] | None  # SuppressBlank's tokens (at the first sampled step only)
    suppress: tuple[int, ...] | None  # SuppressTokens' tokens (every step)
    timestamps: TimestampRules | None

    @classmethod
    def from_decoding(cls, filters: Sequence[LogitFilter], n_vocab: int) -> FastFilters:
        """The same rules as decoding.py's filter list (DecodingTask.logit_filters)."""
        blank = suppress = timestamps = None
        for f in filters:
            if isinstance(f, SuppressBlank):
                blank = _masked(f.mask)
            elif isinstance(f, SuppressTokens):
                suppress = _masked(f.mask)
            elif isinstance(f, ApplyTimestampRules):
                t = f.tokenizer
                timestamps = TimestampRules(
                    t.timestamp_begin, t.eot, t.no_timestamps, f.max_initial_timestamp_index, f.fix_monotonic_timestamps
                )
            else:
                raise TypeError(f"the fast path has no array form of logit filter {type(f).__name__}")
        order = [type(f) for f in filters]
        expected = [c for c in (SuppressBlank, SuppressTokens, ApplyTimestampRules) if c in order]
        if order != expected:
            raise ValueError(f"logit filters in order {[c.__name__ for c in order]}, the fast path applies {expected}")
        return cls(n_vocab, blank, suppress, timestamps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "blank": list(self.blank) if self.blank is not None else None,
            "suppress": list(self.suppress) if self.suppress is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FastFilters:
        try:
            ts = data["timestamps"]
            return cls(
                int(data["n_vocab"]),
                tuple(int(t) for t in data["blank"]) if data["blank"] is not None else None,
                tuple(int(t) for t in data["suppress"]) if data["suppress"] is not None else None,
                TimestampRules(**ts) if ts is not None else None,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"fast filters: malformed description {data!r} ({type(e).__name__}: {e})") from None

    def masks(self) -> dict[str, mx.array]:
        """The constant additive masks (`[n_vocab]` float32, 0 or -inf)."""
        out = {}
        for name in ("blank", "suppress"):
            ids = getattr(self, name)
            if ids is not None:
                mask = np.zeros(self.n_vocab, np.float32)
                mask[list(ids)] = -np.inf
                out[name] = mx.array(mask)
        return out

    def apply(self, logits: mx.array, state: FilterState, masks: dict[str, mx.array] | None = None) -> mx.array:
        """`logits` (`[B, n_vocab]` float32, before any filter) after every filter."""
        masks = masks if masks is not None else self.masks()
        if self.blank is not None:
            logits = mx.where(state.n_sampled == 0, logits + masks["blank"], logits)
        if self.suppress is not None:
            logits = logits + masks["suppress"]
        if self.timestamps is not None:
            forbid = self.timestamp_forbidden(logits, state)
            logits = logits + mx.where(forbid, mx.array(-mx.inf, mx.float32), mx.array(0.0, mx.float32))
        return logits

    def timestamp_forbidden(self, logits: mx.array, state: FilterState) -> mx.array:
        """`[B, n_vocab]` bool: what ApplyTimestampRules masks, given the logits it receives."""
        rules = self.timestamps
        assert rules is not None
        vocab = mx.arange(self.n_vocab)[None]
        is_timestamp = vocab >= rules.begin
        last_ts = ((state.n_sampled >= 1) & (state.last >= rules.begin))[:, None]
        penultimate_ts = ((state.n_sampled < 2) | (state.penultimate >= rules.begin))[:, None]
        forbid = vocab == rules.no_timestamps
        forbid = forbid | (last_ts & penultimate_ts & is_timestamp)  # a pair closed: text or EOT next
        forbid = forbid | (last_ts & ~penultimate_ts & (vocab < rules.eot))  # a pair open: its closing timestamp
        if rules.fix_monotonic:
            seen = (state.last_timestamp >= 0)[:, None]
            bound = mx.where(
                last_ts & ~penultimate_ts, state.last_timestamp[:, None], state.last_timestamp[:, None] + 1
            )
            forbid = forbid | (seen & is_timestamp & (vocab < bound))
        initial = ~is_timestamp
        if rules.max_initial_index is not None:
            initial = initial | (vocab > rules.begin + rules.max_initial_index)
        forbid = forbid | ((state.n_sampled == 0) & initial)
        timestamp_logprob, max_text_logprob = self.timestamp_logprobs(logits)
        forbid = forbid | ((timestamp_logprob > max_text_logprob)[:, None] & ~is_timestamp)
        return forbid

    def timestamp_logprobs(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """`[B]` each: the timestamps' total log-probability and the best text token's; the
        first above the second forces a timestamp. `logits` as ApplyTimestampRules receives
        them (blank and suppressed tokens masked)."""
        assert self.timestamps is not None
        begin = self.timestamps.begin
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return logprobs[:, begin:].logsumexp(axis=-1), logprobs[:, :begin].max(axis=-1)

    def before_timestamp_rules(self, logits: mx.array, state: FilterState) -> mx.array:
        """The logits as ApplyTimestampRules receives them (blank and suppress applied)."""
        return FastFilters(self.n_vocab, self.blank, self.suppress, None).apply(logits, state)


def _masked(mask: mx.array) -> tuple[int, ...]:
    return tuple(int(i) for i in np.flatnonzero(np.isneginf(np.array(mask))))
