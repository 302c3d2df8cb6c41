"""Synthetic twins: artifacts we cannot download, rebuilt as "exact config, seeded random weights".

A twin directory has the real artifact's file layout, config, quantization, vocabulary
size, special ids and chat-template behaviour, so everything up to the numbers in the
weights (loading, sharding, tokenization, rendering, EOS handling, cache shapes) can be
gated against the mlx-lm oracle before the real weights are available. Builds are
deterministic: the same TWIN_VERSION and the same pinned numpy/mlx/tokenizers give the
same bytes, recorded with sha256 in the directory's `twin.json`.

    identity = build_twin("minicpm5-2b-mini", Path("twin-mini"))
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import tokenizers

from harness.artifacts.family import detect_family
from harness.artifacts.twins.llama_legacy import LLAMA_ADDITIONAL_TOKENS_MINI, LLAMA_LEGACY_TOKENS_MINI
from harness.artifacts.twins.llama_odd_forms import ODD_FORM_TWINS
from harness.artifacts.twins.llama_rope import LLAMA_ROPE_TWINS
from harness.artifacts.twins.llama_spm import LLAMA_SPM_TWINS
from harness.artifacts.twins.llama_templates import LLAMA_TEMPLATE_TWINS
from harness.artifacts.twins.minicpm5 import (
    MINICPM5_2B,
    MINICPM5_2B_BF16,
    MINICPM5_2B_FLOAT_BF16,
    MINICPM5_2B_MINI,
    MINICPM5_2B_MINI_BF16,
    MINICPM5_2B_MINI_DRAFT,
    MINICPM5_2B_MINI_FLOAT,
    MINICPM5_2B_MINI_FP16,
)
from harness.artifacts.twins.spec import LlamaShape, QuantSettings, TwinSpec
from harness.artifacts.twins.whisper import WHISPER_TWINS, WhisperTwinSpec

# Bump whenever any twin's files change (init, corpus, template, layout, config keys),
# so directories built by an older version are recognisably stale.
TWIN_VERSION = "1"
TWIN_FILE = "twin.json"

TWINS: dict[str, TwinSpec | WhisperTwinSpec] = {
    spec.twin_id: spec
    for spec in (
        MINICPM5_2B,
        MINICPM5_2B_BF16,
        MINICPM5_2B_MINI,
        MINICPM5_2B_MINI_BF16,
        MINICPM5_2B_MINI_DRAFT,
        MINICPM5_2B_MINI_FP16,
        MINICPM5_2B_FLOAT_BF16,
        MINICPM5_2B_MINI_FLOAT,
        *WHISPER_TWINS,
        *LLAMA_SPM_TWINS,
        *LLAMA_ROPE_TWINS,
        LLAMA_LEGACY_TOKENS_MINI,
        LLAMA_ADDITIONAL_TOKENS_MINI,
        *LLAMA_TEMPLATE_TWINS,
        *ODD_FORM_TWINS,
    )
}

__all__ = [
    "TWINS",
    "TWIN_FILE",
    "TWIN_VERSION",
    "LlamaShape",
    "QuantSettings",
    "TwinSpec",
    "WhisperTwinSpec",
    "build_twin",
    "detect_family",
    "get_twin",
]


def get_twin(twin_id: str) -> TwinSpec | WhisperTwinSpec:
    """The registered spec; an unknown id is a ValueError listing the known ones."""
    if twin_id not in TWINS:
        raise ValueError(f"unknown twin {twin_id!r}; known twins: {', '.join(sorted(TWINS))}")
    return TWINS[twin_id]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def twin_identity(spec: TwinSpec | WhisperTwinSpec, built_dir: Path | None = None) -> dict[str, Any]:
    """What identifies a twin build: id, version, seed, config, and the files' hashes when built."""
    identity: dict[str, Any] = {
        "id": spec.twin_id,
        "twin_version": TWIN_VERSION,
        "seed": spec.seed,
        "description": spec.description,
        "config": spec.config_summary(),
        "generator": {"mlx": mx.__version__, "numpy": np.__version__, "tokenizers": tokenizers.__version__},
    }
    if built_dir is not None:
        identity["files"] = {
            p.relative_to(built_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(built_dir.rglob("*"))
            if p.is_file() and p.name != TWIN_FILE
        }
    return identity


def build_twin(twin_id: str, out_dir: Path) -> dict[str, Any]:
    """Build twin `twin_id` into `out_dir` (absent or empty) and return its identity.

    The files are written into a sibling staging directory and renamed into place at the
    end, so `out_dir` is either complete or absent, never half written.
    """
    spec = get_twin(twin_id)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not an empty directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        spec.write(spec, staging)
        identity = twin_identity(spec, staging)
        (staging / TWIN_FILE).write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the twin from other users
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return identity
