"""A profile's `certificate:`: its artifact's conversion certified against the original format's
own runtime (harness/certificate/, docs/certificate.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.errors import ProfileError


@dataclass(frozen=True)
class CertificateSpec:
    """- `runtime`: the original format's runtime (an oracle folder of the `native` family):
      `ctranslate2` for a pypi-ct2 artifact, `llama-cpp` for a pypi-gguf one.
    - `scenarios`: greedy Whisper scenarios (their first window is certified), or plain/chat LLM
      scenarios (every row)."""

    runtime: Literal["ctranslate2", "llama-cpp"]
    scenarios: list[str] = field(default_factory=list)

    def validate(self, where: str) -> None:
        if not self.scenarios:
            raise ProfileError(f"{where}.scenarios: expected at least one scenario id")
