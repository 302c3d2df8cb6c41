"""Oracle isolation: each oracle runs in its own venv, built from its pins, keyed by their hash.

The venv lives in the untracked cache under `venvs/<oracle>-<hash of pins>`; it is built
once (under a file lock, into a temporary folder renamed into place when complete), reused
while the pins are unchanged, and a new one is built when they change.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness import settings
from harness.device import device_bootstrap
from harness.errors import OracleError, OracleVersionError
from harness.oracle.descriptor import ORACLE_DISTRIBUTIONS, descriptor, is_mlx_free, oracle_family
from harness.oracle.installed import VERIFIED, altered
from harness.oracle.pins import (
    check_mlx_pin,
    nodeps_pins_path,
    pins_hash,
    pins_path,
    project_mlx,
    python_hint,
    read_pins,
    refuse_cuda_torch,
)
from harness.oracle.streams import cap_text, file_tail
from harness.paths import cache_root
from harness.progress import progress
from harness.timing import clock

_VERSIONS_SNIPPET = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for d in sys.argv[1:]:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: out[d] = None\n"
    "print(json.dumps(out))\n"
)


@dataclass(frozen=True)
class OracleEnv:
    """A built oracle venv: its python, the pins it was built from and their hash."""

    name: str
    root: Path
    pins_hash: str
    pins: str
    external_python: Path | None = None  # a prepared interpreter (machines without a package index)
    external_path: str = ""  # its PYTHONPATH

    @property
    def python(self) -> Path:
        if self.external_python is not None:
            return self.external_python
        return self.root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")

    def command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """How to run the oracle's interpreter: isolated (`-I`), or an external one on its PYTHONPATH."""
        env = {k: v for k, v in settings.environment().items() if not k.startswith("PYTHON")}
        args = tuple(device_bootstrap(list(args)))  # a script runs on MLX_PARITY_DEVICE's device
        if self.external_python is None:
            return [str(self.python), "-I", *args], env
        return [str(self.python), "-s", *args], env | {"PYTHONPATH": self.external_path}

    @property
    def generator(self) -> Path:
        return descriptor(self.name).script("generate.py")

    def versions(self, *dists: str) -> dict[str, str | None]:
        """Versions actually installed in the venv (asked of its own interpreter)."""
        cmd, env = self.command("-c", _VERSIONS_SNIPPET, *dists)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            said = cap_text(out.stderr.strip(), "stderr")
            raise OracleError(f"oracle venv {self.root}: cannot read versions: {said}")
        return json.loads(out.stdout)


def ensure_oracle_env(oracle: str) -> OracleEnv:
    """Return the oracle's venv, building it first if its pins have no venv yet (timed as `venv`)."""
    with clock.phase("venv"):
        return _ensure_oracle_env(oracle)


def _ensure_oracle_env(oracle: str) -> OracleEnv:
    """Return the oracle's venv, building it first if its pins have no venv yet.

    `MLX_PARITY_ORACLE_PYTHON` (+ `MLX_PARITY_ORACLE_PYTHONPATH`) names a prepared interpreter
    instead, for machines with no package index (the lent GPU machine). Its installed versions,
    not the pins, then identify it; the mlx check applies all the same.
    """
    pins = read_pins(oracle)
    external = settings.read().oracle_python
    if external:
        env = OracleEnv(
            name=oracle,
            root=Path(external).parent,
            pins_hash="",
            pins=pins,
            external_python=Path(external),
            external_path=settings.read().oracle_pythonpath,
        )
        versions = json.dumps(env.versions(*ORACLE_DISTRIBUTIONS), sort_keys=True)
        return dataclasses.replace(env, pins_hash="external-" + hashlib.sha256(versions.encode()).hexdigest()[:12])
    digest = pins_hash(pins)
    env = OracleEnv(name=oracle, root=venv_root(oracle, digest), pins_hash=digest, pins=pins)
    nodeps = nodeps_pins_path(oracle)
    how = Pins(pins_path(oracle), nodeps if nodeps.is_file() else None, torch=oracle_family(oracle) == "torch")
    return ensure_built(env, lambda: check_mlx_pin(oracle, pins, project_mlx()), how)


def venv_root(oracle: str, digest: str) -> Path:
    """`<cache>/venvs/<oracle>-<digest>`, refused unless it lies inside `<cache>/venvs/` (an oracle
    name is checked where it is read, harness/oracle/descriptor.py; this holds whatever names it)."""
    venvs = cache_root() / "venvs"
    root = venvs / f"{oracle}-{digest}"
    if root.parent != venvs:  # a '/' (or '..' in a part) in the name, or an absolute one
        raise OracleError(f"oracle venv {root} lies outside {venvs}: {oracle!r} is not an oracle's name; nothing built")
    return root


@dataclass(frozen=True)
class Pins:
    """What a venv is installed from: a requirements file, an optional second one installed with
    --no-deps, whether torch must be resolved first (never a CUDA build), the folder pip runs in."""

    file: Path
    nodeps: Path | None = None
    torch: bool = False
    cwd: Path | None = None
    python: str | None = None  # the interpreter the venv is made with (None: the project's)


