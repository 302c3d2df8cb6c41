"""Gate the in-tree Silero VAD (models/vad) against the silero-vad package, per fixture.

    python -m harness.vad_gate [--update] [--fixtures fox.wav ...] [--bench]

Data flows one way: profile (profiles/vad/silero-vad.yaml) -> artifact (the pinned wheel's
.jit, converted once without torch) -> oracle goldens (oracles/silero-vad/generate.py in its
own venv, cached) and the in-tree run -> the checks below -> a table and the exit status.

Per fixture:
- `input`: the oracle read the same samples (sha256 of the float32 samples) and made as many
  chunks as the in-tree side.
- `probabilities`: every chunk's |mlx - package| <= the profile's declared tolerance.
- `segments[<options>]`: for each named option set, the in-tree speech segments (integer
  sample offsets) equal the package's `get_speech_timestamps` output exactly.
- `streaming`: VADStream fed in uneven pieces gives the batch probabilities bit for bit.

Goldens: `goldens/silero-vad/<golden key>/<fixture stem>.json` (tracked: provenance, segments,
the blob's sha256) and the probabilities as a content-addressed blob in `<cache>/blobs/`
(golden store layout). The key is the torch family's (harness/provenance.py: architecture,
CPU vendor, torch's CPU capability, torch version). Provenance = package version, wheel and
.jit sha256, generator sha256, the oracle's torch version, the pins hash, the key's facts,
fixture sha256 and the option sets. A stale golden is an error naming what changed (as
every golden); `--update` regenerates all; a tracked manifest whose blob this
cache lacks is regenerated and must reproduce the recorded blob's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from filelock import FileLock

from harness.artifacts.files import intact, record_files, sha256_file
from harness.artifacts.wheels import WheelMember, fetch_wheel_member
from harness.errors import (
    ArtifactError,
    GoldenError,
    HarnessError,
    NothingComparedError,
    OracleError,
    ProfileError,
    StaleGoldenError,
)
from harness.fileio import atomic_write_json
from harness.goldens.store import GoldenStore, provenance_differences
from harness.paths import REPO_ROOT, cache_root, goldens_dir, profiles_dir
from harness.progress import progress
from harness.provenance import device_facts, golden_key
from harness.runners.venvs import OracleEnv, ensure_oracle_env

CONVERTER_VERSION = 1  # bump when models/vad/convert.py changes what it writes
PROFILE_KEYS = {
    "name",
    "artifact",
    "oracle",
    "fixtures",
    "probability_tolerance",
    "tolerance_reason",
    "streaming",
    "timestamp_options",
}
ARTIFACT_KEYS = {"package", "version", "wheel", "wheel_sha256", "file", "sha256"}
FIXTURES_DIR = REPO_ROOT / "fixtures" / "audio"
STREAM_PIECES = (1000, 37, 512, 1500, 300)  # samples per feed() call, cycled


@dataclass(frozen=True)
class VadArtifact:
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    file: str
    sha256: str


@dataclass(frozen=True)
class VadProfile:
    name: str
    artifact: VadArtifact
    oracle: str
    fixtures: list[str]
    probability_tolerance: float
    tolerance_reason: str
    streaming: str
    timestamp_options: dict[str, dict[str, Any]]
    source_file: Path


def load_vad_profile(path: Path | None = None) -> VadProfile:
    """profiles/vad/silero-vad.yaml validated into a VadProfile (errors name file and key)."""
    from models.vad import SpeechTimestampOptions

    path = Path(path or profiles_dir() / "vad" / "silero-vad.yaml")
    if not path.is_file():
        raise ProfileError(f"VAD profile not found: {path}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or set(data) != PROFILE_KEYS:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ProfileError(f"{path}: expected exactly the keys {sorted(PROFILE_KEYS)}, got {got}")
    if not isinstance(data["artifact"], dict) or set(data["artifact"]) != ARTIFACT_KEYS:
        raise ProfileError(f"{path}: artifact: expected exactly the keys {sorted(ARTIFACT_KEYS)}")
    artifact = VadArtifact(**{k: str(v) for k, v in data["artifact"].items()})
    tolerance = data["probability_tolerance"]
    if not isinstance(tolerance, float) or not 0 < tolerance < 0.01:
        raise ProfileError(f"{path}: probability_tolerance: expected a float in (0, 0.01), got {tolerance!r}")
    if data["streaming"] != "bit-exact":
        raise ProfileError(f"{path}: streaming: only 'bit-exact' is implemented, got {data['streaming']!r}")
    options = data["timestamp_options"]
    if not isinstance(options, dict) or "default" not in options:
        raise ProfileError(f"{path}: timestamp_options: expected a mapping with a 'default' option set")
    for name, values in options.items():
        try:
            SpeechTimestampOptions.from_dict(values)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{path}: timestamp_options.{name}: {e}") from None
    if not isinstance(data["fixtures"], list) or not data["fixtures"]:
        raise ProfileError(f"{path}: fixtures: expected a non-empty list of WAV files, got {data['fixtures']!r}")
    for fixture in data["fixtures"]:
        if not (FIXTURES_DIR / fixture).is_file():
            raise ProfileError(f"{path}: fixtures: {FIXTURES_DIR / fixture} does not exist")
    return VadProfile(
        name=data["name"],
        artifact=artifact,
        oracle=data["oracle"],
        fixtures=list(data["fixtures"]),
        probability_tolerance=tolerance,
        tolerance_reason=data["tolerance_reason"],
        streaming=data["streaming"],
        timestamp_options=options,
        source_file=path,
    )


# -- artifact ------------------------------------------------------------------------------


def resolve_vad_weights(profile: VadProfile) -> Path:
    """The pinned wheel's .jit (sha256-checked, the wheel too), converted once into the cache."""
    from models.vad.load import WEIGHTS_FILE, save_converted

    art = profile.artifact
    jit = fetch_wheel_member(WheelMember(art.package, art.version, art.file, art.sha256))
    wheel = cache_root() / "downloads" / f"{art.package}-{art.version}" / art.wheel
    if not wheel.is_file():
        raise ArtifactError(f"missing artifact: {wheel} (the pinned wheel {art.wheel}) is not in the download cache")
    if sha256_file(wheel) != art.wheel_sha256:
        raise ArtifactError(
            f"artifact {wheel}: sha256 {sha256_file(wheel)} does not match the pinned {art.wheel_sha256}"
        )
    out = cache_root() / "artifacts" / f"{art.package}-{art.version}-{art.sha256[:12]}-jit{CONVERTER_VERSION}"
    if intact(out, out, f"converted {art.file}", "converting it again"):
        return out
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"artifact-{out.name}.lock")):
        if not intact(out, out, f"converted {art.file}", "converting it again", quiet=True):
            tmp = out.with_name(out.name + ".building")
            shutil.rmtree(tmp, ignore_errors=True)
            save_converted(jit, tmp)
            record_files(tmp)
            (tmp / ".complete").write_text(art.sha256 + "\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    if not (out / WEIGHTS_FILE).is_file():
        raise ArtifactError(f"converted artifact {out} has no {WEIGHTS_FILE}")
    return out


# -- oracle goldens ------------------------------------------------------------------------


@dataclass
class OracleResult:
    fixture: str
    probs: np.ndarray  # float32, one per chunk
    segments: dict[str, list[dict[str, int]]]
    samples_sha256: str
    seconds: dict[str, list[float]]
    manifest_path: Path
    regenerated: bool = False


def _store(profile: VadProfile) -> GoldenStore:
    """The golden store under the oracle's golden key (harness/provenance.py, golden_key)."""
    return GoldenStore(goldens_dir(), cache_root() / "blobs", golden_key(profile.oracle).name)


def manifest_path(profile: VadProfile, fixture: str) -> Path:
    return _store(profile).manifest_path(profile.name, Path(fixture).stem)


def oracle_provenance(profile: VadProfile, env: OracleEnv, versions: dict[str, Any], fixture: str) -> dict[str, Any]:
    return {
        "package": f"{profile.artifact.package}=={profile.artifact.version}",
        "installed": versions,
        "wheel_sha256": profile.artifact.wheel_sha256,
        "model_sha256": profile.artifact.sha256,
        "generator_sha256": sha256_file(env.generator),
        "pins_hash": env.pins_hash,
        "device": golden_key(profile.oracle).as_dict(),
        "fixture": fixture,
        "fixture_sha256": sha256_file(FIXTURES_DIR / fixture),
        "timestamp_options": profile.timestamp_options,
    }


def _read_blob(profile: VadProfile, ref: dict[str, Any], path: Path) -> np.ndarray:
    blob = _store(profile).blob_path(ref["sha256"])
    try:
        data = blob.read_bytes()
    except OSError:
        raise GoldenError(f"golden {path}: blob {blob} is missing") from None
    if hashlib.sha256(data).hexdigest() != ref["sha256"]:
        raise GoldenError(f"corrupted golden blob {blob}: its sha256 is not the {ref['sha256']} that {path} records")
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if array.dtype != np.float32 or array.ndim != 1:
        raise GoldenError(f"golden blob {blob}: {array.dtype} {array.shape}, expected 1-D float32 probabilities")
    return array


def ensure_goldens(profile: VadProfile, fixtures: list[str], update: bool = False) -> dict[str, OracleResult]:
    """Each fixture's oracle output: from its fresh golden, or generated now by the package."""
    env = ensure_oracle_env(profile.oracle)
    versions = env.versions("silero-vad", "torch", "numpy")
    if versions.get("silero-vad") != profile.artifact.version:
        raise OracleError(
            f"oracle venv {env.root} has silero-vad {versions.get('silero-vad')}, the profile "
            f"{profile.source_file} pins {profile.artifact.version}"
        )
    results: dict[str, OracleResult] = {}
    todo: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for fixture in fixtures:
        path = manifest_path(profile, fixture)
        provenance = oracle_provenance(profile, env, versions, fixture)
        if update:  # an unreadable manifest is about to be rewritten: it is not read
            todo[fixture] = (provenance, None)
            continue
        try:
            manifest = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError) as e:
            raise GoldenError(f"corrupted golden manifest {path}: {e}; mend it with `make vad ARGS=--update`") from None
        if manifest is None:
            todo[fixture] = (provenance, None)
            continue
        diffs = provenance_differences(manifest.get("provenance", {}), provenance)
        if diffs:  # as every other golden: stale is an error, regenerated only when asked
            raise StaleGoldenError(
                f"stale golden {path}: its provenance no longer matches ({'; '.join(diffs[:6])}); "
                "regenerate explicitly with `make goldens MODEL=silero-vad` (or `make vad ARGS=--update`)"
            )
        elif not _store(profile).blob_path(manifest["blobs"]["probs"]["sha256"]).exists():
            todo[fixture] = (provenance, manifest["blobs"]["probs"])  # must reproduce the tracked blob
        else:
            results[fixture] = _result_from_manifest(profile, fixture, manifest, path)
    if todo:
        results |= _generate(profile, env, todo)
    return {f: results[f] for f in fixtures}


