"""What the harness knows of each oracle, in one table: its framework family, the
distributions that identify it, the records it judges and the scripts it runs.

Everything else reads these descriptors (the venv builder, the golden key, the profile
validator, the quality runs, the process seam in harness/oracle/process.py); a new oracle of
an existing family is its folder `oracles/<name>/` (pins and scripts) plus one row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import OracleError, table_row
from harness.implementations import LLM, SPEECH, VAD
from harness.paths import oracles_dir

FAMILIES = ("mlx", "torch")


@dataclass(frozen=True)
class OracleDescriptor:
    """One oracle.

    - `family`: the framework it computes in. It decides what keys its goldens
      (harness/provenance.py, golden_key), whether its venv may hold mlx, and how its venv is
      built (a torch oracle's pins are resolved first, and a CUDA build refused).
    - `distributions`: the installed distributions whose versions identify its interpreter.
    - `serves`: the record kinds (harness/implementations.py: LLM, SPEECH, VAD) whose scenarios
      it may judge: any implementation producing them.
    - `scripts`: the files under `oracles/<name>/` the harness runs, every one as
      `python -I <script> --job JOB.json --out DIR` (harness/oracle/process.py).
    - `composes`: it judges composed (L2) paths, and only those.
    - `quality_for`: the record kinds whose quality pairs it measures (`quality.py`).
    - `features`: the paths beyond a decode that its generator records, so that a scenario
      may ask for them: `response` (the server's response parser), `draft` (speculative
      decoding with a draft model), `stop` (stopping at EOS as stream_generate does).
    """

    name: str
    family: str
    distributions: tuple[str, ...]
    serves: tuple[str, ...]
    scripts: tuple[str, ...]
    composes: bool = False
    quality_for: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.family in FAMILIES, self.family

    @property
    def folder(self) -> Path:
        return oracles_dir() / self.name

    def script(self, name: str) -> Path:
        """The path of one of its scripts; a script it does not declare is an error naming them."""
        if name not in self.scripts:
            raise OracleError(f"oracle {self.name} has no script {name!r}: it runs {list(self.scripts)}")
        return self.folder / name


ORACLES = {
    d.name: d
    for d in (
        OracleDescriptor(
            "mlx-lm",
            family="mlx",
            distributions=("mlx", "mlx-lm", "transformers"),
            serves=(LLM,),
            scripts=("generate.py", "diagnose.py", "quality.py", "bench.py", "bench_kv.py"),
            quality_for=(LLM,),
            features=("response", "draft", "stop"),
        ),
        OracleDescriptor(
            "mlx-optiq",
            family="mlx",
            distributions=("mlx", "mlx-lm", "mlx-optiq", "transformers"),
            serves=(LLM,),
            scripts=("generate.py", "quality.py", "bench_kv.py"),
            composes=True,
        ),
        OracleDescriptor(
            "mlx-whisper",
            family="mlx",
            distributions=("mlx", "mlx-whisper"),
            serves=(SPEECH,),
            scripts=("generate.py", "quality.py", "calibrate.py", "writers.py", "bench.py"),
            quality_for=(SPEECH,),
        ),
        OracleDescriptor(
            "openai-whisper",
            family="torch",
            distributions=("openai-whisper", "torch"),
            serves=(SPEECH,),
            scripts=("generate.py",),
        ),
        OracleDescriptor(
            "silero-vad",
            family="torch",
            distributions=("torch",),
            serves=(VAD,),
            scripts=("generate.py",),
        ),
    )
}

# The distributions whose versions identify an oracle interpreter (all oracles' together: one
# probe serves every venv, and what is recorded beside a golden has the same keys everywhere).
ORACLE_DISTRIBUTIONS = tuple(dict.fromkeys(d for o in ORACLES.values() for d in o.distributions))
# Oracles computing in another framework (no mlx in their venv): judged on tokens only.
MLX_FREE_ORACLES = tuple(name for name, o in ORACLES.items() if o.family != "mlx")
# The oracle that judges composed (L2) paths: mlx-lm with optiq's runtime patches.
COMPOSED_ORACLE = next(name for name, o in ORACLES.items() if o.composes)


def descriptor(oracle: str) -> OracleDescriptor:
    return table_row(
        ORACLES,
        oracle,
        "oracle",
        "a new oracle is a folder oracles/<name>/ and a row in harness/oracle/descriptor.py",
        OracleError,
    )


def oracle_family(oracle: str) -> str:
    return descriptor(oracle).family


def oracles_serving(records: str) -> tuple[str, ...]:
    """The oracles that judge records of this kind (harness/implementations.py)."""
    return tuple(name for name, o in ORACLES.items() if records in o.serves)


def with_feature(feature: str) -> tuple[str, ...]:
    """The oracles whose generator records `feature` (see OracleDescriptor.features)."""
    return tuple(name for name, o in ORACLES.items() if feature in o.features)


def quality_oracle(records: str) -> str:
    """The oracle that measures the quality pairs of records of this kind (their plain side)."""
    for name, o in ORACLES.items():
        if records in o.quality_for:
            return name
    raise OracleError(f"no oracle measures the quality of {records!r} records")
