"""What the harness knows of each oracle, in one table: its framework family, the
distributions that identify it, the records it judges and the scripts it runs.

Everything else reads these descriptors (the venv builder, the golden key, the profile
validator, the quality runs, the process seam in harness/oracle/process.py); a new oracle of
an existing family is its folder `oracles/<name>/` (pins and scripts) plus one row here.

A profile may pin other versions of an oracle (issue 33 part 4: "what changed between mlx-lm X
and Y?", a package that requires other pins): `oracles/<name>/variants/<label>.txt` holds them,
and the oracle `<name>@<label>` is that row with those pins, its own venv and golden key (the
key names the mlx its pins install: the comparison's, which the implementation must share).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import OracleError, table_row
from harness.implementations import LLM, SPEECH, VAD
from harness.paths import oracles_dir

FAMILIES = ("mlx", "torch", "native")
VARIANT = "@"  # `<oracle>@<label>`: the oracle with the pins of oracles/<oracle>/variants/<label>.txt
# A variant's label is a plain file name (no '/', no '..', no hidden file): its pins are read
# from oracles/<oracle>/variants/ and its venv is made in <cache>/venvs/, never elsewhere.
MAX_LABEL = 100
PLAIN_NAME = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_LABEL - 1}}}")


@dataclass(frozen=True)
class OracleDescriptor:
    """One oracle.

    - `family`: the framework it computes in. It decides what keys its goldens
      (harness/provenance.py, golden_key), whether its venv may hold mlx, and how its venv is
      built (a torch oracle's pins are resolved first, and a CUDA build refused). `native`: an
      original format's own runtime (CTranslate2 on its model.bin): it makes no goldens, only
      the conversion certificate's measurements (harness/certificate/).
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
    def base(self) -> str:
        """The row's name: `mlx-lm` for `mlx-lm` and for its variant `mlx-lm@<label>`."""
        return self.name.partition(VARIANT)[0]

    @property
    def variant(self) -> str | None:
        return self.name.partition(VARIANT)[2] or None

    @property
    def folder(self) -> Path:
        return oracles_dir() / self.base

    def has_script(self, name: str) -> bool:
        return name in self.scripts

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
            scripts=("generate.py", "diagnose.py", "quality.py", "bench.py", "bench_kv.py", "fuzz.py"),
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
            scripts=("generate.py", "quality.py", "calibrate.py", "writers.py", "bench.py", "fuzz.py"),
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
            "ctranslate2", family="native", distributions=("ctranslate2",), serves=(), scripts=("certify.py",)
        ),
        OracleDescriptor(
            "llama-cpp", family="native", distributions=("llama-cpp-python",), serves=(), scripts=("certify.py",)
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
    base, sep, label = oracle.partition(VARIANT)
    row = table_row(
        ORACLES,
        base,
        "oracle",
        "a new oracle is a folder oracles/<name>/ and a row in harness/oracle/descriptor.py",
        OracleError,
    )
    if not sep:
        return row
    known = sorted(p.stem for p in variants_dir(base).glob("*.txt") if PLAIN_NAME.fullmatch(p.stem))
    if not PLAIN_NAME.fullmatch(label):  # it names a file: never a path out of variants/ (issue 51 M7)
        raise OracleError(
            f"oracle {oracle}: variant {label!r} is not a plain name: expected letters, digits, '-', '_' and '.', "
            f"not starting with '.' (at most {MAX_LABEL} characters): the stem of a file in {variants_dir(base)} "
            f"(variants of {base}: {known or 'none'})"
        )
    pins = variant_pins_path(base, label)
    if not pins.is_file():
        raise OracleError(
            f"oracle {oracle}: no pins for variant {label!r} at {pins} (variants of {base}: {known or 'none'})"
        )
    if row.composes:
        raise OracleError(f"oracle {oracle}: {base} judges composed paths against the project's mlx; no variants")
    return dataclasses.replace(row, name=oracle)


def variants_dir(base: str) -> Path:
    return oracles_dir() / base / "variants"


def variant_pins_path(base: str, label: str) -> Path:
    return variants_dir(base) / f"{label}.txt"


def is_mlx_free(oracle: str) -> bool:
    """It computes in another framework (no mlx in its venv): judged on tokens only."""
    return oracle_family(oracle) != "mlx"


def oracle_family(oracle: str) -> str:
    return descriptor(oracle).family


def oracles_serving(records: str) -> tuple[str, ...]:
    """The oracles that judge records of this kind (harness/implementations.py)."""
    return tuple(name for name, o in ORACLES.items() if records in o.serves)


def with_feature(feature: str) -> tuple[str, ...]:
    """The oracles whose generator records `feature` (see OracleDescriptor.features)."""
    return tuple(name for name, o in ORACLES.items() if feature in o.features)


def has_feature(oracle: str, feature: str) -> bool:
    """Its generator records `feature` (a variant's is its row's)."""
    return feature in descriptor(oracle).features


def quality_oracle(records: str) -> str:
    """The oracle that measures the quality pairs of records of this kind (their plain side)."""
    for name, o in ORACLES.items():
        if records in o.quality_for:
            return name
    raise OracleError(f"no oracle measures the quality of {records!r} records")
