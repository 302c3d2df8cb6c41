"""What the harness keeps of a child process's streams (an oracle's script or worker, an
implementation under test): named caps, so that a process printing without end costs a short
message and bounded memory, never a copy of what it printed.

- TAIL_LINES and TAIL_CHARS: the most of its stderr (or output) quoted in an error, its end;
  a stream's end is read from the end of its file (`file_tail`), never the whole file.
- LINE_BYTES: the longest line read from its stdout (a protocol message, a worker's answer);
  `read_line` never holds more of a line than that.

Whatever is cut says so: `… [stderr cut: 419.4 MB, last 4000 characters kept]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

TAIL_LINES = 20  # lines of a process's stderr (or output) quoted in an error, its last ones
TAIL_CHARS = 4000  # characters of those lines, at most, their last ones
LINE_BYTES = 1 << 20  # of one stdout line, its newline included: a protocol message is a few kB


def size_text(size: int) -> str:
    """A byte count for people: '419.4 MB', '12.0 kB', '310 bytes'."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def cap_text(
    text: str,
    what: str,
    *,
    lines: int = TAIL_LINES,
    chars: int = TAIL_CHARS,
    keep_end: bool = True,
    size: int | None = None,
    partial: bool = False,
) -> str:
    """At most `lines` lines and `chars` characters of `text` (its end, or its start where
    `keep_end` is false), with a line saying what was cut where anything was. `what` names the
    stream ("stderr"); `size` is the whole stream's bytes and `partial` true where `text` is only
    its end (`file_tail`)."""
    rows = text.splitlines()
    chosen = rows[-lines:] if keep_end else rows[:lines]
    kept = "\n".join(chosen)
    if len(kept) > chars or (partial and len(chosen) == len(rows)):  # the first row: part of a line
        kept = kept[-chars:] if keep_end else kept[:chars]
        which = f"{len(kept)} characters"
    elif partial or len(chosen) < len(rows):
        which = f"{len(chosen)} lines" if len(chosen) != 1 else "line"
    else:
        return kept
    total = size_text(len(text.encode(errors="replace")) if size is None else size)
    if keep_end:
        return f"… [{what} cut: {total}, last {which} kept]\n{kept}"
    return f"{kept}\n… [{what} cut: {total}, first {which} kept]"


def file_tail(path: Path, what: str = "stderr", *, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    """The end of the file a process writes its `what` to, capped as `cap_text` does: only its
    last 4 × `chars` bytes are read (a character is at most 4 bytes of UTF-8). '' where there is
    none (empty, or unreadable)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = max(0, size - 4 * chars)
            f.seek(start)
            data = f.read(size - start)  # no more than that, should it still be writing
    except OSError:
        return ""
    return cap_text(data.decode(errors="replace"), what, lines=lines, chars=chars, size=size, partial=start > 0)


class LineTooLong(Exception):
    """A stdout line longer than its cap: `read` bytes of it were read, with no newline yet."""

    def __init__(self, read: int, limit: int):
        super().__init__(
            f"a stdout line longer than the cap of {size_text(limit)} ({limit} bytes): "
            f"{read} bytes read with no newline"
        )
        self.read, self.limit = read, limit


def read_line(stream: BinaryIO, limit: int = LINE_BYTES) -> bytes:
    """The next line of `stream` (b'' at its end), holding no more than `limit` bytes of it:
    LineTooLong once `limit` bytes have come without a newline."""
    line = stream.readline(limit)
    if len(line) == limit and not line.endswith(b"\n"):
        raise LineTooLong(len(line), limit)
    return line
