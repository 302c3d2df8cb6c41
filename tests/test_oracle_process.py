"""The oracle seam (harness/oracle/process.py): one command line, one work folder, one way a
script's failure and its environment are judged, for every oracle script."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.errors import OracleError, OracleVersionError
from harness.oracle.process import OracleProcess
from harness.provenance import device_facts

# Stands in for an oracle script: records what it was given, then does what the job says.
SCRIPT = """
import json, os, sys
args = sys.argv[1:]
job_path, out = args[args.index("--job") + 1], args[args.index("--out") + 1]
job = json.load(open(job_path))
for i in range(job.get("lines", 0)):
    print(f"line {i}", flush=True)
seen = {"args": args, "job": job, "out_was_empty": os.listdir(out) == [], "cwd": os.getcwd(),
        "offline": os.environ.get("HF_HUB_OFFLINE")}
open(os.path.join(out, "seen.json"), "w").write(json.dumps(seen))
sys.exit(job.get("exit", 0))
"""


class _Env:
    """An oracle venv whose interpreter is this one, running SCRIPT in place of the script."""

    root = Path("/nonexistent-venv")

    def command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", SCRIPT, *args], dict(os.environ)


def _process(oracle: str = "mlx-whisper") -> OracleProcess:
    process = OracleProcess(oracle)
    process._env = _Env()  # type: ignore[assignment]
    return process


def test_every_script_gets_its_job_file_and_an_empty_out_folder_offline_in_its_own_work_folder(isolated: Path) -> None:
    process = _process()
    job = {"result": {"segments": []}, "audio_name": "fox.wav", "options": [{}, {"max_line_width": 9}]}
    with process.run("writers.py", job) as out:
        seen = json.loads((out / "seen.json").read_text())
        work = out.parent
        assert work.parent == isolated / "cache" / "tmp" and work.name.startswith("oracle-")
    script = str(process.descriptor.script("writers.py"))
    assert seen["args"] == [script, "--job", str(work / "job.json"), "--out", str(out)]
    assert seen["job"] == job and seen["out_was_empty"] and seen["offline"] == "1"
    assert Path(seen["cwd"]).resolve() == work.resolve()
    assert not work.exists()  # the work folder goes with the block


def test_a_script_the_oracle_does_not_declare_is_refused_before_anything_runs(isolated: Path) -> None:
    with pytest.raises(
        OracleError, match=r"oracle openai-whisper has no script 'writers.py': it runs \['generate.py'\]"
    ):
        with _process("openai-whisper").run("writers.py", {}):
            pass
    assert not list((isolated / "cache").rglob("job.json"))


def test_a_failing_script_is_an_error_with_the_last_lines_it_printed(isolated: Path) -> None:
    with pytest.raises(OracleError, match=r"oracle mlx-lm generate.py failed \(exit 3\)") as raised:
        with _process("mlx-lm").run("generate.py", {"lines": 30, "exit": 3}):
            pytest.fail("the block must not run after a failure")
    assert "line 29" in str(raised.value) and "line 9\n" not in str(raised.value)


def test_each_printed_line_is_passed_on_as_it_comes(isolated: Path) -> None:
    lines: list[str] = []
    with _process("mlx-lm").run("quality.py", {"lines": 3}, on_line=lines.append):
        pass
    assert lines == ["line 0", "line 1", "line 2"]


def test_a_reported_environment_of_another_mlx_backend_or_blas_is_refused() -> None:
    facts = device_facts()
    good = {"mlx": facts.mlx, "device": f"Device({facts.backend}, 0)", "blas_libraries": []}
    OracleProcess("mlx-lm").check_environment(good)
    with pytest.raises(OracleVersionError, match=r"oracle mlx-lm ran mlx 0\.1\.0, its comparisons run mlx"):
        OracleProcess("mlx-lm").check_environment(good | {"mlx": "0.1.0"})
    with pytest.raises(OracleVersionError, match=r"oracle mlx-whisper ran on Device\(elsewhere, 0\)"):
        OracleProcess("mlx-whisper").check_environment(good | {"device": "Device(elsewhere, 0)"})
    with pytest.raises(OracleVersionError, match=r"oracle openai-whisper ran mlx 0\.32\.4: it must run without it"):
        OracleProcess("openai-whisper").check_environment({"mlx": "0.32.4"})
    OracleProcess("silero-vad").check_environment({"torch": "2.13.0+cpu"})
