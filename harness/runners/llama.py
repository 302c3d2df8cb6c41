"""The in-tree universal Llama, run in this process over a scenario spec."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InTreeLoadError, InTreeRunError
from harness.profile import GENERATION_OPTIONS
from harness.progress import progress
from harness.records import ScenarioRecord
from harness.runners import ModelHook


class LlamaRunner:
    """Runs the in-tree universal Llama over a scenario spec, free-running or teacher-forced.

    Teacher-forced, every segment (the whole scenario, a turn, a batch row) is fed the
    golden's tokens of that segment.
    """

    def __init__(self, model_dir: Path, model_hook: ModelHook | None = None, label: str = ""):
        from models.universal import ChatTokenizer, load_model

        try:
            self.model, self.config = load_model(model_dir)
            self.tokenizer = ChatTokenizer.from_dir(model_dir)
        except ValueError as e:  # the models' own load errors name the tensors / keys
            raise InTreeLoadError(f"in-tree universal-llama cannot load {model_dir}: {e}") from None
        if model_hook is not None:
            model_hook(self.model)  # tests perturb the model here to prove the gates fail
        self.label = label
        self.model_dir = model_dir
        self._stream = None

    def encode(self, spec: dict[str, Any]) -> tuple[str | None, list[int]]:
        if spec.get("messages") is not None:
            # As mlx-lm's tokenizer wrapper renders (the oracle is mlx-lm, not transformers): with
            # no explicit enable_thinking it passes whether the vocabulary has thinking markers.
            rendered = self.tokenizer.render_chat_like_mlx_lm(
                spec["messages"], add_generation_prompt=True, **spec.get("template_kwargs", {})
            )
            return rendered, self.tokenizer.encode(rendered, add_special_tokens=False)
        return None, self.tokenizer.encode(spec["prompt"], add_special_tokens=True)

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None, decode: str = "eager") -> ScenarioRecord:
        """One run of a scenario; `decode="compiled"` decodes with the compiled single-token step
        (plain and chat scenarios), which must give the eager loop's bits."""
        mode = "teacher_forced" if forced is not None else "free"
        if decode not in ("eager", "compiled"):
            raise ValueError(f"decode: expected 'eager' or 'compiled', got {decode!r}")
        if decode == "compiled" and any(spec.get(k) is not None for k in ("batch", "composition")):
            raise ValueError(f"{spec['id']}: the compiled decode runs plain and chat scenarios (turns included) only")
        self._progress = (
            f"{self.label}{spec['id']} ({mode}{', compiled' if decode == 'compiled' else ''})",
            time.perf_counter(),
        )
        if spec.get("turns") is not None:
            return self._run_turns(spec, forced, mode, compiled=decode == "compiled")
        if spec.get("draft") is not None:
            from harness.runners.speculative import run_draft

            return run_draft(self, spec, forced)
        if spec.get("batch") is not None:
            return self._run_batch(spec, forced, mode)
        rendered, prompt_ids = self.encode(spec)
        forced_tokens = forced.tokens if forced is not None else None
        stop = set(self.tokenizer.eos_token_ids) if spec.get("stop") == "eos" else None
        if stop is not None and forced_tokens is not None:
            spec = spec | {"n_tokens": len(forced_tokens)}  # forced along the oracle's run, as long as it ran
        if spec.get("composition") is not None:
            from models.universal.composed import composed_steps

            steps = composed_steps(
                self.model,
                prompt_ids,
                spec["n_tokens"],
                spec["composition"],
                prefill_step_size=spec["prefill_step_size"],
                forced_tokens=forced_tokens,
                forced_prefix=spec.get("forced_prefix"),
            )
            rows, tokens, infos = self._collect(steps, spec["n_tokens"])
            extra = {"step_info": infos}
        elif decode == "compiled":
            from models.universal.compiled import DecodeReport

            report = DecodeReport()
            steps = self._greedy(spec, prompt_ids, forced_tokens, compiled=True, report=report)
            rows, tokens, _ = self._collect(steps, spec["n_tokens"], stop=stop)
            extra = {"compiled_variant": _compiled_variant(spec, [report])}
        else:
            steps = self._greedy(spec, prompt_ids, forced_tokens)
            rows, tokens, _ = self._collect(steps, spec["n_tokens"], stop=stop)
            extra = {}
        if stop is not None:  # stream_generate's words for why the run ended
            extra["finish_reason"] = "stop" if tokens and tokens[-1] in stop else "length"
        if spec.get("response") is not None:  # the `response` check: mlx-lm server's split of the tokens
            from harness.runners.response import intree_response

            extra["server_response"] = intree_response(self.tokenizer, self.model_dir, spec, prompt_ids, tokens)
        return self._record(spec, mode, rendered, prompt_ids, tokens, rows, extra)

    def _greedy(
        self,
        spec: dict[str, Any],
        prompt_ids: list[int],
        forced_tokens: list[int] | None,
        compiled: bool = False,
        report: Any = None,
    ):
        from models.universal import greedy_steps
        from models.universal.compiled import compiled_greedy_steps

        options = {name: spec[name] for name in GENERATION_OPTIONS if spec.get(name) is not None}
        if compiled:
            options |= {"report": report, "variant": spec.get("compiled_variant") or "auto"}
        return (compiled_greedy_steps if compiled else greedy_steps)(
            self.model,
            prompt_ids,
            spec["n_tokens"],
            prefill_step_size=spec["prefill_step_size"],
            forced_tokens=forced_tokens,
            **options,
        )

    def _collect(
        self, steps: Any, n_tokens: int, done: int = 0, total: int | None = None, stop: set[int] | None = None
    ):
        """Every step's logits row and token; with `stop` (EOS ids) the loop ends after the
        first of them, as mlx-lm's stream_generate ends."""
        import mlx.core as mx

        rows, tokens, infos = [], [], []
        label, started = self._progress
        for step in steps:
            rows.append(np.array(step.logits.astype(mx.float32)).reshape(-1))
            tokens.append(int(step.token))
            infos.append(dict(getattr(step, "info", {}) or {}))
            progress.step(label, done + len(tokens), total or n_tokens, started)
            if stop is not None and tokens[-1] in stop:
                break
        if hasattr(steps, "close"):
            steps.close()
        return rows, tokens, infos

    def _run_turns(
        self, spec: dict[str, Any], forced: ScenarioRecord | None, mode: str, compiled: bool = False
    ) -> ScenarioRecord:
        """mlx-lm's chat: one cache across turns, each turn's new messages rendered alone;
        `compiled`: each turn decoded by the compiled loop on the kept cache."""
        from models.universal import chat_turn_steps

        encoded = [
            self.encode({"messages": messages, "template_kwargs": spec.get("template_kwargs", {})})
            for messages in spec["turns"]
        ]
        options = {name: spec[name] for name in GENERATION_OPTIONS if spec.get(name) is not None}
        if not compiled:
            return self._run_segments(spec, forced, mode, encoded, chat_turn_steps, "turns", **options)
        from models.universal.compiled import DecodeReport, compiled_greedy_steps

        reports: list[DecodeReport] = []

        def compiled_turn(*args: Any, **kwargs: Any) -> Any:
            reports.append(DecodeReport())
            variant = spec.get("compiled_variant") or "auto"
            return compiled_greedy_steps(*args, report=reports[-1], variant=variant, **kwargs)

        record = self._run_segments(
            spec, forced, mode, encoded, chat_turn_steps, "turns", decode=compiled_turn, **options
        )
        record.extra["compiled_variant"] = _compiled_variant(spec, reports)
        return record

    def _run_batch(self, spec: dict[str, Any], forced: ScenarioRecord | None, mode: str) -> ScenarioRecord:
        """mlx-lm's batch generation: the rows decoded together, recorded row after row."""
        from models.universal.batch import batch_greedy_steps

        encoded = [self.encode(row | {"template_kwargs": spec.get("template_kwargs", {})}) for row in spec["batch"]]
        return self._run_segments(spec, forced, mode, encoded, batch_greedy_steps, "rows")

    def _run_segments(self, spec, forced, mode, encoded, steps_fn, key: str, **options: Any) -> ScenarioRecord:
        """Segments (turns, batch rows) of n tokens each, forced where a golden is given."""
        n = spec["n_tokens"]
        forced_tokens = (
            [forced.tokens[i * n : (i + 1) * n] for i in range(len(encoded))] if forced is not None else None
        )
        per_segment = steps_fn(
            self.model,
            [ids for _, ids in encoded],
            n,
            prefill_step_size=spec["prefill_step_size"],
            forced_tokens=forced_tokens,
            **options,
        )
        return self._segments_record(spec, mode, encoded, per_segment, key)

    def _segments_record(self, spec, mode, encoded, per_segment, key: str) -> ScenarioRecord:
        n = spec["n_tokens"]
        rows, tokens, meta = [], [], []
        for (rendered, ids), steps in zip(encoded, per_segment, strict=True):
            seg_rows, seg_tokens, _ = self._collect(steps, n, len(tokens), n * len(encoded))
            meta.append({"rendered_prompt": rendered, "prompt_ids": ids, "n_steps": n, "row_offset": len(tokens)})
            rows += seg_rows
            tokens += seg_tokens
        first = meta[0]
        return self._record(spec, mode, first["rendered_prompt"], first["prompt_ids"], tokens, rows, {key: meta})

    def stream_text(self, spec: dict[str, Any], tokens: list[int], extra: dict[str, Any]) -> list[dict[str, Any]]:
        """Per segment, the in-tree streaming detokenizer's pieces (as mlx-lm's stream_generate
        hands them out) and the tokenizer's decode of the tokens it was given."""
        from models.universal.detokenize import stream_for, stream_pieces

        if self._stream is None:
            self._stream = stream_for(self.model_dir, self.tokenizer)
        stop = set(self.tokenizer.eos_token_ids) if spec.get("stop") == "eos" else set()
        segments = next(
            (extra[k] for k in ("turns", "rows") if k in extra), [{"row_offset": 0, "n_steps": len(tokens)}]
        )
        out = []
        for segment in segments:
            seg = tokens[segment["row_offset"] : segment["row_offset"] + segment["n_steps"]]
            fed = next((i for i, t in enumerate(seg) if t in stop), len(seg))
            out.append({"pieces": stream_pieces(self._stream, seg, stop), "decoded": self.tokenizer.decode(seg[:fed])})
        return out

    def _record(self, spec, mode, rendered, prompt_ids, tokens, rows, extra) -> ScenarioRecord:
        extra = extra | {"stream_text": self.stream_text(spec, tokens, extra)}
        return ScenarioRecord(
            scenario_id=spec["id"],
            rendered_prompt=rendered,
            prompt_ids=list(prompt_ids),
            tokens=tokens,
            logits=np.stack(rows),
            eos_ids=sorted(self.tokenizer.eos_token_ids),
            mode=mode,
            extra=extra,
        )


def _compiled_variant(spec: dict[str, Any], reports: list[Any]) -> str:
    """The compiled variant every run (turn) took; never judge the eager loop under the
    compiled check's name."""
    for report in reports:
        if not report.compiled:
            raise InTreeRunError(
                f"{spec['id']}: the compiled decode fell back to the eager loop ({'; '.join(report.reasons)})"
            )
    variants = sorted({report.variant for report in reports})
    return variants[0] if len(variants) == 1 else "+".join(variants)
