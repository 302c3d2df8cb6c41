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

from harness.errors import InTreeLoadError, OracleError, OracleVersionError
from harness.paths import cache_root
from harness.profile import GENERATION_OPTIONS
from harness.progress import progress
from harness.provenance import classify_blas, device_facts
from harness.records import ScenarioRecord, read_generator_output
from harness.venvs import OracleEnv, check_same_mlx, ensure_oracle_env

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
    """Runs the in-tree universal Llama over a scenario spec, free-running or teacher-forced."""

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
        if spec["kind"] == "chat":
            # As mlx-lm's tokenizer wrapper renders (the oracle is mlx-lm, not transformers): with
            # no explicit enable_thinking it passes whether the vocabulary has thinking markers.
            rendered = self.tokenizer.render_chat_like_mlx_lm(
                spec["messages"], add_generation_prompt=True, **spec.get("template_kwargs", {})
            )
            return rendered, self.tokenizer.encode(rendered, add_special_tokens=False)
        return None, self.tokenizer.encode(spec["prompt"], add_special_tokens=True)

    def run(self, spec: dict[str, Any], forced_tokens: list[int] | None = None) -> ScenarioRecord:
        import mlx.core as mx

        from models.universal import greedy_steps

        rendered, prompt_ids = self.encode(spec)
        n_tokens = spec["n_tokens"]
        rows, tokens = [], []
        started = time.perf_counter()
        mode = "teacher_forced" if forced_tokens is not None else "free"
        options = {name: spec[name] for name in GENERATION_OPTIONS if spec.get(name) is not None}
        for step in greedy_steps(
            self.model,
            prompt_ids,
            n_tokens,
            prefill_step_size=spec["prefill_step_size"],
            forced_tokens=forced_tokens,
            **options,
        ):
            rows.append(np.array(step.logits.astype(mx.float32)).reshape(-1))
            tokens.append(int(step.token))
            progress.step(f"{self.label}{spec['id']} ({mode})", len(tokens), n_tokens, started)
        return ScenarioRecord(
            scenario_id=spec["id"],
            rendered_prompt=rendered,
            prompt_ids=list(prompt_ids),
            tokens=tokens,
            logits=np.stack(rows),
            eos_ids=sorted(self.tokenizer.eos_token_ids),
            mode=mode,
        )
