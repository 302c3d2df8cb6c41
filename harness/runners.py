"""Runners produce records; they never judge. One interface for both sides.

- `OracleRunner` runs an oracle's generator script inside its own venv (`python -I`, so the
  repository is not importable there) and talks to it through files only.
- `InTreeRunner` runs the in-tree implementation in this process.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InTreeLoadError, InTreeRunError, OracleError, OracleVersionError
from harness.paths import cache_root
from harness.profile import GENERATION_OPTIONS
from harness.progress import progress
from harness.provenance import classify_blas, device_facts
from harness.records import ScenarioRecord, read_generator_output
from harness.venvs import MLX_FREE_ORACLES, OracleEnv, check_same_mlx, ensure_oracle_env

ModelHook = Callable[[Any], None]


class OracleRunner:
    def __init__(self, oracle: str):
        self.oracle = oracle
        self._env: OracleEnv | None = None

    @property
    def env(self) -> OracleEnv:
        if self._env is None:
            self._env = ensure_oracle_env(self.oracle)
        return self._env

    def run(
        self, model_dir: Path, specs: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, ScenarioRecord], dict[str, str]]:
        """Generate oracle records for `specs`: (oracle environment, records by id, oracle errors by id)."""
        facts = device_facts()
        check_same_mlx(self.env, facts.mlx)
        (cache_root() / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="oracle-", dir=cache_root() / "tmp") as tmp:
            work = Path(tmp)
            spec_path = work / "spec.json"
            spec_path.write_text(json.dumps({"model_dir": str(model_dir), "scenarios": specs}, indent=2))
            out = work / "out"
            out.mkdir()
            cmd, env = self.env.command(str(self.env.generator), "--spec", str(spec_path), "--out", str(out))
            env["HF_HUB_OFFLINE"] = "1"  # the generator loads a local directory, never the hub
            ids = ", ".join(s["id"] for s in specs)
            with progress.task(f"oracle {self.oracle}: generating goldens for {ids}"):
                result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, check=False)
            if result.returncode != 0:
                tail = "\n".join(result.stderr.strip().splitlines()[-20:])
                raise OracleError(f"oracle {self.oracle} generator failed (exit {result.returncode}):\n{tail}")
            environment, records, errors = read_generator_output(out)
        self._check_environment(environment.get("environment", {}))
        missing = {s["id"] for s in specs} - set(records) - set(errors)
        if missing:
            raise OracleError(f"oracle {self.oracle} produced no record for scenario(s) {sorted(missing)}")
        return environment["environment"], records, errors

    def _check_environment(self, oracle_env: dict[str, Any]) -> None:
        facts = device_facts()
        if self.oracle in MLX_FREE_ORACLES:  # another framework: judged on tokens only
            if oracle_env.get("mlx") is not None:
                raise OracleVersionError(f"oracle {self.oracle} ran mlx {oracle_env['mlx']}: it must run without it")
            return
        if oracle_env.get("mlx") != facts.mlx:
            raise OracleVersionError(
                f"oracle {self.oracle} ran mlx {oracle_env.get('mlx')}, the project runs mlx {facts.mlx}"
            )
        oracle_device = str(oracle_env.get("device", ""))
        if facts.backend not in oracle_device:
            raise OracleVersionError(f"oracle {self.oracle} ran on {oracle_device}, the project on {facts.backend}")
        libs = oracle_env.get("blas_libraries") or []
        if libs and classify_blas(libs) != facts.blas:
            raise OracleVersionError(
                f"oracle {self.oracle} used BLAS {classify_blas(libs)} ({libs}), the project uses {facts.blas}"
            )


class InTreeRunner:
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
        if decode == "compiled" and any(spec.get(k) is not None for k in ("turns", "batch", "composition")):
            raise ValueError(f"{spec['id']}: the compiled decode runs plain and chat scenarios only")
        self._progress = (
            f"{self.label}{spec['id']} ({mode}{', compiled' if decode == 'compiled' else ''})",
            time.perf_counter(),
        )
        if spec.get("turns") is not None:
            return self._run_turns(spec, forced, mode)
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
            if not report.compiled:  # never judge the eager loop under the compiled check's name
                raise InTreeRunError(
                    f"{spec['id']}: the compiled decode fell back to the eager loop ({'; '.join(report.reasons)})"
                )
            extra = {"compiled_variant": report.variant}
        else:
            steps = self._greedy(spec, prompt_ids, forced_tokens)
            rows, tokens, _ = self._collect(steps, spec["n_tokens"], stop=stop)
            extra = {}
        if stop is not None:  # stream_generate's words for why the run ended
            extra["finish_reason"] = "stop" if tokens and tokens[-1] in stop else "length"
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
            options["report"] = report
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

    def _run_turns(self, spec: dict[str, Any], forced: ScenarioRecord | None, mode: str) -> ScenarioRecord:
        """mlx-lm's chat: one cache across turns, each turn's new messages rendered alone."""
        from models.universal import chat_turn_steps

        n = spec["n_tokens"]
        encoded = [
            self.encode({"messages": messages, "template_kwargs": spec.get("template_kwargs", {})})
            for messages in spec["turns"]
        ]
        forced_turns = [forced.tokens[t * n : (t + 1) * n] for t in range(len(encoded))] if forced else None
        options = {name: spec[name] for name in GENERATION_OPTIONS if spec.get(name) is not None}
        per_turn = chat_turn_steps(
            self.model,
            [ids for _, ids in encoded],
            n,
            prefill_step_size=spec["prefill_step_size"],
            forced_tokens=forced_turns,
            **options,
        )
        return self._segments_record(spec, mode, encoded, per_turn, "turns")

    def _run_batch(self, spec: dict[str, Any], forced: ScenarioRecord | None, mode: str) -> ScenarioRecord:
        """mlx-lm's batch generation: the rows decoded together, recorded row after row."""
        from models.universal.batch import batch_greedy_steps

        n = spec["n_tokens"]
        encoded = [self.encode(row | {"template_kwargs": spec.get("template_kwargs", {})}) for row in spec["batch"]]
        forced_rows = [forced.tokens[r * n : (r + 1) * n] for r in range(len(encoded))] if forced is not None else None
        per_row = batch_greedy_steps(
            self.model,
            [ids for _, ids in encoded],
            n,
            prefill_step_size=spec["prefill_step_size"],
            forced_tokens=forced_rows,
        )
        return self._segments_record(spec, mode, encoded, per_row, "rows")

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

    def _record(self, spec, mode, rendered, prompt_ids, tokens, rows, extra) -> ScenarioRecord:
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

    def model_for(self, fp16: bool) -> Any:
        """The model as mlx-whisper's transcribe builds it for the option: float16 positional
        tables and masks with fp16, float32 without; the weights keep their stored dtype."""
        import mlx.core as mx

        from models.whisper.load import load_model

        if fp16 not in self._models:
            try:
                model = load_model(self.model_dir, dtype=mx.float16 if fp16 else mx.float32)
            except ValueError as e:
                raise InTreeLoadError(f"in-tree whisper cannot load {self.model_dir}: {e}") from None
            if self.model_hook is not None:
                self.model_hook(model)
            self._models[fp16] = model
        return self._models[fp16]

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None) -> ScenarioRecord:
        from models.whisper.run import transcribe_record

        if (spec.get("composition") or {}).get("kind") == "whisper-fast":
            from models.whisper.fast import fast_transcribe_record as transcribe_record  # noqa: F811

        mode = "teacher_forced" if forced is not None else "free"
        with progress.task(f"{self.label}{spec['id']} ({mode}): in-tree transcribe"):
            out = transcribe_record(
                self.model_for(bool(spec["options"].get("fp16", False))),
                self.model_dir,
                spec["audio"],
                dict(spec["options"]) | {"seed": spec["seed"]},
                forced=forced.extra.get("decode_calls") if forced is not None else None,
            )
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