def _recorded_on(path: Path) -> Any:
    try:
        return json.loads(path.read_text()).get("recorded_on", "<not recorded>")
    except (OSError, ValueError):
        return "<unreadable>"


def _result_from_manifest(
    profile: VadProfile, fixture: str, manifest: dict[str, Any], path: Path, regenerated: bool = False
):
    return OracleResult(
        fixture=fixture,
        probs=_read_blob(profile, manifest["blobs"]["probs"], path),
        segments=manifest["segments"],
        samples_sha256=manifest["samples_sha256"],
        seconds=manifest["seconds"],
        manifest_path=path,
        regenerated=regenerated,
    )


def run_oracle(env: OracleEnv, out: Path, wavs: list[Path], option_sets: dict[str, Any], repeat: int = 1) -> None:
    cmd, run_env = env.command(
        str(env.generator), "--out", str(out), "--options", json.dumps(option_sets), "--repeat", str(repeat)
    )
    with progress.task(f"silero-vad oracle on {len(wavs)} fixture(s)"):
        result = subprocess.run([*cmd, *map(str, wavs)], capture_output=True, text=True, env=run_env, check=False)
    if result.returncode != 0:
        raise OracleError(f"{env.generator} failed (exit {result.returncode}):\n{result.stderr.strip()[-2000:]}")


