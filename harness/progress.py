"""Live progress on stderr (venv builds, golden generation, in-tree runs); quiet for CI logs.

`MLX_PARITY_QUIET=1` silences it. Progress is a side channel: nothing reads it back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console

from harness import settings


class Progress:
    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        # pytest captures output inside tests; its plugin installs a context manager here that
        # suspends capturing so progress reaches the terminal live.
        self.uncaptured: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
        self._lock = threading.Lock()  # the oracle's generation may report from its own thread

    @property
    def quiet(self) -> bool:
        return settings.read().quiet

    def say(self, message: str) -> None:
        if not self.quiet:
            with self._lock, self.uncaptured():
                try:
                    self.console.print(f"[dim]parity[/dim] {message}")
                except (ValueError, OSError):  # the stream is closed (a detached run): a side channel drops it
                    pass

    @contextlib.contextmanager
    def task(self, description: str) -> Iterator[None]:
        start = time.perf_counter()
        self.say(f"{description} ...")
        try:
            yield
        except BaseException:
            self.say(f"{description}: failed after {time.perf_counter() - start:.1f}s")
            raise
        self.say(f"{description}: done in {time.perf_counter() - start:.1f}s")

    def step(self, label: str, index: int, total: int, started: float) -> None:
        """One line per few steps: model/scenario, step i/N, elapsed."""
        if self.quiet or not (index == total or index % 8 == 0):
            return
        self.say(f"{label}: step {index}/{total} ({time.perf_counter() - started:.1f}s)")


progress = Progress()
