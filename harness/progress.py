"""Live progress on stderr (venv builds, golden generation, in-tree runs); quiet for CI logs.

During a parity run on a terminal: one live bar (rich.progress) with the checks done out of
the total, the scenario and phase at work (a step count, the determinism repeat, a
localization) and the time left; one-off events (a venv built, the oracle regenerating) print
above it. Elsewhere (`CI=true`, a pipe, a file): plain lines, one per few steps and one per
finished scenario, each with the overall count. `MLX_PARITY_QUIET=1` silences it. Progress is a
side channel: nothing reads it back. The bar is redrawn only from the harness's own calls
(never from a thread of rich's), inside `uncaptured`, so pytest's capture never swallows it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as Bar
from rich.table import Column

from harness import settings


class Progress:
    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        # pytest captures output inside tests; its plugin installs a context manager here that
        # suspends capturing so progress reaches the terminal live.
        self.uncaptured: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
        self._lock = threading.Lock()  # the oracle's generation may report from its own thread
        self._bar: Bar | None = None
        self._task: TaskID | None = None
        self._phases: list[str] = []  # what the in-tree side is doing it for (localization, ...)
        self.done = self.total = self.failed = 0

    @property
    def quiet(self) -> bool:
        return settings.read().quiet

    @property
    def live(self) -> bool:
        return self._bar is not None

    def _count(self) -> str:
        if not self.total:
            return ""
        failed = f", {self.failed} not passing" if self.failed else ""
        return f"[{self.done}/{self.total} checks{failed}] "

    def _print(self, text: str) -> None:
        try:
            (self._bar.console if self._bar is not None else self.console).print(text)
            if self._bar is not None:
                self._bar.refresh()
        except (ValueError, OSError):  # the stream is closed (a detached run): a side channel drops it
            pass

    def say(self, message: str) -> None:
        if not self.quiet:
            with self._lock, self.uncaptured():
                self._print(f"[dim]parity[/dim] {self._count() if not self.live else ''}{message}")

    def _describe(self, text: str) -> None:
        if self._bar is None or self._task is None:
            return
        with self._lock, self.uncaptured():
            try:
                room = max(self.console.width - 50, 16)  # the count, elapsed and time left keep theirs
                self._bar.update(self._task, description=text if len(text) <= room else text[: room - 1] + "…")
                self._bar.refresh()
            except (ValueError, OSError):
                pass

    @contextlib.contextmanager
    def task(self, description: str) -> Iterator[None]:
        start = time.perf_counter()
        self.say(f"{description} ...")
        self._describe(description)
        try:
            yield
        except BaseException:
            self.say(f"{description}: failed after {time.perf_counter() - start:.1f}s")
            raise
        self.say(f"{description}: done in {time.perf_counter() - start:.1f}s")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label the step lines inside (the in-tree run a localization makes, ...)."""
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()

    def step(self, label: str, index: int, total: int, started: float) -> None:
        """One line per few steps: model/scenario (mode), step i/N, elapsed; on the bar, every step."""
        if self.quiet:
            return
        why = f" for {self._phases[-1]}" if self._phases else ""
        if self.live:  # the scenario without its model: the bar's line is short
            self._describe(f"{label.split('/', 1)[-1]}{why}: step {index}/{total}")
        elif index == total or index % 8 == 0:
            self.say(f"{label}{why}: step {index}/{total} ({time.perf_counter() - started:.1f}s)")

    # -- the parity run's overall count ------------------------------------------------------

    def start_run(self, total: int) -> None:
        """A run of `total` checks begins: the live bar on a terminal, plain lines elsewhere."""
        self.done, self.total, self.failed = 0, total, 0
        if self.quiet or not total or settings.read().ci.lower() in ("1", "true", "yes"):
            return
        with self.uncaptured():
            if not self.console.is_terminal:
                return
            columns = (  # the description is cut to what the others leave (_describe)
                TextColumn("[dim]parity[/dim] {task.description}", table_column=Column(no_wrap=True)),
                BarColumn(bar_width=10),
                MofNCompleteColumn(),
                TextColumn("checks ·"),
                TimeRemainingColumn(),
                TextColumn("left"),
            )
            self._bar = Bar(*columns, console=self.console, auto_refresh=False, transient=True)
            self._task = self._bar.add_task("collecting", total=total)
            self._bar.start()

    def check_done(self, passed: bool) -> None:
        self.done += 1
        self.failed += not passed
        if self._bar is not None and self._task is not None:
            with self._lock, self.uncaptured():
                with contextlib.suppress(ValueError, OSError):
                    self._bar.update(self._task, completed=self.done)
                    self._bar.refresh()

    def scenario_done(self, label: str, checks: int, failed: int, seconds: float) -> None:
        """A scenario's checks have all run: one plain line (the bar shows it already)."""
        if not self.live:
            verdict = "all passed" if not failed else f"{failed} not passing"
            self.say(f"{label}: {checks} checks, {verdict} ({seconds:.1f}s)")

    def end_run(self) -> None:
        if self._bar is not None:
            with self._lock, self.uncaptured(), contextlib.suppress(ValueError, OSError):
                self._bar.stop()
        self._bar = self._task = None
        self.total = 0


progress = Progress()