def _generate(
    profile: VadProfile, env: OracleEnv, todo: dict[str, tuple[dict, dict | None]]
) -> dict[str, OracleResult]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="silero-vad-oracle-") as tmp:
        run_oracle(env, Path(tmp), [FIXTURES_DIR / f for f in todo], profile.timestamp_options)
        for fixture, (provenance, expect_blob) in todo.items():
            stem = Path(fixture).stem
            record = json.loads((Path(tmp) / f"{stem}.json").read_text())
            probs = np.load(Path(tmp) / f"{stem}.probs.npy", allow_pickle=False)
            blob = _store(profile).put_blob(probs)
            path = manifest_path(profile, fixture)
            if expect_blob is not None:
                if blob["sha256"] != expect_blob["sha256"]:
                    key = golden_key(profile.oracle)
                    raise GoldenError(
                        f"golden {path} is not reproducible here: probabilities blob {expect_blob['sha256']} "
                        f"when recorded, the oracle now gives {blob['sha256']} with the same provenance and "
                        f"golden key {key.name} ({key.describe()}); recorded on "
                        f"{_recorded_on(path)}, this machine is {device_facts().recorded_on()}. If this "
                        "machine's bits should stand, regenerate with `make vad ARGS=--update`"
                    )
                manifest = json.loads(path.read_text())
            else:
                manifest = {
                    "profile": profile.name,
                    "fixture": fixture,
                    "provenance": provenance,
                    "samples_sha256": record["samples_sha256"],
                    "samples": record["samples"],
                    "chunks": record["chunks"],
                    "segments": record["segments"],
                    "seconds": record["seconds"],
                    "environment": record["environment"],
                    "recorded_on": device_facts().recorded_on(),
                    "blobs": {"probs": blob},
                }
                atomic_write_json(path, manifest)
            results[fixture] = _result_from_manifest(profile, fixture, manifest, path, regenerated=True)
    return results


