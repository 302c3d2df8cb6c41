"""The in-tree Whisper's transcribe, run in this process over a speech scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InTreeLoadError
from harness.progress import progress
from harness.records import ScenarioRecord
from harness.runners import ModelHook
from harness.timing import clock


class WhisperRunner:
    """Runs the in-tree Whisper's transcribe over a speech scenario, free-running or teacher-forced.

    Teacher-forced, each decode call is fed the golden's tokens for that call (and follows
    the golden's windows and temperatures), so every logits row is judged on the oracle's path.
    """

    def __init__(self, model_dir: Path, model_hook: ModelHook | None = None, label: str = ""):
        self.model_dir = model_dir
        self.model_hook = model_hook
        self.label = label
        self._models: dict[bool, Any] = {}

    @property
    def model(self) -> Any:
        """The float32-dtype model (what tests and mutants perturb), loaded on first use."""
        return self.model_for(fp16=False)

    def _inputs(self, spec: dict[str, Any]) -> tuple[Any, Path, str, dict[str, Any]]:
        """What a transcription of the scenario is given: the model at its fp16 option, the
        model directory, the clip, and the options with the scenario's seed."""
        options = dict(spec["options"]) | {"seed": spec["seed"]}
        return self.model_for(bool(spec["options"].get("fp16", False))), self.model_dir, spec["audio"], options

    def model_for(self, fp16: bool) -> Any:
        """The model as mlx-whisper's transcribe builds it for the option: float16 positional
        tables and masks with fp16, float32 without; the weights keep their stored dtype."""
        import mlx.core as mx

        from models.whisper.load import load_model

        if fp16 not in self._models:
            try:
                with clock.phase("in-tree load"):
                    model = load_model(self.model_dir, dtype=mx.float16 if fp16 else mx.float32)
            except ValueError as e:
                raise InTreeLoadError(f"in-tree whisper cannot load {self.model_dir}: {e}") from None
            if self.model_hook is not None:
                self.model_hook(model)
            self._models[fp16] = model
        return self._models[fp16]

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None) -> ScenarioRecord:
        from harness.runners.whisper_record import transcribe_record

        if (spec.get("composition") or {}).get("kind") == "whisper-fast":
            from harness.runners.whisper_record import fast_transcribe_record as transcribe_record  # noqa: F811

        mode = "teacher_forced" if forced is not None else "free"
        with progress.task(f"{self.label}{spec['id']} ({mode}): in-tree transcribe"):
            forced_calls = forced.extra.get("decode_calls") if forced is not None else None
            out = transcribe_record(*self._inputs(spec), forced=forced_calls)
        return self._scenario_record(spec, out, mode)

    def run_streamed(self, spec: dict[str, Any], chunk_seconds: float) -> ScenarioRecord:
        """The scenario through `models.whisper.stream`, fed `chunk_seconds` of samples at a time
        (the record's `extra["stream"]` says how many windows it decoded before `finish`)."""
        from harness.runners.whisper_record import streamed_transcribe_record
        from models.whisper.audio import SAMPLE_RATE

        with progress.task(f"{self.label}{spec['id']} (streamed, {chunk_seconds:g} s chunks): in-tree transcribe"):
            out = streamed_transcribe_record(*self._inputs(spec), round(chunk_seconds * SAMPLE_RATE))
        record = self._scenario_record(spec, out, "free")
        record.extra["stream"] = out["stream"]
        return record

    @staticmethod
    def _scenario_record(spec: dict[str, Any], out: dict[str, Any], mode: str) -> ScenarioRecord:
        calls = out["decode_calls"]
        return ScenarioRecord(
            scenario_id=spec["id"],
            rendered_prompt=None,
            prompt_ids=list(calls[0]["initial_tokens"]) if calls else [],
            tokens=[int(t) for t in out["tokens"]],
            logits=np.asarray(out["logits"], dtype=np.float32).reshape(len(out["tokens"]), -1),
            eos_ids=sorted(int(t) for t in out["eos_ids"]),
            mode=mode,
            arrays={"mel": np.asarray(out["mel"]), "encoder": np.asarray(out["encoder"])},
            extra={"decode_calls": calls, "transcript": out["transcript"]},
        )
