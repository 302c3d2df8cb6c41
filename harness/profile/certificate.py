"""A profile's `certificate:`: its artifact's conversion certified against the original format's
own runtime (harness/certificate/, docs/certificate.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.errors import ProfileError


@dataclass(frozen=True)
class CertificateSpec:
    """- `runtime`: the original format's runtime (an oracle folder of the `native` family).
    - `scenarios`: greedy Whisper scenarios of the profile whose first window is certified."""

    runtime: Literal["ctranslate2"]
    scenarios: list[str] = field(default_factory=list)

    def validate(self, where: str) -> None:
        if not self.scenarios:
            raise ProfileError(f"{where}.scenarios: expected at least one scenario id")
