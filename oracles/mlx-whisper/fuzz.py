"""mlx-whisper oracle, warm: the fuzzer's side of a differential example (harness/fuzz/).

Answers scenario after scenario exactly as generate.py answers a job's scenarios: generate.py
is loaded by path, its spec check refuses what it would refuse, and each scenario runs through
its `run_scenario` under oracles/common/whisper_run.py's `record_scenario` (twice: a second run
must give the same bits, or the golden means nothing), with the model loaded as generate.py
loads it (transcribe's own cached loader, emptied when the dtype changes). The golden is written
as generate.py writes it (`<id>.<name>.npy`, `result.json` with the environment block), so the
harness reads it with the same reader. The process stays up, so the loaded model and the
imported packages serve every example.

A separate script, not a `--serve` mode of generate.py: generate.py's sha256 (and that of
oracles/common) is in every mlx-whisper golden's provenance, so editing it would stale them all.

Usage: python -I fuzz.py --job JOB.json --out DIR --serve   (job: {"model_dir"}); the
protocol is oracles/common/fuzz_serve.py's.
"""

import functools
import importlib
import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(HERE.parent / "common"))
import fuzz_serve  # noqa: E402


class Oracle:
    """generate.py's main, one scenario a request; the model cache kept between requests."""

    def __init__(self, generate, model_dir):
        self.generate, self.model_dir = generate, model_dir
        self.loaded_dtype = None

    def answer(self, scenario, out):
        import mlx.core as mx

        generate = self.generate
        generate.validate_spec({"model_dir": self.model_dir, "scenarios": [scenario]})
        tmod = importlib.import_module("mlx_whisper.transcribe")
        # As generate.py's main: transcribe's loader with the dtype transcribe would ask for.
        dtype = mx.float16 if scenario.get("options", {}).get("fp16", False) else mx.float32
        if self.loaded_dtype is None or self.loaded_dtype != dtype:
            tmod.ModelHolder.model = None
        model = tmod.ModelHolder.get_model(self.model_dir, dtype)
        self.loaded_dtype = dtype
        result = {"scenarios": {}}
        run = functools.partial(generate.run_scenario, self.model_dir, model, scenario)
        try:
            generate.common.record_scenario(result, out, scenario["id"], run)
        except SystemExit as e:  # two runs differ: generate.py exits 3 and writes no golden
            raise RuntimeError(f"oracle is not deterministic on {scenario['id']} (exit {e.code}); no golden") from None
        result["environment"] = generate.environment()
        (out / "result.json").write_text(json.dumps(result, indent=2))


def main():
    job, generate = fuzz_serve.start(__doc__, HERE)
    oracle = Oracle(generate, job["model_dir"])
    fuzz_serve.serve(generate.environment(), oracle.answer)


if __name__ == "__main__":
    main()
