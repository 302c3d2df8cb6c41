"""The oracle side of a language-model pair: oracles/<oracle>/quality.py in its own venv
(`python -I`, as the golden generators run), one process per pair (optiq's patches are
process-global), talking to the harness through files only; its per-window progress lines are
passed on as they come."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.artifacts.files import sha256_file
from harness.errors import OracleError
from harness.oracle.descriptor import descriptor
from harness.oracle.process import OracleProcess
from harness.oracle.sources import common_sources
from harness.oracle.venvs import oracle_pins_hash
from harness.provenance import golden_key
from harness.quality.records import Measurement, MeasurementError

SCRIPT = "quality.py"


def oracle_facts(oracle: str) -> dict[str, Any]:
    """What the oracle's numbers depend on: pins, the quality script, the common modules it loads,
    and the device's golden key (part of the cache key)."""
    return {
        "name": oracle,
        "pins_hash": oracle_pins_hash(oracle),
        "script_sha256": sha256_file(descriptor(oracle).folder / SCRIPT),
        "common_sha256": {name: sha256_file(p) for name, p in common_sources(oracle, SCRIPT).items()},
        "device": golden_key(oracle).as_dict(),
    }


def run_oracle(oracle: str, job: dict[str, Any], on_window: Callable[[int, int], None] | None = None) -> Measurement:
    process = OracleProcess(oracle)
    process.check_versions()

    def on_line(line: str) -> None:  # its per-window progress lines, passed on as they come
        if line.startswith("quality: window ") and on_window is not None:
            done, total = line.split()[-1].split("/")
            on_window(int(done), int(total))

    with process.run(SCRIPT, job, on_line=on_line) as out:
        try:
            measurement = Measurement.from_dir(out)
        except MeasurementError as e:
            raise OracleError(f"oracle {oracle} quality.py wrote a bad result: {e}") from None
    process.check_environment(measurement.environment)
    return measurement
