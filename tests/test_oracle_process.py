"""The oracle seam (harness/oracle/process.py): one command line, one work folder, one way a
script's failure and its environment are judged, for every oracle script."""

from __future__ import annotations

import json
import os
import sys
import tracemalloc
from pathlib import Path

import pytest

from harness.errors import OracleError, OracleVersionError
from harness.oracle.process import OracleProcess, OracleServer
from harness.oracle.streams import cap_text, file_tail
from harness.provenance import device_facts

# Stands in for an oracle script: records what it was given, then does what the job says.
SCRIPT = """
import json, os, sys
args = sys.argv[1:]
job_path, out = args[args.index("--job") + 1], args[args.index("--out") + 1]
job = json.load(open(job_path))
for i in range(job.get("lines", 0)):
    print(f"line {i}", flush=True)
for _ in range(job.get("stderr_mb", 0)):  # lines of 1 MiB on stderr
    sys.stderr.write("e" * (1 << 20) + "\\n")
sys.stderr.flush()
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


def test_m3_p51_a_failing_script_s_huge_output_is_quoted_by_its_capped_end(isolated: Path) -> None:
    with pytest.raises(OracleError, match=r"generate.py failed \(exit 3\)") as raised:
        with _process("mlx-lm").run("generate.py", {"lines": 2, "stderr_mb": 30, "exit": 3}):
            pass
    said = str(raised.value)
    assert said.endswith("\n… [output cut: 31.5 MB, last 4000 characters kept]\n" + "e" * 4000), said[:300]
    assert len(said) < 4200


def test_m3_p51_a_worker_that_ends_is_named_with_its_stderr_s_capped_end(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(OracleProcess, "env", property(lambda self: _Env()))
    with pytest.raises(OracleError, match=r"oracle mlx-lm diagnose.py ended while starting:\n") as raised:
        OracleServer("mlx-lm", "diagnose.py", {"stderr_mb": 30, "exit": 4})
    said = str(raised.value)
    assert said.endswith("\n… [stderr cut: 31.5 MB, last 4000 characters kept]\n" + "e" * 4000), said[:300]


def test_m3_p51_a_stream_s_end_is_read_from_the_end_of_its_file_and_says_what_was_cut(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with open(log, "w") as f:
        for i in range(50):
            f.write(f"{i:02d}" + "y" * (1 << 20) + "\n")
    tracemalloc.start()
    try:
        tail = file_tail(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tail == "… [stderr cut: 52.4 MB, last 4000 characters kept]\n" + "y" * 4000
    assert peak < 200_000, f"{peak} bytes held reading the end of a 52 MB file"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    assert file_tail(log) == "… [stderr cut: 230 bytes, last 20 lines kept]\n" + "\n".join(
        f"line {i}" for i in range(10, 30)
    )
    log.write_text("one\ntwo\n")
    assert file_tail(log) == "one\ntwo" and file_tail(tmp_path / "none.log") == ""
    assert cap_text("é" * 5000, "message", keep_end=False) == "é" * 4000 + (
        "\n… [message cut: 10.0 kB, first 4000 characters kept]"
    )


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
