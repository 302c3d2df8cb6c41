"""Runners produce records and never judge: the oracle in its venv (`oracle.py`), the in-tree
implementations in process (`llama.py`, `whisper.py`, `vad.py`; `whisper_record.py` assembles
the Whisper record from the in-tree Whisper's instrumentation)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.records import ScenarioRecord

# Applied to the in-tree model once it is loaded (a mutant's fault, a test's perturbation).
ModelHook = Callable[[Any], None]


class InTreeRunner(Protocol):
    """What the session asks of an in-tree runner: built from the model directory (and a hook),
    it runs a scenario spec free (`forced=None`) or fed the golden's tokens, and returns the
    record, in the same format as the oracle's generator writes."""

    def __init__(self, model_dir: Path, model_hook: ModelHook | None = None, label: str = "") -> None: ...

    @property
    def model(self) -> Any: ...

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None) -> ScenarioRecord: ...
