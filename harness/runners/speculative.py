"""The in-tree side of a `draft` scenario: models/universal/speculative.py over the runner's
model (the target) and the draft, recorded as the mlx-lm oracle records
speculative_generate_step (oracles/common/lm_speculative.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InTreeLoadError, InTreeRunError
from harness.records import ScenarioRecord


def _rows(arrays: list[Any]) -> np.ndarray:
    import mlx.core as mx

    return np.stack([np.array(a.astype(mx.float32)).reshape(-1) for a in arrays])


def draft_model(runner: Any, draft: dict[str, Any]) -> Any:
    """The target itself (`artifact: target`) or the model at the draft's resolved model_dir."""
    if draft.get("artifact") == "target":
        return runner.model
    from models.universal import load_model

    path = draft.get("model_dir")
    if not path:
        raise InTreeRunError("draft: the spec carries no resolved model_dir (run it through the session)")
    drafts = runner.__dict__.setdefault("_drafts", {})
    if path not in drafts:
        try:
            drafts[path] = load_model(Path(path))[0]
        except ValueError as e:
            raise InTreeLoadError(f"in-tree universal-llama cannot load the draft {path}: {e}") from None
    return drafts[path]


def run_draft(runner: Any, spec: dict[str, Any], forced: ScenarioRecord | None) -> ScenarioRecord:
    from models.universal.speculative import speculative_generate

    if forced is not None:
        raise InTreeRunError(f"{spec['id']}: a draft scenario has no teacher-forced run (the draft decides the feed)")
    rendered, prompt_ids = runner.encode(spec)
    run = speculative_generate(
        runner.model,
        draft_model(runner, spec["draft"]),
        prompt_ids,
        spec["n_tokens"],
        spec["draft"]["num_draft_tokens"],
        prefill_step_size=spec["prefill_step_size"],
    )
    record = runner._record(
        spec, "free", rendered, prompt_ids, run.tokens, _rows(run.rows), {"step_info": run.step_info}
    )
    record.arrays["verify_logits"] = _rows(run.verify_rows)
    return record
