"""Every field an oracle's generator writes is either part of the record (judged by the gates)
or listed here as deliberately ignored, with the reason (docs/records.md, "Generator notes").

`read_generator_output` refuses an oracle's record carrying a field that is neither, naming it:
a new field a generator starts writing (a pinned library's new output, a generator edited to
record more) is either taken into the record and compared, or listed here with why not — it is
never dropped unseen. An implementation's own records (a plug-in's, docs/protocol.md) may carry
notes of their own: only the oracles' are held to this list.

Imports nothing of the harness but its errors and the records interface.
"""

from __future__ import annotations

from typing import Any

from harness.errors import RecordError
from harness.records_schema import RECORD_FIELDS

# name -> why no gate compares it. Each reason says where what the field tells is judged instead
# (or why it is only an echo of the scenario), so that ignoring it loses nothing a user sees.
IGNORED_FIELDS: dict[str, str] = {
    "logits_dtype": "the model's logits dtype before the float32 cast: the logits' bits are compared, and the "
    "in-tree side's dtype shows in them",
    "prefill_calls": "how many model calls the prompt took: set by the scenario's prefill_step_size; what the "
    "chunking computes is compared through every row's logits",
    "cache_types": "the oracle library's cache class names, which an implementation need not share: what the "
    "cache holds is compared through the logits of every later step",
    "prefill_input_shapes": "mlx-lm's padded batch input shapes: each batch row's tokens and logits are compared",
    "composition": "the scenario's composition echoed as mlx-optiq ran it: an echo of the profile's input",
    "ngram_stats": "mlx-optiq's n-gram drafter's totals: the per-step drafted and accepted counts they sum are "
    "compared in step_info",
    "options": "transcribe's keyword arguments as run, built from the scenario: an echo of the input; their "
    "effect is compared in decode_calls and transcript",
    "thresholds": "the three fallback thresholds, from the scenario: an echo; each decode call's fallback "
    "decision is compared in decode_calls",
    "audio": "the clip's sample and mel frame counts and whether its decode equals the WAV's PCM: the mel "
    "array itself is compared bit for bit",
}

RECORD_FIELD_NAMES = frozenset(name for name, _rule, _required in RECORD_FIELDS)


def unlisted_fields(meta: dict[str, Any]) -> list[str]:
    """The fields of a record's meta that are neither the record's nor listed as ignored."""
    return sorted(k for k in meta if k not in RECORD_FIELD_NAMES and k not in IGNORED_FIELDS)


def check_listed(meta: dict[str, Any], where: str) -> None:
    """Raise a RecordError naming every field an oracle wrote that no gate compares and that is
    not listed as deliberately ignored."""
    unlisted = unlisted_fields(meta)
    if unlisted:
        raise RecordError(
            f"{where}: the oracle wrote field(s) {', '.join(map(repr, unlisted))} that no gate compares and "
            "harness/records_fields.py IGNORED_FIELDS does not list: compare them (docs/records.md) or list "
            "each with the reason it may be ignored"
        )
