"""llama.cpp running the GGUF itself: the conversion certificate's other side for a GGUF artifact.

Runs inside the llama-cpp venv (oracles/llama-cpp/requirements.txt: llama-cpp-python) and imports
only that venv's packages, the standard library and oracles/common/oracle_base.py. The harness
hands it the pinned GGUF file (never the converted MLX weights) and, per scenario, the prompt ids
and tokens the mlx-lm oracle computed on the converted weights.

Per scenario `<id>` it writes
  <id>.logits.npy   its logits after the prompt and after each of the oracle's tokens
                    (teacher-forced: prompt + tokens evaluated, every position's logits kept),
                    (rows, n_vocab) f32
and in result.json `scenarios[id]`: its own free greedy tokens from the prompt (argmax, as many
as the oracle chose), and an environment block (versions, the setting).

The job: {"model": GGUF, "setting": null | "threads<N>-batch<M>", "scenarios": [{"id",
"initial": [prompt ids], "tokens": [ids], "max_tokens": N}]}. The setting is how the certificate's
bound is calibrated: llama.cpp's own spread over thread counts and batch sizes.

Usage: python -I certify.py --job JOB.json --out DIR
"""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


def main():
    job, out = base.job_and_out(__doc__.splitlines()[0])
    import numpy as np
    from llama_cpp import Llama

    setting = job.get("setting") or "threads2-batch512"
    match = re.fullmatch(r"threads(\d+)-batch(\d+)", setting)
    if match is None:
        raise SystemExit(f"setting {setting!r}: expected threads<N>-batch<M>")
    threads, batch = int(match.group(1)), int(match.group(2))
    llm = Llama(model_path=job["model"], n_ctx=1024, n_threads=threads, n_batch=batch, logits_all=True, verbose=False)
    result = {"scenarios": {}}
    for scenario in job["scenarios"]:
        prompt, tokens = list(scenario["initial"]), list(scenario["tokens"])
        llm.reset()
        llm.eval(prompt + tokens)
        rows = np.asarray(llm.scores[len(prompt) - 1 : len(prompt) + len(tokens)], dtype=np.float32)
        np.save(out / f"{scenario['id']}.logits.npy", rows)
        llm.reset()
        llm.eval(prompt)
        free = []
        for _ in range(scenario["max_tokens"]):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            free.append(token)
            if len(free) == scenario["max_tokens"]:
                break
            llm.eval([token])
        result["scenarios"][scenario["id"]] = {"free_tokens": free[:-1] if free else free}
    result["environment"] = {
        **base.versions("llama-cpp-python", "numpy"),
        "setting": setting,
        "python": platform.python_version(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
