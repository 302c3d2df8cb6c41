"""A profile's input files read at the edge: the YAML itself (UTF-8, or a ProfileError naming
the byte) and the WAV files it names (a header with at least one sample frame, checked at load
so a bad file fails its own profile, not another scenario of the batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.errors import ProfileError


def read_yaml(path: Path) -> Any:
    """A profile file's YAML: unreadable, not UTF-8 or not YAML is a ProfileError naming the file
    (and, for a byte that is not UTF-8, its offset)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile YAML: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ProfileError(
            f"{path}: not UTF-8: byte {e.start} (line {line}) is 0x{raw[e.start]:02x} ({e.reason}); "
            "expected UTF-8 text (re-save the file as UTF-8)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: cannot read profile YAML: {e}") from None


def wav_problem(path: Path) -> str | None:
    """Why `path` is not a WAV file holding at least one sample frame (None when it is one).

    A header check only (RIFF/WAVE, a `fmt ` chunk, a `data` chunk with one whole frame of
    bytes present): what the samples are, and formats other than 16-bit PCM, are the audio
    loader's (models/whisper/audio.py, which falls back to ffmpeg)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return f"no RIFF/WAVE header (starts with {head[:12]!r})"
            block_align = None
            while True:
                chunk = f.read(8)
                if len(chunk) < 8:
                    return "no 'data' chunk" if block_align is not None else "no 'fmt ' chunk"
                chunk_id, chunk_size = chunk[:4], int.from_bytes(chunk[4:], "little")
                if chunk_id == b"fmt ":
                    fmt = f.read(min(chunk_size, 64))
                    if len(fmt) < 16:
                        return f"a 'fmt ' chunk of {len(fmt)} bytes (expected at least 16)"
                    channels, rate = int.from_bytes(fmt[2:4], "little"), int.from_bytes(fmt[4:8], "little")
                    block_align = int.from_bytes(fmt[12:14], "little")
                    if channels < 1 or rate < 1 or block_align < 1:
                        return f"a 'fmt ' chunk with {channels} channels, {rate} Hz, {block_align} bytes per frame"
                    f.seek(f.tell() - len(fmt))
                elif chunk_id == b"data":
                    if block_align is None:
                        return "a 'data' chunk before the 'fmt ' chunk"
                    present = min(chunk_size, size - f.tell())
                    if present < block_align:
                        return f"no sample frame ({present} bytes of data, {block_align} bytes per frame)"
                    return None
                f.seek(chunk_size + (chunk_size & 1), 1)  # chunks are padded to an even size
    except OSError as e:
        return f"cannot read it: {e}"


def check_wav(path: Path, where: str, shown: str) -> None:
    problem = wav_problem(path)
    if problem is not None:
        raise ProfileError(
            f"{where}: {shown!r} is not a readable WAV file: {problem}; expected a RIFF/WAVE file "
            "with at least one sample frame"
        )