# -- the gate ------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class FixtureVerdict:
    fixture: str
    chunks: int
    max_abs_diff: float
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _stream_pieces(n: int) -> list[int]:
    """Uneven piece sizes (so pieces straddle chunk boundaries) covering n samples."""
    sizes, done, i = [], 0, 0
    while done < n:
        sizes.append(min(STREAM_PIECES[i % len(STREAM_PIECES)], n - done))
        done += sizes[-1]
        i += 1
    return sizes


def streaming_probabilities(model: Any, audio: np.ndarray) -> np.ndarray:
    from models.vad import VADStream

    stream, out, start = VADStream(model), [], 0
    for size in _stream_pieces(audio.shape[0]):
        out += stream.feed(audio[start : start + size])
        start += size
    out += stream.flush()
    return np.array(out, dtype=np.float32)


def gate_fixture(
    profile: VadProfile,
    model: Any,
    oracle: OracleResult,
    options: dict[str, dict[str, Any]] | None = None,
    check_streaming: bool = True,
) -> FixtureVerdict:
    """Judge one fixture; `options` overrides the in-tree side's option sets (tests perturb it)."""
    from models.vad import SpeechTimestampOptions, read_wav, speech_segments

    audio = read_wav(FIXTURES_DIR / oracle.fixture)
    probs = np.asarray(model.probabilities(audio), dtype=np.float32)
    checks = []
    sha = hashlib.sha256(audio.tobytes()).hexdigest()
    same_input = sha == oracle.samples_sha256 and probs.shape == oracle.probs.shape
    checks.append(
        Check(
            "input",
            same_input,
            f"samples sha256 {sha[:12]} vs oracle {oracle.samples_sha256[:12]}; chunks {probs.shape[0]} vs "
            f"oracle {oracle.probs.shape[0]}",
        )
    )
    if not same_input:
        return FixtureVerdict(oracle.fixture, int(probs.shape[0]), float("nan"), checks)
    diff = np.abs(probs.astype(np.float64) - oracle.probs.astype(np.float64))
    max_diff = float(diff.max()) if diff.size else 0.0
    bad = np.flatnonzero(~(diff <= profile.probability_tolerance))
    if bad.size:
        k = int(bad[np.argmax(diff[bad])])
        detail = (
            f"{bad.size}/{diff.size} chunks over tolerance {profile.probability_tolerance:g}; worst chunk {k} "
            f"(samples {512 * k}..{512 * k + 512}): mlx {probs[k]!r} vs package {oracle.probs[k]!r}, "
            f"|d| {diff[k]:.3g}; first over tolerance: chunk {int(bad[0])}"
        )
    else:
        k = int(np.argmax(diff)) if diff.size else 0
        detail = f"max |d| {max_diff:.3g} at chunk {k} <= tolerance {profile.probability_tolerance:g}"
    checks.append(Check("probabilities", not bad.size, detail))
    for name, values in (options or profile.timestamp_options).items():
        mine = [s.as_dict() for s in speech_segments(probs.tolist(), audio.shape[0], SpeechTimestampOptions(**values))]
        theirs = oracle.segments[name]
        if mine == theirs:
            checks.append(Check(f"segments[{name}]", True, f"{len(mine)} segment(s) identical"))
        else:
            first = next(
                (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs))
            )
            checks.append(
                Check(
                    f"segments[{name}]",
                    False,
                    f"{len(mine)} segment(s) vs package {len(theirs)}; first difference at segment {first}: "
                    f"mlx {mine[first] if first < len(mine) else None} vs package "
                    f"{theirs[first] if first < len(theirs) else None}",
                )
            )
    if check_streaming:
        streamed = streaming_probabilities(model, audio)
        equal = streamed.shape == probs.shape and np.array_equal(streamed.view(np.uint32), probs.view(np.uint32))
        if equal:
            detail = f"{streamed.shape[0]} chunks bit-identical (fed in pieces of {STREAM_PIECES} samples)"
        elif streamed.shape != probs.shape:
            detail = f"streaming gave {streamed.shape[0]} chunks, batch {probs.shape[0]}"
        else:
            k = int(np.flatnonzero(streamed.view(np.uint32) != probs.view(np.uint32))[0])
            detail = f"first differing chunk {k}: streaming {streamed[k]!r} vs batch {probs[k]!r}"
        checks.append(Check("streaming", equal, detail))
    return FixtureVerdict(oracle.fixture, int(probs.shape[0]), max_diff, checks)


