"""The warm fuzz server both oracles/*/fuzz.py run (harness/fuzz/): the job read as every
oracle script reads it, the family's generate.py loaded by path, then the ready line and one
answer per request line. Loaded by no generate.py, so editing it stales no golden.

Protocol: `{"status": "ready", "environment": {...}}`, then per request line
`{"scenario": {...}, "out": DIR}` the golden written into DIR and `{"status": "done"}`; a
request it cannot answer is `{"status": "error", "error": ...}` (the next is served).
"""

import importlib.util
import json
import sys
from pathlib import Path

import oracle_base as base


def load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start(doc, folder):
    """(the job, the family's generate.py loaded by path) for a fuzz.py whose docstring is `doc`."""
    args = base.parser(doc.splitlines()[0], serve=True).parse_args()
    job, _ = base.read_job(args)
    if not args.serve:
        raise SystemExit("fuzz.py answers requests: run it with --serve")
    return job, load_by_path("oracle_generate", Path(folder) / "generate.py")


def serve(environment, answer):
    """The ready line, then `answer(scenario, out)` for each request line until stdin closes."""
    print(json.dumps({"status": "ready", "environment": environment}), flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            out = Path(request["out"])
            out.mkdir(parents=True, exist_ok=True)
            answer(request["scenario"], out)
        except Exception as e:  # noqa: BLE001 - answered, and the next request is served
            print(json.dumps({"status": "error", "error": f"{type(e).__name__}: {e}"}), flush=True)
        else:
            print(json.dumps({"status": "done"}), flush=True)
