"""mlx-lm oracle, warm: the fuzzer's side of a differential example (harness/fuzz/).

Loads the model once, then answers scenario after scenario exactly as generate.py answers a
job's scenarios: generate.py is loaded by path and its `run_scenario` runs each one, twice (a
second run must give the same bits, or the golden means nothing), and the golden is written as
generate.py writes it (`<id>.logits.npy`, any extra arrays, `result.json` with the streamed
text and the environment block), so the harness reads it with the same reader.

A separate script, not a `--serve` mode of generate.py: generate.py's sha256 is in every mlx-lm
golden's provenance (harness/goldens/lifecycle.py), so editing it would stale every golden,
those recorded on the lent GPU included.

Usage: python -I fuzz.py --job JOB.json --out DIR --serve   (job: {"model_dir"}); the
protocol is oracles/common/fuzz_serve.py's.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(HERE.parent / "common"))
import fuzz_serve  # noqa: E402


def answer(generate, model, tokenizer, scenario, out):
    """The scenario's golden into `out`, as generate.py's main writes one."""
    import numpy as np

    meta, logits = generate.run_scenario(model, tokenizer, scenario)
    again_meta, again = generate.run_scenario(model, tokenizer, scenario)
    arrays, again_arrays = meta.pop("_arrays", {}), again_meta.pop("_arrays", {})
    if (
        again_meta != meta
        or again.tobytes() != logits.tobytes()
        or any(again_arrays[k].tobytes() != a.tobytes() for k, a in arrays.items())
    ):
        raise RuntimeError(f"oracle is not deterministic on {scenario['id']}: two runs differ; no golden written")
    np.save(out / f"{scenario['id']}.logits.npy", logits, allow_pickle=False)
    for name, array in arrays.items():
        np.save(out / f"{scenario['id']}.{name}.npy", array, allow_pickle=False)
    stop = tokenizer.eos_token_ids if scenario.get("stop") == "eos" else ()
    result = {"scenarios": {scenario["id"]: meta | generate.lm_text.stream_text(tokenizer, meta, stop)}}
    result["environment"] = generate.base.mlx_environment("mlx", "mlx-lm", "transformers")
    (out / "result.json").write_text(json.dumps(result, indent=2))


def main():
    job, generate = fuzz_serve.start(__doc__, HERE)
    model, tokenizer = generate.load(job["model_dir"])
    environment = fuzz_serve.base.mlx_environment("mlx", "mlx-lm", "transformers")
    fuzz_serve.serve(environment, lambda scenario, out: answer(generate, model, tokenizer, scenario, out))


if __name__ == "__main__":
    main()
