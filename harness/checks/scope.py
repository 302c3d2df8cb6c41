"""Where each check applies: the registry row's `applies` (named on a scenario it cannot judge)
and `wanted` (not named on a scenario that asks for it) hooks. Each takes (profile, scenario)
and returns why not, as the tail of the profile error after "scenarios[i]", or None.
harness/profile/load.py calls them for every row of the profile's implementation; no other
module of the profile asks which check it is looking at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Scope = Callable[[Any, Any], "str | None"]


def plain_or_chat(s: Any) -> bool:
    return s.kind in ("plain", "chat") and not s.turns and not s.composition


def compiled_applies(profile: Any, s: Any) -> str | None:
    if s.kind not in ("plain", "chat") or s.composition:  # chat turns included: the cache kept across them
        return ".checks: compiled_decode runs plain and chat scenarios (turns included) only"
    eager_only = [k for k in ("kv_bits", "max_kv_size") if getattr(s, k) is not None]
    if eager_only:
        return (
            f".checks: compiled_decode with {' and '.join(eager_only)}: that cache is not compiled, "
            "the run would be the eager loop judged twice; drop the check or the option"
        )
    return None


def draft_stats_applies(profile: Any, s: Any) -> str | None:
    if (s.composition or {}).get("kind") != "ngram_draft":
        return ".checks: draft_stats needs a composition of kind 'ngram_draft'"
    return None


def speculative_applies(profile: Any, s: Any) -> str | None:
    return ".checks: speculative needs a 'draft' scenario" if s.draft is None else None


def response(given: bool) -> Scope:
    def why(profile: Any, s: Any) -> str | None:
        if (s.response is not None) == given:
            return None
        return (
            ": the response check needs the scenario's 'response:' key and the key needs the check "
            f"(response: {'given' if s.response is not None else 'absent'}, checks: {profile.checks(s)})"
        )

    return why


def token_budget(named: bool) -> Scope:
    """Both ways: a budgeted in-tree composition runs the token budget, and only such a scenario."""

    def why(profile: Any, s: Any) -> str | None:
        if bool(profile.intree_composition(s)) == named:
            return None
        return (
            ".checks: token_budget judges an in-tree composition with a budget "
            "(composition kind whisper-fast), and such a scenario must run it"
        )

    return why


def writers_wanted(profile: Any, s: Any) -> str | None:
    return ".writer_options: only meaningful with the writers check" if s.writer_options else None


def streamed_wanted(profile: Any, s: Any) -> str | None:
    if s.stream_chunks is not None:
        return ".stream_chunks: only meaningful with the streamed_transcript check"
    return None


def streamed_applies(profile: Any, s: Any) -> str | None:
    if s.composition is not None:
        return ".checks: streamed_transcript streams the reference path, not a composition"
    return None


def compiled_wanted(profile: Any, s: Any) -> str | None:
    """A compiled variant asked for where no compiled_decode check would run it."""
    if getattr(s, "compiled_variant", None) is not None:
        return ".compiled_variant: picks the compiled_decode check's variant; the scenario does not declare that check"
    return None
