"""What the judges make of every field an oracle writes: each one is compared by a judge, or
listed here, with its reason, as deliberately ignored. Nothing an oracle records is dropped
without a word.

The fields walked are the record's own and those of its lists of objects (turns, batch rows,
decode calls and their finished candidates, step entries), named as `decode_calls[].beam`.
A field is compared when docs/records.md names it (harness/records_schema.py: kept in the
record, judged by the checks in harness/checks) and it is not in `IGNORED_FIELDS`.
`check_fields` refuses an oracle's output (harness/records.py `read_generator_output`) holding
a field that is neither, naming it and this table: a new field is judged or explained before
any golden holds it. tests/test_records_fields.py keeps the table true: every entry is written
by the generator sources it names, every field of the tracked goldens is compared or listed.

Imports nothing of the harness but its errors and the records interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.errors import RecordError
from harness.records_schema import BATCH_ROW, CANDIDATE, DECODE_CALL, RECORD_FIELDS, STEP, TURN, Rule


def _names(rule: Rule) -> frozenset[str]:
    return frozenset(name for name, _, _ in rule.fields or ())


# The objects walked, by path ("" is the record itself), and the fields the interface names there.
LEVELS: dict[str, frozenset[str]] = {
    "": frozenset(name for name, _, _ in RECORD_FIELDS),
    "turns[]": _names(TURN),
    "rows[]": _names(BATCH_ROW),
    "decode_calls[]": _names(DECODE_CALL),
    "decode_calls[].candidates[]": _names(CANDIDATE),
    "step_info[]": _names(STEP),
}


@dataclass(frozen=True)
class Ignored:
    reason: str  # why no judge compares it
    written_by: tuple[str, ...]  # the generator sources that write it (repository paths)


_LM = "oracles/mlx-lm/generate.py"
_OPTIQ = "oracles/mlx-optiq/generate.py"
_WHISPER = "oracles/common/whisper_run.py"

IGNORED_FIELDS: dict[str, Ignored] = {
    "logits_dtype": Ignored(
        "the dtype of the oracle's logits before the float32 cast: the logits gates compare the float32 rows' "
        "bits, which a dtype change moves",
        ("oracles/common/lm_steps.py",),
    ),
    "prefill_calls": Ignored(
        "how many model calls the oracle's prefill took (its prefill_step_size chunks): how it ran, not what it "
        "computed; every row's logits are compared",
        (_LM, _OPTIQ),
    ),
    "prefill_input_shapes": Ignored(
        "the input shapes of the oracle's batched prefill calls, which its capture reads to tell prefill from "
        "decode rows; the rows themselves are compared",
        (_LM,),
    ),
    "cache_types": Ignored(
        "the class names of the oracle's KV caches: what a cache does shows in every step's logits (and, for "
        "draft and composed runs, in step_info's cache digests)",
        (_LM, _OPTIQ),
    ),
    "composition": Ignored("the scenario's composition echoed from the spec: an input, not a result", (_OPTIQ,)),
    "ngram_stats": Ignored(
        "n-gram drafting totals over the run: step_info holds the per-step drafted / accepted counts the "
        "draft_stats gate compares",
        (_OPTIQ,),
    ),
    "options": Ignored("the transcribe options echoed from the spec: an input, not a result", (_WHISPER,)),
    "thresholds": Ignored(
        "transcribe's fallback thresholds as the capture applied them: inputs; the decisions they lead to are "
        "compared (fallback_decisions)",
        (_WHISPER,),
    ),
    "audio": Ignored(
        "how the oracle read the clip (samples, mel frames, whether the decoded audio equals the WAV's PCM): "
        "the mel gate compares the spectrogram computed from it",
        (_WHISPER,),
    ),
    "turns[].prefill_calls": Ignored(
        "how many model calls a turn's prefill took: how the oracle ran; the turn's rows are compared", (_LM,)
    ),
    "turns[].cache_offset_after": Ignored(
        "the oracle's cache length after a turn: it follows from the turn's prompt and steps, all compared, and "
        "a cache that kept other entries shows in the next turn's logits",
        (_LM,),
    ),
    "decode_calls[].beam": Ignored(
        "whether the call ran beam search: an echo of the options (beam_size); decode_tokens compares every "
        "beam row's token",
        ("oracles/openai-whisper/generate.py",),
    ),
}


def _key(level: str, name: str) -> str:
    return f"{level}.{name}" if level else name


def compared(level: str) -> frozenset[str]:
    """The fields of `level` a judge compares."""
    return frozenset(name for name in LEVELS[level] if _key(level, name) not in IGNORED_FIELDS)


def unlisted(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(the path of each field of `meta` neither compared nor listed, its table key), in order."""
    out: list[tuple[str, str]] = []

    def visit(obj: dict[str, Any], level: str, path: str) -> None:
        for name, value in obj.items():
            key = _key(level, name)
            if name not in LEVELS[level] and key not in IGNORED_FIELDS:
                out.append((f"{path}.{name}" if path else name, key))
            child = f"{key}[]"
            if child in LEVELS and isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, dict):
                        visit(item, child, f"{path}.{name}[{i}]" if path else f"{name}[{i}]")

    visit(meta, "", "")
    return out


def check_fields(meta: dict[str, Any], where: str) -> None:
    """Raise a RecordError naming the first field of an oracle's record that no judge compares
    and `IGNORED_FIELDS` does not list."""
    found = unlisted(meta)
    if found:
        path, key = found[0]
        raise RecordError(
            f"{where}: {path}: a field the oracle writes that no judge compares and harness/records_fields.py "
            f"IGNORED_FIELDS does not list: judge it (its rule in harness/records_schema.py and a check in "
            f"harness/checks) or list {key!r} there with the reason no judge needs it"
        )