def ensure_built(
    env: OracleEnv,
    before_build: typing.Callable[[], None],
    pins: Pins,
    what: str = "oracle venv",
    verify: typing.Iterable[str] = VERIFIED,
) -> OracleEnv:
    """`env` once built: reused while its `.complete` marker stands, its interpreter runs and the
    `verify` distributions' files hash to their RECORDs (harness/oracle/installed.py), else built
    (once, under a lock: two processes never build the same venv). A build whose files do not
    hash to their RECORDs is refused."""
    root = env.root
    marker = root / ".complete"
    verify = tuple(verify)

    def usable(say: bool) -> bool:  # finished, its interpreter still runs, its libraries as installed
        if not marker.exists():
            return False
        if os.access(env.python, os.X_OK) and subprocess.run([str(env.python), "-I", "-c", ""]).returncode == 0:
            wrong = altered(root, verify)
            if not wrong:
                return True
            if say:
                progress.say(f"venv {root} altered since built ({len(wrong)} files): {wrong[0]}: building it again")
        elif say:
            progress.say(f"venv {root} is broken (its interpreter {env.python} does not run): building it again")
        marker.unlink(missing_ok=True)
        return False

    if usable(say=True):
        return env
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"venv-{root.name}.lock")):
        if usable(say=False):  # another process built (or mended) it while we waited
            return env
        before_build()  # before minutes of building, not after
        _sweep_unfinished(root)
        _build(env, pins, what)
        wrong = altered(root, verify)
        if wrong:
            (root / ".complete").unlink(missing_ok=True)
            raise OracleError(f"{what} {root}: just built, yet {wrong[0]}: refused (nothing is judged with it)")
    return env


def _sweep_unfinished(root: Path) -> None:
    """Remove `<venv>.building-<pid>` folders a killed build left (hostile probe 2, L11): under
    the venv's lock no other process is building it, so any of them is unfinished."""
    for stale in root.parent.glob(f"{root.name}.building-*"):
        progress.say(f"removing an unfinished venv build {stale}")
        shutil.rmtree(stale, ignore_errors=True)