def float64_probabilities(weights_dir: Path, audio: np.ndarray) -> np.ndarray:
    """The same graph in float64 numpy: the yardstick for how far float32 rounding alone moves
    each side (the tolerance's justification), not a gate."""
    import mlx.core as mx

    w = {k: np.array(v, dtype=np.float64) for k, v in mx.load(str(Path(weights_dir) / "weights.safetensors")).items()}

    def conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: int, pad: int) -> np.ndarray:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
        k = weight.shape[2]
        cols = np.stack([x[:, :, i * stride : i * stride + k] for i in range((x.shape[2] - k) // stride + 1)], 1)
        y = np.einsum("nlck,ock->nol", cols, weight)
        return y if bias is None else y + bias[None, :, None]

    def sigmoid(z: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-z))

    n = -(-audio.shape[0] // 512)
    padded = np.concatenate([np.zeros(64), audio.astype(np.float64), np.zeros(n * 512 - audio.shape[0])])
    frames = np.stack([padded[k * 512 : k * 512 + 576] for k in range(n)])
    frames = np.concatenate([frames, frames[:, 574:510:-1]], axis=1)
    spec = conv(frames[:, None, :], w["stft_basis"], None, 128, 0)
    x = np.sqrt(spec[:, :129] ** 2 + spec[:, 129:] ** 2)
    for i, stride in ((1, 1), (2, 2), (3, 2), (4, 1)):
        x = np.maximum(conv(x, w[f"conv{i}.weight"], w[f"conv{i}.bias"], stride, 1), 0)
    x = x[:, :, 0]
    h, c, out = np.zeros(128), np.zeros(128), []
    for k in range(n):
        gates = x[k] @ w["lstm.weight_ih"].T + w["lstm.bias_ih"] + h @ w["lstm.weight_hh"].T + w["lstm.bias_hh"]
        i, f, g, o = np.split(gates, 4)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        out.append(sigmoid(np.maximum(h, 0) @ w["head.weight"][0, :, 0] + w["head.bias"][0]))
    return np.array(out)


def bench(profile: VadProfile, model: Any, weights_dir: Path, fixtures: list[str], repeat: int = 3) -> list[dict]:
    """Chunks per second: MLX batch, MLX streaming (one 512-sample chunk per call), the package."""
    from models.vad import read_wav

    env = ensure_oracle_env(profile.oracle)
    rows = []
    with tempfile.TemporaryDirectory(prefix="silero-vad-bench-") as tmp:
        run_oracle(env, Path(tmp), [FIXTURES_DIR / f for f in fixtures], {"default": {}}, repeat=repeat)
        for fixture in fixtures:
            audio = read_wav(FIXTURES_DIR / fixture)
            record = json.loads((Path(tmp) / f"{Path(fixture).stem}.json").read_text())
            package_s = min(record["seconds"]["default"])
            model.probabilities(audio)  # warm-up
            batch_s = min(_timed(model.probabilities, audio) for _ in range(repeat))
            stream_s = min(_timed(streaming_probabilities, model, audio) for _ in range(repeat))
            probs = np.asarray(model.probabilities(audio), np.float64)
            ref = float64_probabilities(weights_dir, audio)
            oracle = np.load(Path(tmp) / f"{Path(fixture).stem}.probs.npy").astype(np.float64)
            chunks = probs.shape[0]
            rows.append(
                {
                    "fixture": fixture,
                    "audio_s": audio.shape[0] / 16000,
                    "chunks": chunks,
                    "mlx_batch_chunks_per_s": chunks / batch_s,
                    "mlx_stream_chunks_per_s": chunks / stream_s,
                    "package_chunks_per_s": chunks / package_s,
                    "max_abs_mlx_vs_package": float(np.abs(probs - oracle).max()),
                    "max_abs_mlx_vs_float64": float(np.abs(probs - ref).max()),
                    "max_abs_package_vs_float64": float(np.abs(oracle - ref).max()),
                }
            )
    return rows


def _timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


# -- as a profile kind of `make parity` / `make signoff` -------------------------------------

VAD_TIER = "tolerance"  # probabilities within a measured tolerance, segments and streaming exact


def available_vad_profiles() -> dict[str, Path]:
    """VAD profiles (profiles/vad/*.yaml) by name: collected by `make parity` like any profile."""
    directory = profiles_dir() / "vad"
    return {p.stem: p for p in sorted(directory.glob("*.yaml"))} if directory.is_dir() else {}


def vad_checks(profile: VadProfile) -> list[str]:
    """The checks of every fixture, in the order gate_fixture judges them."""
    return ["input", "probabilities", *(f"segments[{name}]" for name in profile.timestamp_options), "streaming"]


class VadRun:
    """One VAD profile's run in a parity session: the in-tree model loaded once, the goldens
    made or read once (a stale one is an error, as everywhere), each fixture judged once."""

    def __init__(self, profile: VadProfile, fixtures: list[str]):
        self.profile = profile
        self.fixtures = fixtures  # the fixtures this run judges (their goldens are made together)
        self._model: Any = None
        self._goldens: dict[str, OracleResult] | None = None
        self._verdicts: dict[str, FixtureVerdict] = {}

    def check(self, fixture: str, name: str) -> Check:
        if fixture not in self._verdicts:
            from models.vad import load_model

            if self._model is None:
                self._model = load_model(resolve_vad_weights(self.profile))
            if self._goldens is None:
                self._goldens = ensure_goldens(self.profile, sorted(set(self.fixtures) | {fixture}))
            elif fixture not in self._goldens:
                self._goldens |= ensure_goldens(self.profile, [fixture])
            self._verdicts[fixture] = gate_fixture(self.profile, self._model, self._goldens[fixture])
        verdict = self._verdicts[fixture]
        found = next((c for c in verdict.checks if c.name == name), None)
        if found is None:
            failed = next((c for c in verdict.checks if not c.passed), None)
            raise NothingComparedError(
                f"{self.profile.name}/{fixture} {name}: not compared"
                + (f": {failed.name} failed first ({failed.detail})" if failed else "")
            )
        return found


def vad_model_provenance(name: str) -> dict[str, Any]:
    """What a report says about a VAD model's run (tracked manifests only, no oracle run)."""
    try:
        profile = load_vad_profile(available_vad_profiles()[name])
        store = _store(profile)
    except (HarnessError, KeyError) as e:
        return {"error": str(e)}
    goldens = {}
    for fixture in profile.fixtures:
        path = store.manifest_path(profile.name, Path(fixture).stem)
        try:
            manifest = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError) as e:
            goldens[fixture] = {"manifest": str(path), "error": str(e)}
            continue
        goldens[fixture] = {
            "manifest": str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path),
            "tier": VAD_TIER,
            "oracle": profile.oracle,
            "blobs": {k: v["sha256"] for k, v in manifest.get("blobs", {}).items()},
        }
    from harness.session import oracle_pins_hash

    artifact = profile.artifact
    return {
        "kind": "vad",
        "tier": VAD_TIER,
        "oracle": profile.oracle,
        "oracle_pins_hash": oracle_pins_hash(profile.oracle),
        "oracles": {profile.oracle: oracle_pins_hash(profile.oracle)},
        "artifact": {
            "package": f"{artifact.package}=={artifact.version}",
            "wheel_sha256": artifact.wheel_sha256,
            "file": artifact.file,
            "sha256": artifact.sha256,
        },
        "ran_twin": False,  # the package's own weights
        "oracle_defects": [],
        "goldens": goldens,
    }


def run_gate(fixtures: list[str] | None = None, update: bool = False) -> list[FixtureVerdict]:
    from models.vad import load_model

    profile = load_vad_profile()
    fixtures = fixtures or profile.fixtures
    model = load_model(resolve_vad_weights(profile))
    goldens = ensure_goldens(profile, fixtures, update=update)
    return [gate_fixture(profile, model, goldens[f]) for f in fixtures]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.vad_gate", description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="regenerate every golden from the package")
    parser.add_argument("--fixtures", nargs="+", help="fixture file names (default: the profile's)")
    parser.add_argument("--bench", action="store_true", help="also measure speed and float64 distances")
    args = parser.parse_args(argv)
    try:
        verdicts = run_gate(args.fixtures, update=args.update)
        for v in verdicts:
            print(f"{'PASS' if v.passed else 'FAIL'} {v.fixture}: {v.chunks} chunks, max |d| {v.max_abs_diff:.3g}")
            for c in v.checks:
                print(f"    {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}")
        if args.bench:
            from models.vad import load_model

            profile = load_vad_profile()
            weights = resolve_vad_weights(profile)
            for row in bench(profile, load_model(weights), weights, args.fixtures or profile.fixtures):
                print(json.dumps(row))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
