"""Every verb of `python -m harness`: what runs it, what it does, and its arguments.

A verb is one row: the function that runs it (`module:function`, imported only when the verb
is chosen, so `--help` and a worker's start import no model code), its one-line help, and
the function that declares its arguments on the one parser (harness/cli/__init__.py). Options
more than one verb takes come from harness/cli/options.py. A hidden verb (a benchmark worker
its parent starts) is callable but not listed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.cli import options


@dataclass(frozen=True)
class Verb:
    name: str
    target: str  # "module:function", the function taking the parsed arguments and returning the exit code
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    extra: bool = False  # takes unparsed arguments after its own (pytest's, for parity and signoff)
    hidden: bool = False


def _parity(p: argparse.ArgumentParser) -> None:
    options.model(p, many=True)
    p.add_argument("--scenario", action="append", default=[], help="only this scenario of the model (repeatable)")
    p.add_argument("--check", action="append", default=[], help="only this check of --scenario (repeatable)")
    p.add_argument("--report", help="JSON report path (default: a new file under reports/; the JUnit file beside it)")
    options.workers(p)
    p.epilog = (
        "Every other argument goes to pytest: -k EXPR, -m L2, -x, --lf, --ff, --collect-only, "
        "node ids as --collect-only prints them (profiles/<model>.yaml::<scenario>::<check>), "
        "--tb=short for a crash's traceback. From make: make parity MODEL=m SCENARIO=s CHECK=c K=expr ARGS='...'."
    )


def _history(p: argparse.ArgumentParser) -> None:
    options.model(p, what="only this model's checks")
    p.add_argument("--check", help="only this check (a check name, or scenario/check)")
    p.add_argument("--last", type=int, default=10, help="runs shown per check (default 10)")
    p.add_argument("--db", help="the results store (default: MLX_PARITY_HISTORY, else <cache>/history.sqlite)")


def _matrix(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="parity reports (.json, .json.gz) and results stores (.sqlite)")
    p.add_argument("--out", help="folder for index.html and matrix.md (default: reports/matrix-<time>/)")
    p.add_argument("--mixed-versions", action="store_true", help="merge results of different harness versions")


def _coverage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="the folder MLX_PARITY_COVERAGE named when it was recorded (default: that setting)")
    p.add_argument("--area", action="append", choices=("parity", "tests"), help="only this area (repeatable)")
    p.add_argument("--html", help="a new folder for coverage.py's HTML report, one subfolder per area")
    p.add_argument("--json", help="write the figures and every branch not walked to this JSON file")
    p.add_argument("--list", type=int, default=400, help="branches not walked printed per area (default 400)")
    p.add_argument("--fail-under", type=float, help="exit 1 when an area walks fewer percent of its branches")


def _bisect(p: argparse.ArgumentParser) -> None:
    options.model(p, required=True, what="the profile whose check broke")
    p.add_argument("--check", required=True, help="SCENARIO/CHECK, as a failure's rerun command names it")
    p.add_argument("--good", help="a revision where the check passed")
    p.add_argument("--bad", help="a later revision where it fails")
    p.add_argument("--oracle-versions", help="DIST=FIRST..LAST: bisect the oracle's releases instead (its bits)")
    p.add_argument("--every-release", action="store_true", help="with --oracle-versions: run every release")
    p.add_argument("--reruns", type=int, default=1, help="reruns per step before it decides (flake guard; default 1)")
    p.add_argument("--repo", help=argparse.SUPPRESS)  # another checkout (tests)
    p.add_argument("--pytest-args", default="", help='more pytest arguments for every step: --pytest-args="-k x"')


def _goldens(p: argparse.ArgumentParser) -> None:
    options.model(p, many=True, required=True)
    p.add_argument("--oracle", action="append", default=[], help="only the scenarios this oracle judges")


def _compact(p: argparse.ArgumentParser) -> None:
    options.model(p, many=True)


def _list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--names", action="store_true", help="only the names, one per line")
    p.add_argument("--nightly", action="store_true", help="only the names `make nightly` runs, one per line")


def _settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", action="store_true", help="rewrite docs/settings.md from the table")


def _signoff(p: argparse.ArgumentParser) -> None:
    options.model(p, many=True)
    p.add_argument("--out", help="parent folder of the sign-off directory (default: reports/)")
    p.add_argument("--previous", help="report.json (or sign-off folder) to diff against (default: newest)")
    p.add_argument("--waivers", help="waivers YAML (default: waivers.yaml at the repo root)")
    p.add_argument("--from-report", help="sign off this existing parity JSON report instead of running")
    p.add_argument("--coverage", help="coverage.json of make coverage: its branch figures go into the sign-off")
    p.add_argument("--fuzz", help="fuzz.json of make fuzz: its figures go into the sign-off")
    p.add_argument("--mutate", help="mutate.json of make mutate: its kill rates go into the sign-off")
    options.workers(p, "pytest-xdist workers for the parity run (e.g. auto)")


def _quality(p: argparse.ArgumentParser) -> None:
    options.model(p, required=True)
    p.add_argument("--pair", action="append", default=[], help="only this pair (repeatable)")
    options.out(p, "reports folder (default: reports/)")


def _calibrate(p: argparse.ArgumentParser) -> None:
    options.model(p, required=True)
    p.add_argument("--clips", help="comma-separated scenario ids whose audio to use (default: every clip once)")
    p.add_argument("--variants", help="of no-compile, batch2, fp16 (default: all three)")
    p.add_argument("--scenarios", help="comma-separated whisper-fast scenarios to calibrate (default: every one here)")
    p.add_argument("--write", action="store_true", help="write each scenario's calibration record and the budget")


def _certify(p: argparse.ArgumentParser) -> None:
    options.model(p, required=True)
    p.add_argument("--calibrate", action="store_true", help="measure the runtime's spread over its CPU kernels")
    p.add_argument("--write", action="store_true", help="with --calibrate: record the bound (then review, commit)")
    p.add_argument("--setting", action="append", default=[], help="with --calibrate: only this runtime setting")
    options.out(p, "reports folder (default: reports/)")


def _mutants(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--only", nargs="*", help="mutant names, comma- or space-separated (the matrix then covers only them)"
    )
    options.model(p, what="judge the chosen mutants on this model's scenario for them (Mutant.on)")
    p.add_argument("--json", type=Path, help="also write the verdicts here (for --summarize)")
    p.add_argument("--summarize", type=Path, nargs="+", help="print the mutant x model table of --json files")


def _fuzz(p: argparse.ArgumentParser) -> None:
    options.model(p, default="minicpm5-2b-mini")
    p.add_argument("--examples", type=int, default=50, help="examples drawn (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed: the same seed draws the same examples")
    p.add_argument("--max-steps", type=int, default=12, help="decode steps an example may ask (default %(default)s)")
    p.add_argument("--no-shrink", action="store_true", help="stop at a failing example without shrinking it")
    p.add_argument("--no-database", action="store_true", help="do not replay or keep failures in .cache/fuzz/")
    p.add_argument("--mutant", help="run under a hand-written mutant of make mutants (does the fuzzer find it?)")
    options.out(p, "a new folder for fuzz.json and the found scenarios (default: reports/fuzz-<model>-<time>/)")


def _mutate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--module", action="append", default=[], help="a target of mutation.yaml (repeatable; default: all)")
    p.add_argument("--config", type=Path, help="the targets and triage file (default: mutation.yaml)")
    p.add_argument("--list", action="store_true", help="print each target and the runs that judge it")
    options.out(p, "a new folder for mutate.json (default: reports/mutate-<time>/)")


def _vad(p: argparse.ArgumentParser) -> None:
    p.add_argument("--update", action="store_true", help="regenerate every golden from the package")
    p.add_argument("--fixtures", nargs="+", help="fixture file names (default: the profile's)")
    p.add_argument("--bench", action="store_true", help="also measure speed and float64 distances")


def _twins(p: argparse.ArgumentParser) -> None:
    commands = p.add_subparsers(dest="twins_command", required=True)
    commands.add_parser("list", help="the registered twins")
    build = commands.add_parser("build", help="build one twin into an absent or empty directory")
    build.add_argument("twin_id", help="a twin's id (`python -m harness twins list` names them)")
    build.add_argument("out_dir", type=Path)


def _portability(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", help="the Python version to resolve for (default: the project's floor)")


def _bench(p: argparse.ArgumentParser) -> None:
    options.model(p, default="smollm2-135m")
    options.steps(p, 32)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (the median is reported)")
    options.out(p)
    p.add_argument("--speed-only", type=Path, metavar="JOB_JSON", help=argparse.SUPPRESS)  # the OpenBLAS child
    p.add_argument("--speed", action="store_true", help="only the in-tree vs oracle speed and peak memory")
    p.add_argument("--per-step", action="store_true", help="only the judging cost per step against the forward")


def _bench_compiled(p: argparse.ArgumentParser) -> None:
    options.model(p, default="smollm2-135m")
    options.steps(p, 32)
    options.rounds(p, 15, "paired rounds (every side timed once per round)")
    p.add_argument("--variant", default="auto", help="compiled form: auto, whole, split, masked, blocks")
    p.add_argument("--no-oracle", action="store_true", help="time eager and compiled only")
    p.add_argument("--gate", action="store_true", help="run the L1 step gates with the compiled loop instead")
    p.add_argument("--scenario", action="append", help="with --gate: only these scenario ids")
    options.out(p)


def _bench_kv(p: argparse.ArgumentParser) -> None:
    options.model(p, default="minicpm5-2b-mini")
    p.add_argument("--configs", help="comma-separated configuration names, in the order to run (default: all)")
    p.add_argument("--contexts", help="prompt lengths in tokens, comma-separated (default: the catalogue's)")
    p.add_argument("--rounds", default="2,1,1", help="paired rounds per context (one number: all contexts)")
    options.steps(p, 64)
    p.add_argument("--prefill-step-size", type=int, default=2048, help="prefill chunk (mlx-lm's default)")
    p.add_argument("--budget-s", type=float, default=900.0, help="wall-clock budget; cells over it are not run")
    p.add_argument("--no-oracle", action="store_true", help="the in-tree side only")
    options.out(p)
    p.add_argument("--plot", type=Path, help="PNG plot (default: beside the JSON, .png)")
    p.add_argument(
        "--resume",
        type=Path,
        action="append",
        default=[],
        help="an earlier result JSON whose measured cells are kept, not rerun (repeatable: the first one's cell wins)",
    )


def _bench_whisper(p: argparse.ArgumentParser) -> None:
    options.model(p, default="whisper-tiny-en")
    options.rounds(p, 5)
    p.add_argument("--paths", default="faithful,mlx-whisper", help="comma-separated: faithful, fast, mlx-whisper")
    p.add_argument("--clips", help="comma-separated clip file names (default: every clip of the profile)")
    p.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="instead of rounds: each side's stage times (log-Mel, encoder, one greedy decode call; best of N)",
    )
    options.out(p)


def _bench_protocol(p: argparse.ArgumentParser) -> None:
    options.model(p, default="smollm2-135m-stdio")
    options.steps(p, 32)
    options.rounds(p, 15, "timed runs (each one both sides: the harness's wall time and the implementation's compute)")
    options.out(p)


def _bench_worker(p: argparse.ArgumentParser) -> None:
    options.worker(p, "JSON with prompt_ids and steps")
    p.add_argument("--side", required=True, help="eager or compiled")
    p.add_argument("--variant", default="auto", help="compiled form (models.universal.compiled_step.VARIANTS)")


def _bench_kv_worker(p: argparse.ArgumentParser) -> None:
    options.worker(p, "JSON: config, prompt_ids, steps, warmup_ids, ...")


def _bench_whisper_worker(p: argparse.ArgumentParser) -> None:
    options.worker(p, 'JSON with "clips" and "options"')
    p.add_argument("--path", required=True, help="faithful or fast")
    p.add_argument("--profile", type=int, metavar="N", help="print the stages' times (best of N) and exit")


VERBS = (
    Verb("parity", "harness.cli.core:parity", "gate models against their oracles (pytest underneath)", _parity, True),
    Verb("history", "harness.history.cli:run", "per check: last runs per device, first failure, flakes", _history),
    Verb("coverage", "harness.branch_coverage:run", "branch coverage recorded by the gates and make test", _coverage),
    Verb("matrix", "harness.history.matrix:run", "which check holds on which device, from many reports", _matrix),
    Verb("bisect", "harness.history.bisect:run", "the first commit that broke one check (git bisect run)", _bisect),
    Verb("goldens", "harness.cli.core:goldens", "(re)generate a model's goldens with its oracle, explicitly", _goldens),
    Verb("compact-goldens", "harness.cli.core:compact", "rewrite this device's full goldens as compact ones", _compact),
    Verb("list", "harness.cli.core:list_profiles", "list profiles", _list),
    Verb("settings", "harness.cli.core:settings", "the environment variables the harness reads", _settings),
    Verb(
        "signoff", "harness.signoff.cli:main", "run every profile and write a sign-off report directory", _signoff, True
    ),
    Verb("quality", "harness.quality.cli:run", "quantization quality of a profile's pairs against controls", _quality),
    Verb(
        "calibrate", "harness.tools.calibrate:run", "the Whisper fast path's L2 budget and bounds (--write)", _calibrate
    ),
    Verb(
        "certify", "harness.certificate.cli:run", "certify an artifact's conversion against its own runtime", _certify
    ),
    Verb(
        "mutants",
        "harness.tools.mutants:run",
        "inject known faults into the in-tree models; each must be caught",
        _mutants,
    ),
    Verb("mutate", "harness.mutate.cli:run", "automated mutation testing with cosmic-ray (mutation.yaml)", _mutate),
    Verb("fuzz", "harness.fuzz.cli:run", "differential fuzzing of a profile against its oracle", _fuzz),
    Verb("vad", "harness.tools.vad:run", "Silero VAD against the silero-vad package, printed per fixture", _vad),
    Verb("twins", "harness.artifacts.twins.command:run", "list or build the deterministic twin models", _twins),
    Verb("portability", "harness.portability:run", "resolve every pin file for Linux and macOS runners", _portability),
    Verb("bench", "harness.tools.bench:run", "in-tree vs mlx-lm decode speed, and the harness's own overhead", _bench),
    Verb(
        "bench-compiled",
        "harness.tools.bench_compiled:run",
        "compiled vs eager vs mlx-lm decode (--gate)",
        _bench_compiled,
    ),
    Verb("bench-kv", "harness.tools.bench_kv:run", "KV cache memory and speed per configuration", _bench_kv),
    Verb(
        "bench-whisper",
        "harness.tools.bench_whisper:run",
        "Whisper real-time factor against mlx-whisper",
        _bench_whisper,
    ),
    Verb(
        "bench-protocol",
        "harness.tools.bench_protocol:run",
        "what the process boundary costs per decode step of an external implementation",
        _bench_protocol,
    ),
    Verb("bench-worker", "harness.tools.bench_worker:run", "", _bench_worker, hidden=True),
    Verb("bench-kv-worker", "harness.tools.bench_kv_worker:run", "", _bench_kv_worker, hidden=True),
    Verb("bench-whisper-worker", "harness.tools.bench_whisper_worker:run", "", _bench_whisper_worker, hidden=True),
)
BY_NAME = {v.name: v for v in VERBS}
