"""Reading a CTranslate2 model.bin (format version 6, WhisperSpec): its variables and aliases,
every unexpected field a ValueError naming it."""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bump whenever the files this module writes change, so cached conversions go stale.


@dataclass(frozen=True)
class Ct2Model:
    """A parsed model.bin: its variables (numpy, float ones widened to float32 or kept f16) and aliases."""

    variables: dict[str, np.ndarray]
    aliases: dict[str, str]


MODEL_FILE = "model.bin"


_FORMAT_VERSION = 6


_SPEC_NAME = "WhisperSpec"


_SPEC_REVISION = 3


# CT2 dtype codes -> (numpy dtype of the raw bytes, is float)
_CT2_DTYPES: dict[int, tuple[str, bool]] = {
    0: ("<f4", True),
    1: ("<i1", False),
    2: ("<i2", False),
    3: ("<i4", False),
    4: ("<f2", True),
    5: ("<u2", True),  # bfloat16, widened below
}


class _Reader:
    def __init__(self, data: bytes, source: str):
        self.data = data
        self.offset = 0
        self.source = source

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.data):
            raise ValueError(f"{self.source}: truncated at byte {self.offset} (wanted {n} more bytes)")
        chunk = self.data[self.offset : self.offset + n]
        self.offset += n
        return chunk

    def unpack(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("H"))
        if not raw.endswith(b"\0"):
            raise ValueError(f"{self.source}: string at byte {self.offset - len(raw)} is not NUL-terminated")
        return raw[:-1].decode("utf-8")


def _read_model_bytes(ct2_dir: Path, model_parts: Sequence[Path] | None) -> tuple[bytes, str]:
    if model_parts:
        parts = [Path(p) for p in model_parts]
    elif (ct2_dir / MODEL_FILE).is_file():
        parts = [ct2_dir / MODEL_FILE]
    else:
        numbered = {
            int(m.group(1)): p for p in ct2_dir.glob(f"{MODEL_FILE}.part*") if (m := re.search(r"part(\d+)$", p.name))
        }
        if not numbered:
            raise FileNotFoundError(f"no {MODEL_FILE} (or {MODEL_FILE}.partN files) in {ct2_dir}")
        if sorted(numbered) != list(range(1, len(numbered) + 1)):
            raise ValueError(f"{ct2_dir}: {MODEL_FILE} parts {sorted(numbered)} are not 1..{len(numbered)}")
        parts = [numbered[i] for i in sorted(numbered)]
    for part in parts:
        if not part.is_file():
            raise FileNotFoundError(f"no model part {part}")
    return b"".join(p.read_bytes() for p in parts), " + ".join(str(p) for p in parts)


def read_ct2_model(data: bytes, source: str = MODEL_FILE) -> Ct2Model:
    """Parse a CTranslate2 WhisperSpec model.bin."""
    reader = _Reader(data, source)
    version = reader.unpack("I")
    if version != _FORMAT_VERSION:
        raise ValueError(f"{source}: CTranslate2 format version {version}, only {_FORMAT_VERSION} is supported")
    spec = reader.string()
    revision = reader.unpack("I")
    if spec != _SPEC_NAME or revision != _SPEC_REVISION:
        raise ValueError(
            f"{source}: spec {spec!r} revision {revision}, expected {_SPEC_NAME} revision {_SPEC_REVISION}"
        )

    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = tuple(reader.unpack("I") for _ in range(reader.unpack("B")))
        code = reader.unpack("B")
        if code not in _CT2_DTYPES:
            raise ValueError(f"{source}: variable {name} has unknown dtype code {code}")
        raw_dtype, is_float = _CT2_DTYPES[code]
        raw = reader.take(reader.unpack("I"))
        count = int(np.prod(shape, dtype=np.int64))
        if len(raw) != count * np.dtype(raw_dtype).itemsize:
            raise ValueError(f"{source}: variable {name} of shape {list(shape)} has {len(raw)} bytes")
        array = np.frombuffer(raw, dtype=raw_dtype).reshape(shape)
        if code == 5:  # bfloat16: the upper half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        elif is_float and code == 4:
            array = array.astype(np.float16)
        elif not is_float:
            array = array.astype(np.int64)
        if name in variables:
            raise ValueError(f"{source}: variable {name} appears twice")
        variables[name] = array

    aliases = {}
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        aliases[alias] = target
    if reader.offset != len(data):
        raise ValueError(f"{source}: {len(data) - reader.offset} trailing bytes after the aliases")
    return Ct2Model(variables, aliases)