def _build(env: OracleEnv, pins: Pins, what: str = "oracle venv") -> None:
    tmp = env.root.with_name(env.root.name + f".building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log = env.root.parent / f"{env.root.name}.build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with progress.task(f"building {what} {env.name} (pins {env.pins_hash})"):
        with open(log, "w") as out:
            try:
                _install(env, pins, tmp, out, log)
            except BaseException:  # a failed build, and Ctrl-C: no half-built venv is left behind
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    (tmp / ".complete").write_text(env.pins_hash + "\n")
    # A venv's scripts hold absolute paths, so it is built at a temporary path and moved;
    # `python -I script` and `-m` still work from the new place (pyvenv.cfg is relative to it).
    shutil.rmtree(env.root, ignore_errors=True)  # a broken one being replaced
    os.replace(tmp, env.root)


def _install(env: OracleEnv, how: Pins, tmp: Path, out: typing.TextIO, log: Path) -> None:
    python = str(tmp / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    pins = how.file
    pip = [python, "-m", "pip", "install", "--no-input", "--retries", "2"]

    def run(cmd: list[str]) -> None:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, cwd=how.cwd)
        if result.returncode != 0:
            out.flush()
            tail = file_tail(log, "log")
            said = f"building the venv of {env.name} from {pins} failed (exit {result.returncode}); log {log}:\n"
            raise OracleError(said + tail + python_hint(tail, how.python or sys.executable))

    if not how.torch and _with_uv(env, how, tmp, python, run, out):
        return
    run([how.python or sys.executable, "-m", "venv", str(tmp)])
    if how.torch:  # resolve first: never download a CUDA build
        report = tmp / "resolution.json"
        run([*pip, "--dry-run", "--quiet", "--report", str(report), "-r", str(pins)])
        resolved = {
            i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
        }
        refuse_cuda_torch(env.name, pins, resolved, "resolved")
    run([*pip, "-r", str(pins)])
    if how.nodeps is not None:
        run([*pip, "--no-deps", "-r", str(how.nodeps)])
    if how.torch:
        probe = subprocess.run([python, "-I", "-c", _CUDA_PROBE], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            raise OracleError(f"oracle venv {env.name}: torch does not import: {cap_text(probe.stderr, 'stderr')}")
        facts = json.loads(probe.stdout)
        refuse_cuda_torch(env.name, pins, facts["dists"], "installed", cuda=facts["cuda"])


def _with_uv(env: OracleEnv, how: Pins, tmp: Path, python: str, run, out: typing.TextIO) -> bool:
    """Build with uv (pinned in requirements.txt; seconds where pip takes a minute), from the
    indexes and find-links pip is configured with. A torch oracle stays with pip (its CUDA
    refusal reads pip's resolution report). False when uv is absent or fails: pip builds it."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        return False
    install = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match", *pip_sources()]
    try:
        run([uv, "venv", "--seed", "--quiet", "--python", how.python or sys.executable, str(tmp)])
        run([*install, "-r", str(how.file)])
        if how.nodeps is not None:
            run([*install, "--no-deps", "-r", str(how.nodeps)])
    except OracleError as e:
        out.write(f"uv could not build it ({str(e).splitlines()[0]}); building with pip instead\n")
        out.flush()
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


@functools.cache
def pip_sources() -> tuple[str, ...]:
    """pip's configured indexes, find-links and constraints (its config files and PIP_*
    variables, as `pip config list` shows them), as uv's options: uv reads neither."""
    shown = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    options = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
    options |= {"constraint": "--constraint"}
    out: list[str] = []
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        flag = options.get(key.rsplit(".", 1)[-1])
        for item in value.strip().strip("'\"").split() if flag else []:
            if (flag, item) not in zip(out[::2], out[1::2], strict=True):  # a file and the environment may repeat it
                out += [flag, item]
    return tuple(out)


_CUDA_PROBE = (
    "import importlib.metadata as m, json, torch\n"
    "print(json.dumps({'cuda': torch.version.cuda,"
    " 'dists': {d.metadata['Name'].lower(): d.version for d in m.distributions()}}))\n"
)


def check_same_mlx(env: OracleEnv, project_mlx: str | None) -> dict[str, str | None]:
    """Refuse to go on when the oracle's mlx differs from the comparison's (the project's, or a
    variant's pinned one: comparison_mlx): bits would not compare."""
    versions = env.versions(*ORACLE_DISTRIBUTIONS, "mlx-cpu")
    oracle_mlx = versions.get("mlx")
    if is_mlx_free(env.name):
        if oracle_mlx is not None:
            raise OracleVersionError(
                f"oracle {env.name} venv {env.root} has mlx {oracle_mlx}: it must compute without it"
            )
        return versions
    if oracle_mlx != project_mlx:
        raise OracleVersionError(
            f"oracle {env.name} venv {env.root} has mlx {oracle_mlx}, its comparisons run mlx "
            f"{project_mlx}: refusing to generate or compare goldens across mlx versions "
            f"(pin the same mlx in {pins_path(env.name)} and requirements.txt)"
        )
    return versions


def oracle_pins_hash(oracle: str) -> str:
    """The pins hash of the oracle's venv, or of the external interpreter's installed versions."""
    if settings.read().oracle_python:
        return ensure_oracle_env(oracle).pins_hash
    return pins_hash(read_pins(oracle))


@dataclass(frozen=True)
class TorchFacts:
    """Asked of a torch oracle's own interpreter."""

    version: str
    capability: str


_TORCH_SNIPPET = (
    "import json, torch\n"
    "print(json.dumps({'version': torch.__version__, 'capability': torch.backends.cpu.get_cpu_capability()}))\n"
)


@functools.cache
def torch_facts(env: OracleEnv) -> TorchFacts:
    """The torch version and CPU capability of an oracle venv, in the environment its generator
    runs in (so `ATEN_CPU_CAPABILITY` counts as it does for the goldens)."""
    cmd, run_env = env.command("-c", _TORCH_SNIPPET)
    out = subprocess.run(cmd, capture_output=True, text=True, env=run_env, check=False)
    if out.returncode != 0:
        raise OracleError(
            f"oracle venv {env.root}: cannot ask torch for its CPU capability: {cap_text(out.stderr, 'stderr')}"
        )
    return TorchFacts(**json.loads(out.stdout.strip().splitlines()[-1]))


def index_versions(dist: str) -> list[str]:
    """The released versions of `dist` on the package index (pip's configuration), newest first."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", dist], capture_output=True, text=True, check=False
    )
    found = next((line for line in out.stdout.splitlines() if line.startswith("Available versions:")), None)
    if out.returncode != 0 or found is None:
        said = cap_text((out.stderr or out.stdout).strip(), "pip's output")
        raise OracleError(f"the package index lists no versions of {dist}: {said}")
    return [v.strip() for v in found.split(":", 1)[1].split(",") if v.strip()]


def release_env(oracle: str, dist: str, version: str) -> OracleEnv:
    """A venv of the oracle's pins with only `dist` at `version` (an oracle-release bisection's
    step), built once into the cache like any oracle venv."""
    pins = read_pins(oracle)
    line = re.compile(rf"^{re.escape(dist)}==\S+", re.MULTILINE | re.IGNORECASE)
    if not line.search(pins):
        raise OracleError(f"the pins of oracle {oracle} ({pins_path(oracle)}) name no {dist}==...: nothing to vary")
    pins = line.sub(f"{dist}=={version}", pins)
    digest = pins_hash(pins)
    folder = cache_root() / "bisect-pins"
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{oracle}-{dist}-{version}-{digest}.txt"
    file.write_text(pins)
    env = OracleEnv(name=oracle, root=venv_root(oracle, digest), pins_hash=digest, pins=pins)
    what = f"oracle venv with {dist}=={version} of"
    return ensure_built(env, lambda: check_mlx_pin(oracle, pins, project_mlx()), Pins(file), what)
