"""The in-tree side of the `response` check: models.universal.response over the run's tokens
and over each forced text of the scenario's `response:` (encoded by the in-tree tokenizer;
the check compares those ids with the oracle's before anything else)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import InTreeRunError


def intree_response(tokenizer: Any, model_dir: Path, spec: dict[str, Any], prompt_ids: list[int], tokens: list[int]):
    from models.universal.errors import TokenizerError
    from models.universal.response import ResponseBuilder, tool_format

    config = model_dir / "tokenizer_config.json"
    settings = json.loads(config.read_text(encoding="utf-8")) if config.exists() else {}
    try:
        tools = spec.get("template_kwargs", {}).get("tools") or None
        builder = ResponseBuilder(tokenizer, tools, tool_format(tokenizer, settings))
        generated = builder.answer(prompt_ids, tokens, spec["n_tokens"])
        forced = []
        for item in spec["response"].get("forced", []):
            ids = tokenizer.encode(item["text"], add_special_tokens=False)
            answer = builder.answer(prompt_ids, ids, len(ids))
            forced.append({"id": item["id"], "text": item["text"], "ids": ids} | answer)
    except (TokenizerError, ValueError) as e:
        raise InTreeRunError(f"{spec['id']}: response: {e}") from None
    return {"generated": generated, "forced": forced}
