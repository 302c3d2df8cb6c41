"""`python -m harness signoff`: a real sign-off, its page in headless Chromium, JUnit, diff, waivers.

One real sign-off (minicpm5-2b-mini, scenario think-on, ~40 s) is made once per session by
the `real` fixture through the real command line, with the profile cut to that one scenario
(a sign-off of a deselected subset is INCOMPLETE, never SIGNED OFF: the whole profile has 30
scenarios); the other tests render variants of its report (a failing check, a waiver, a
previous sign-off) through the same renderer, which reads results only.

Console errors are caught two ways, because neither alone is airtight: the page is loaded
from a copy with a probe script injected first in <head> that records `error` events
(script errors and failed resource loads, captured on window) and `console.error` /
`console.warn` calls into attributes of <html>, read back with `--dump-dom`; and the same
run logs with `--enable-logging=stderr --v=0`, where every console message of the page
appears as a `CONSOLE` line (the page itself logs nothing, so any such line is a failure).
"""

from __future__ import annotations

import copy
import datetime as dt
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import HARNESS_VERSION
from harness.checks import registry
from harness.checks.compare import compare_steps, diff_vectors
from harness.checks.localize import Localization
from harness.errors import HarnessError
from harness.paths import REPO_ROOT
from harness.profile.load import load_profile
from harness.records import ScenarioRecord
from harness.report import ItemResult, build_report, merge_reports
from harness.signoff.cli import sign_off
from harness.signoff.model import BLOCKED, INCOMPLETE, SIGNED_OFF, ParityReport
from harness.signoff.plots import scenario_plots
from harness.signoff.waivers import Waiver, WaiverError, load_waivers, parse_waivers
from harness.signoff.writer import SIGNOFF_FILES
from tests.conftest import parity_env

pytestmark = pytest.mark.xdist_group("signoff")  # one worker makes the real sign-off once

TODAY = dt.date(2026, 6, 1)


@dataclass(frozen=True)
class RealSignoff:
    returncode: int
    stdout: str
    directory: Path
    report: ParityReport  # the sign-off's report.json, read back
    profiles: Path  # the profiles it ran: the repository's, minicpm5-2b-mini cut to think-on


def _cli(*args: str, timeout: int = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = parity_env() | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> RealSignoff:
    """A real `python -m harness signoff` run (repo cache and goldens), written to a temporary folder."""
    root = tmp_path_factory.mktemp("signoff")
    (root / "waivers.yaml").write_text("[]\n")
    profiles = _think_on_profiles(root / "profiles")
    out = _cli(
        "signoff",
        "--model",
        "minicpm5-2b-mini",
        "--out",
        str(root / "reports"),
        "--waivers",
        str(root / "waivers.yaml"),
        env={"MLX_PARITY_PROFILES": str(profiles)},
    )
    dirs = sorted((root / "reports").glob("signoff-*"))
    assert len(dirs) == 1, out.stdout[-4000:] + out.stderr[-4000:]
    return RealSignoff(out.returncode, out.stdout, dirs[0], ParityReport.load(dirs[0] / "report.json"), profiles)


def _think_on_profiles(profiles: Path) -> Path:
    """The repository's profiles, minicpm5-2b-mini's cut to its think-on scenario (unchanged, so
    its goldens are the repository's): a whole profile a test can sign off in ~40 s."""
    shutil.copytree(REPO_ROOT / "profiles", profiles)
    path = profiles / "minicpm5-2b-mini.yaml"
    data = yaml.safe_load(path.read_text())
    data["scenarios"] = [s for s in data["scenarios"] if s["id"] == "think-on"]
    assert len(data["scenarios"]) == 1
    # Its checks but eos_stop and detokenize (_L1): think-on walks neither's declared path, and a
    # profile whose scenarios walk none has an ERROR row "nothing exercised" (harness/coverage.py).
    data["scenarios"][0]["checks"] = list(_L1)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return profiles


@pytest.fixture
def think_on(real: RealSignoff, monkeypatch: pytest.MonkeyPatch) -> RealSignoff:
    """The real sign-off, with this process judging against the profiles it ran."""
    monkeypatch.setenv("MLX_PARITY_PROFILES", str(real.profiles))
    return real


def _render(report: ParityReport | dict, out: Path, waivers: list[Waiver] | None = None, **kwargs) -> Path:
    parity = report if isinstance(report, ParityReport) else ParityReport.from_dict(report, "test report")
    directory, _ = sign_off(parity, waivers or [], out=out, today=TODAY, **kwargs)
    return directory


def _failing_variant(real: RealSignoff) -> dict:
    """The real report with decode_logits failing (steps 5, 9 and 20 differ, 9's top-1 token too,
    localized to a module) and greedy_tokens erroring.

    decode_logits' row is what the harness writes for such a run: `compare_steps` on logits rows
    at the real row's steps (random rows, three of them perturbed), the localization appended as
    the session appends it."""
    data = copy.deepcopy(real.report.raw)
    data.pop("signoff")
    for r in data["results"]:
        if r["check"] == "decode_logits":
            r.update(_differing_decode_row([s["step"] for s in r["details"]["per_step"]]))
        if r["check"] == "greedy_tokens":
            r["outcome"], r["summary"] = "error", "golden unreadable <b>&</b>"
    data["context"]["harness_commit"] = "0000000"
    return data


FAILING_MODULE = "model.layers.1.mlp"


def _differing_decode_row(steps: list[int]) -> dict:
    golden = np.random.default_rng(5).standard_normal((max(steps) + 1, 64)).astype(np.float32) * 4
    actual = golden.copy()
    for step, scale in ((5, 1e-6), (9, 1e-4), (20, 1e-5)):
        actual[step] *= np.float32(1 + scale)
    actual[9, int(np.argsort(golden[9])[-2])] = golden[9].max() + 1

    def record(logits: np.ndarray) -> ScenarioRecord:
        return ScenarioRecord("think-on", None, [1], [int(np.argmax(x)) for x in logits], logits, [0])

    result = compare_steps("decode_logits", record(golden), record(actual), steps)
    where = Localization(5, FAILING_MODULE, diff_vectors(golden[5], actual[5]), modules_compared=23)
    assert not result.passed and result.first_bad_step == 5, result.summary
    return {
        "outcome": "failed",
        "first_bad_step": 5,
        "summary": f"{result.summary}; {where.explain()}",
        "details": result.details | {"per_step": result.per_step, "localization": where.as_dict()},
    }


# -- the real sign-off ---------------------------------------------------------------------


def test_signoff_writes_the_four_files_for_a_real_run(real: RealSignoff) -> None:
    assert real.returncode == 0, real.stdout[-4000:]
    assert "sign-off: SIGNED OFF" in real.stdout
    device_key = real.report.device_key
    assert real.directory.name == f"signoff-{HARNESS_VERSION}-{device_key}"
    assert sorted(p.name for p in real.directory.iterdir()) == sorted(SIGNOFF_FILES)
    signoff = real.report.signoff
    assert signoff["verdict"] == SIGNED_OFF and signoff["blockers"] == []
    assert signoff["requested_models"] == ["minicpm5-2b-mini"]
    assert {c["id"] for c in signoff["checks"]} == {f"minicpm5-2b-mini/think-on/{c}" for c in _L1}
    summary = (real.directory / "summary.md").read_text()
    assert summary.startswith("# Parity sign-off: SIGNED OFF")
    assert "| minicpm5-2b-mini | L1 | think-on |" + " PASS |" * len(_L1) in summary
    assert "- artifacts: minicpm5-2b-mini **twin**" in summary  # twin vs real, per profile
    page = (real.directory / "index.html").read_text()
    for needle in (device_key, real.report.harness_commit, "oracle pins hash", "golden hashes", "peak RSS"):
        assert needle in page


# The defaults in table order, but eos_stop (see _think_on_profiles): what the cut think-on runs.
# The default checks but those whose declared paths think-on alone does not walk (a profile cut to
# it would have them "nothing exercised"): eos_stop (no run stops), detokenize (no last piece
# is a finalize() flush).
_L1 = tuple(c for c in registry.defaults() if c not in ("eos_stop", "detokenize"))


def test_the_real_run_is_incomplete_against_the_whole_profile(real: RealSignoff, tmp_path: Path) -> None:
    """The same real report judged against the repository's minicpm5-2b-mini (30 scenarios) is a
    deselected subset: INCOMPLETE, every other check of the profile named as not run."""
    data = copy.deepcopy(real.report.raw)
    data.pop("signoff")
    directory = _render(data, tmp_path, requested_models=["minicpm5-2b-mini"])
    signoff = json.loads((directory / "report.json").read_text())["signoff"]
    profile = load_profile(REPO_ROOT / "profiles" / "minicpm5-2b-mini.yaml")
    backend = real.report.device["backend"]
    every = [f"{profile.name}/{s.id}/{c}" for s in profile.active_scenarios(backend) for c in profile.checks(s)]
    ran = [f"{profile.name}/think-on/{c}" for c in _L1]
    assert set(ran) < set(every)
    assert signoff["verdict"] == INCOMPLETE and signoff["blockers"] == []
    assert signoff["expected_checks"] == len(every) and signoff["not_run"] == [i for i in every if i not in ran]
    summary = (directory / "summary.md").read_text()
    assert summary.startswith("# Parity sign-off: INCOMPLETE")
    assert f"## Not run ({len(every) - len(ran)} of {len(every)} checks of the requested profiles)" in summary


@pytest.mark.usefixtures("think_on")
def test_page_is_self_contained(real: RealSignoff, tmp_path: Path) -> None:
    failing = _render(_failing_variant(real), tmp_path) / "index.html"
    for path, plots in ((real.directory / "index.html", 0), (failing, 1)):
        page = path.read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
        assert "<link" not in page and "@import" not in page and "url(" not in page
        assert not re.search(r"<script[^>]+src", page)
        # think-on passing: bit-identical, no plot; failing: decode_logits differs, one figure.
        assert len(re.findall(r'src="data:image/png;base64,', page)) == plots
    assert "1 scenario bit-identical: no plot" in (real.directory / "index.html").read_text()
    blocking = re.search(r'<section id="blocking".*?</section>', failing.read_text(), re.S).group(0)
    assert "check minicpm5-2b-mini/think-on/decode_logits</b> — <span>FAIL: step 5, max ULP" in blocking
    assert f"first diverging module {FAILING_MODULE}</span>" in blocking
    # The figure's series: the checks with per-step figures (a row decided by its digest has none).
    results = ParityReport.load(failing.parent / "report.json").results
    (figure,) = scenario_plots(results).figures
    drawn = {r.check for r in results if any("kl" in s for s in r.details.get("per_step", []))}
    assert "decode_logits" in figure.legend and figure.legend == [c for c in _L1 if c in drawn]


@pytest.mark.usefixtures("think_on")
def test_junit_counts_match_the_report(real: RealSignoff, tmp_path: Path) -> None:
    for directory in (
        real.directory,
        _render(_failing_variant(real), tmp_path, [_waiver("minicpm5-2b-mini/*/decode_logits")]),
    ):
        report = json.loads((directory / "report.json").read_text())
        root = ET.parse(directory / "junit.xml").getroot()
        suites = {s.get("name"): s for s in root.iter("testsuite")}
        for model in {r["model"] for r in report["results"]}:
            checks = [c for c in report["signoff"]["checks"] if c["model"] == model]
            suite = suites[model]
            assert int(suite.get("tests")) == len(checks) == len(suite.findall("testcase"))
            for attr, status in (("failures", "FAIL"), ("errors", "ERROR"), ("skipped", "WAIVED")):
                assert int(suite.get(attr)) == sum(c["status"] == status for c in checks), attr
                assert int(suite.get(attr)) == report["signoff"]["counts"][status], attr
        assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert (
        cases["decode_logits"].find("skipped").get("message").startswith("WAIVED by minicpm5-2b-mini/*/decode_logits")
    )
    assert cases["greedy_tokens"].find("error") is not None


@pytest.mark.usefixtures("think_on")
def test_diff_against_the_previous_signoff(real: RealSignoff, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    first = _render(_failing_variant(real), out)
    second = _render(real.report, out)  # found the first as its previous (same device)
    assert second.name == first.name + "-2"
    diff = json.loads((second / "report.json").read_text())["signoff"]["diff"]
    assert diff["previous"] == str(first / "report.json") and diff["previous_verdict"] == BLOCKED
    assert diff["newly_passing"] == [f"minicpm5-2b-mini/think-on/{c}" for c in ("decode_logits", "greedy_tokens")]
    assert diff["newly_failing"] == [] and diff["added"] == [] and diff["removed"] == []
    assert {c["key"]: (c["old"], c["new"]) for c in diff["provenance_changes"]} == {
        "harness_commit": ("0000000", real.report.harness_commit)
    }
    third = _render(_failing_variant(real), out, previous=first)  # explicit: against the BLOCKED one
    diff = json.loads((third / "report.json").read_text())["signoff"]["diff"]
    assert diff["newly_failing"] == [] and diff["provenance_changes"] == []
    fourth = _render(_failing_variant(real), out)  # the newest sign-off of the device is the previous
    assert json.loads((fourth / "report.json").read_text())["signoff"]["diff"]["previous"] == str(third / "report.json")
    fifth = _render(real.report, tmp_path / "fresh", previous=second)
    sixth = _render(_failing_variant(real), tmp_path / "fresh")
    diff = json.loads((sixth / "report.json").read_text())["signoff"]["diff"]
    assert diff["previous"] == str(fifth / "report.json")
    assert set(diff["newly_failing"]) == {
        "minicpm5-2b-mini/think-on/decode_logits",
        "minicpm5-2b-mini/think-on/greedy_tokens",
    }
    assert "Newly failing (2)" in (sixth / "index.html").read_text()
    assert "- newly failing (2): `minicpm5-2b-mini/think-on/decode_logits`" in (sixth / "summary.md").read_text()


# -- headless Chromium ---------------------------------------------------------------------

# Injected first in <head> of a copy of the page: records every error event (captured on window,
# so failed image loads count too) and console.error/warn calls into <html data-errors>; after
# load, records the matrix and plots as the browser sees them, and exercises the page's filter.
_PROBE = """<script>
(function () {
  var root = document.documentElement, errors = [];
  function record(text) {
    errors.push(String(text));
    root.setAttribute('data-errors', JSON.stringify(errors));
  }
  root.setAttribute('data-errors', '[]');
  window.addEventListener('error', function (e) {
    var what = e.target && (e.target.src || e.target.href);
    record(e.message ? 'error: ' + e.message : 'resource failed: ' + String(what).slice(0, 120));
  }, true);
  window.addEventListener('unhandledrejection', function (e) { record('unhandled rejection: ' + e.reason); });
  ['error', 'warn'].forEach(function (level) {
    var original = console[level];
    console[level] = function () {
      record('console.' + level + ': ' + [].join.call(arguments, ' '));
      original.apply(console, arguments);
    };
  });
  window.addEventListener('load', function () {
    var images = [].slice.call(document.images);
    var box = document.getElementById('only-problems');
    box.checked = true; box.dispatchEvent(new Event('change'));
    var shown = document.querySelectorAll('#verdict-matrix tbody tr:not([hidden])').length;
    box.checked = false; box.dispatchEvent(new Event('change'));
    root.setAttribute('data-probe', JSON.stringify({
      rows: document.querySelectorAll('#verdict-matrix tbody tr').length,
      cells: [].map.call(document.querySelectorAll('#verdict-matrix td.cell'), function (td) {
        return td.textContent;
      }),
      images: images.length,
      broken: images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length,
      rowsWhenFiltered: shown,
      verdict: document.getElementById('verdict').textContent
    }));
  });
})();
</script>"""

_CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def _chromium() -> str:
    """The browser; missing it fails under CI (CI=true), skips on a developer's machine."""
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    message = "headless Chromium not found (Debian: apt-get install chromium; or set CHROMIUM)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _browse(page: Path, *flags: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [_chromium(), *_CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=180,
        )


def _probe(page: Path, tmp_path: Path) -> tuple[list[str], dict, list[str]]:
    """(recorded errors, probe facts, CONSOLE lines of the Chromium log) for a page."""
    probe_page = tmp_path / "probe.html"
    text = page.read_text()
    assert text.count("<head>") == 1
    probe_page.write_text(text.replace("<head>", "<head>" + _PROBE, 1))
    run = _browse(probe_page, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom")
    assert run.returncode == 0, run.stderr[-3000:]
    html_tag = re.search(r"<html[^>]*>", run.stdout)
    assert html_tag, run.stdout[:2000]
    attrs = {k: v for k, v in re.findall(r'([\w-]+)="([^"]*)"', html_tag.group(0))}
    assert "data-probe" in attrs, f"the page's load event never completed: {attrs}"
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(html.unescape(attrs["data-errors"])), json.loads(html.unescape(attrs["data-probe"])), console


# Full-page screenshots kept after the run (reports/ is not tracked): what the page looked like.
SCREENS = REPO_ROOT / "reports" / "screens"


def _keep_screenshot(page: Path, name: str, tmp_path: Path, capsys, record_property) -> Path:
    """Screenshot `page` at 1280 x 2000 into reports/screens/<name>.png and print where; the PNG
    must decode to that size and hold more than a blank page's colours."""
    from PIL import Image

    shot = tmp_path / f"{name}.png"
    run = _browse(page, f"--screenshot={shot}", "--window-size=1280,2000")
    assert run.returncode == 0 and shot.exists() and shot.stat().st_size > 0, run.stderr[-3000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        assert len(image.convert("RGB").getcolors(maxcolors=1280 * 2000)) > 100  # not blank
    SCREENS.mkdir(parents=True, exist_ok=True)
    kept = SCREENS / f"{name}.png"
    shutil.copyfile(shot, kept)
    record_property("screenshot", str(kept))  # in pytest's --junitxml too
    with capsys.disabled():
        print(f"\nscreenshot of the sign-off page: {kept}")
    return kept


def test_page_loads_in_headless_chromium_without_errors_and_shows_the_matrix(
    real: RealSignoff, tmp_path: Path, capsys: pytest.CaptureFixture, record_property
) -> None:
    errors, probe, console = _probe(real.directory / "index.html", tmp_path)
    assert errors == [] and console == []
    assert probe["rows"] == 1 and probe["cells"] == ["PASS"] * len(_L1)
    assert probe["images"] == 0 and probe["broken"] == 0  # bit-identical: no plot
    assert probe["rowsWhenFiltered"] == 0  # every row passes: the filter hides them all
    assert "SIGNED OFF" in probe["verdict"]

    shot = tmp_path / "screenshot.png"
    run = _browse(real.directory / "index.html", f"--screenshot={shot}", "--window-size=1400,1000")
    assert run.returncode == 0 and shot.exists(), run.stderr[-3000:]
    colors = _pixel_counts(shot)
    # The first screen shows the verdict banner and the matrix: green banner, green PASS cells.
    assert colors[(0x1A, 0x7F, 0x37)] > 30_000  # the SIGNED OFF banner (#1a7f37), ~1200 x 50 px
    assert colors[(0xDA, 0xFB, 0xE1)] > 3_000  # six PASS cells' background (#dafbe1)
    assert len(colors) > 100  # text and tables: not a blank or single-colour page
    _keep_screenshot(real.directory / "index.html", "signoff-signed-off", tmp_path, capsys, record_property)


@pytest.mark.usefixtures("think_on")
def test_blocked_page_in_headless_chromium(
    real: RealSignoff, tmp_path: Path, capsys: pytest.CaptureFixture, record_property
) -> None:
    directory = _render(
        _failing_variant(real), tmp_path / "reports", [_waiver("minicpm5-2b-mini/think-on/decode_logits")]
    )
    errors, probe, console = _probe(directory / "index.html", tmp_path)
    assert errors == [] and console == []
    expected = {"decode_logits": "WAIVED", "greedy_tokens": "ERROR"}  # what _failing_variant and the waiver did
    assert probe["cells"] == [expected.get(c, "PASS") for c in _L1]
    assert probe["rowsWhenFiltered"] == 1 and "BLOCKED" in probe["verdict"]
    assert probe["images"] == 1 and probe["broken"] == 0  # decode_logits differs: its figure decodes
    assert "golden unreadable &lt;b&gt;&amp;&lt;/b&gt;" in (directory / "index.html").read_text()  # escaped
    shot = tmp_path / "blocked.png"
    assert _browse(directory / "index.html", f"--screenshot={shot}", "--window-size=1400,1000").returncode == 0
    assert _pixel_counts(shot)[(0xCF, 0x22, 0x2E)] > 30_000  # the BLOCKED banner (#cf222e)
    _keep_screenshot(directory / "index.html", "signoff-blocked", tmp_path, capsys, record_property)


def _pixel_counts(png: Path) -> dict[tuple[int, int, int], int]:
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1400, 1000)
        rgb = image.convert("RGB")
        return {color: n for n, color in rgb.getcolors(maxcolors=1400 * 1000)}


# -- verdict rules and waivers (synthetic reports: fast) -------------------------------------


def _waiver(check: str, expires: dt.date = dt.date(2026, 12, 31)) -> Waiver:
    return Waiver(check=check, reason="accepted for a test", owner="tester", expires=expires)


def _report(*items: tuple[str, str, str, str]) -> ParityReport:
    results = [
        ItemResult(model=m, scenario=s, check=c, tier="L1", oracle="mlx-lm", outcome=o, summary=f"{c} {o}")
        for m, s, c, o in items
    ]
    context = {"device": {"key": "cpu-test-device"}, "harness_commit": "abc", "provenance": {}}
    return ParityReport.from_dict(build_report(results, context, dt.datetime.now(dt.UTC)), "synthetic")


def _signoff(report: ParityReport, waivers: list[Waiver], tmp_path: Path, **kwargs) -> dict:
    return json.loads((_render(report, tmp_path, waivers, **kwargs) / "report.json").read_text())["signoff"]


def test_waived_failure_signs_off_and_unused_waivers_are_reported(tmp_path: Path) -> None:
    report = _report(("m", "a", "decode_logits", "failed"), ("m", "a", "eos_stop", "passed"))
    waivers = [_waiver("m/*/decode_logits", expires=TODAY), _waiver("other/*/*"), _waiver("m/a/eos_stop")]
    s = _signoff(report, waivers, tmp_path)
    assert s["verdict"] == SIGNED_OFF  # valid through its expiry day
    assert [c["status"] for c in s["checks"]] == ["WAIVED", "PASS"]
    assert s["checks"][0]["waiver"] == "m/*/decode_logits"
    uses = {w["check"]: w for w in s["waivers"]}
    assert uses["m/*/decode_logits"]["waived"] == ["m/a/decode_logits"]
    assert uses["other/*/*"]["matched"] == []
    assert uses["m/a/eos_stop"]["matched"] == ["m/a/eos_stop"] and uses["m/a/eos_stop"]["waived"] == []
    summary = next(tmp_path.glob("signoff-*/summary.md")).read_text()
    assert "matches no check of this run" in summary and "matches only passing checks" in summary


def test_expired_waiver_blocks_and_waives_nothing(tmp_path: Path) -> None:
    report = _report(("m", "a", "decode_logits", "failed"), ("m", "a", "eos_stop", "passed"))
    yesterday = TODAY - dt.timedelta(days=1)
    s = _signoff(
        report, [_waiver("m/a/decode_logits", expires=yesterday), _waiver("x/y/z", expires=yesterday)], tmp_path
    )
    assert s["verdict"] == BLOCKED
    assert s["checks"][0]["status"] == "FAIL"
    blockers = {(b["kind"], b["subject"]) for b in s["blockers"]}
    assert blockers == {("check", "m/a/decode_logits"), ("waiver", "m/a/decode_logits"), ("waiver", "x/y/z")}
    assert "waiver expired on 2026-05-31" in next(b["reason"] for b in s["blockers"] if b["subject"] == "x/y/z")
    junit = ET.parse(next(tmp_path.glob("signoff-*/junit.xml"))).getroot()
    waiver_suite = next(suite for suite in junit.iter("testsuite") if suite.get("name") == "signoff.waivers")
    assert waiver_suite.get("failures") == "2"


def test_missing_model_no_checks_and_abnormal_exit_block(tmp_path: Path) -> None:
    report = _report(("m", "a", "eos_stop", "passed"))
    s = _signoff(report, [], tmp_path / "1", requested_models=["m", "gone"])
    assert s["verdict"] == BLOCKED and [(b["kind"], b["subject"]) for b in s["blockers"]] == [("model", "gone")]
    assert _signoff(report, [], tmp_path / "2", parity_exit_code=0)["verdict"] == SIGNED_OFF
    assert _signoff(report, [], tmp_path / "3", parity_exit_code=1)["verdict"] == BLOCKED  # yet every check passed
    assert _signoff(report, [], tmp_path / "4", parity_exit_code=3)["verdict"] == BLOCKED
    assert _signoff(_report(), [], tmp_path / "5")["blockers"][0]["reason"] == "no checks ran"


def test_signoff_runs_each_profile_in_its_own_process_and_merges(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 14 part 5: one parity child per profile (so peak memory is the largest profile's),
    reports merged; a run that fails or writes nothing blocks under its own name."""
    from harness.signoff import cli

    outcome = {"a": ("passed", 0), "b": ("failed", 1), "c": (None, 5), "d": ("passed", 2)}
    calls = []

    def fake_run(command, cwd, check):
        calls.append(command)
        assert command.count("--model") == 1
        model = command[command.index("--model") + 1]
        state, code = outcome[model]
        if state:
            report = _report((model, "s", "decode_logits", state), (model, "s", "eos_stop", "passed")).raw
            report["context"].update(models=[model], provenance={model: {"rev": model}}, scoped_out=[f"{model}/gpu"])
            Path(command[command.index("--report") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(command, code)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    merged, code = cli.run_parity(list(outcome), None, ["--", "-k", "x"])
    assert [c[c.index("--model") + 1] for c in calls] == ["a", "b", "c", "d"]
    assert len({c[c.index("--report") + 1] for c in calls}) == 4 and calls[0][-3:] == ["--", "-k", "x"]
    assert code == 5  # an abnormal exit wins over a failed check
    assert [(r.model, r.check, r.outcome) for r in merged.results] == [
        (m, c, o) for m in "abd" for c, o in (("decode_logits", outcome[m][0]), ("eos_stop", "passed"))
    ]
    assert merged.verdict == "FAIL" and merged.raw["counts"] == {"passed": 5, "failed": 1, "error": 0}
    assert merged.context["runs"] == {"a": 0, "b": 1, "c": 5, "d": 2}
    assert merged.context["models"] == ["a", "b", "d"] and merged.context["scoped_out"] == ["a/gpu", "b/gpu", "d/gpu"]
    assert sorted(merged.context["provenance"]) == ["a", "b", "d"]
    s = _signoff(merged, [], tmp_path, requested_models=list(outcome), parity_exit_code=code)
    blockers = {(b["kind"], b["subject"]): b["reason"] for b in s["blockers"]}
    assert set(blockers) == {("check", "b/s/decode_logits"), ("run", "c"), ("model", "c"), ("run", "d")}
    assert blockers[("run", "d")] == "its parity run exited with code 2"

    outcome.update(a=(None, 4), b=(None, 3), c=(None, 5), d=(None, 2))
    with pytest.raises(HarnessError, match=r"no parity run wrote a report \(exit codes: a 4, b 3, c 5, d 2\)"):
        cli.run_parity(list(outcome), None, [])


def test_merging_refuses_reports_of_different_devices_or_versions() -> None:
    one = _report(("a", "s", "eos_stop", "passed")).raw
    other = copy.deepcopy(one)
    other["context"]["device"] = {"key": "gpu-elsewhere"}
    with pytest.raises(HarnessError, match="disagree on context 'device'"):
        merge_reports([one, other], {"a": 0, "b": 0})
    other = copy.deepcopy(one)
    other["harness_version"] = "0.0.1"
    with pytest.raises(HarnessError, match="different harness versions"):
        merge_reports([one, other], {"a": 0, "b": 0})
    assert merge_reports([one, copy.deepcopy(one)], {"a": 0})["counts"]["passed"] == 2


def test_glob_parts_do_not_span_slashes() -> None:
    assert _waiver("m/*/decode_logits").matches("m/a/decode_logits")
    assert not _waiver("*/decode_logits/*").matches("m/a/decode_logits")
    assert _waiver("minicpm5-*/kv?-*/[dt]*_logits").matches("minicpm5-2b/kv4-from-prefill/decode_logits")
    assert not _waiver("m/*/decode_logits").matches("m2/a/decode_logits")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{check: a/b/c}", "expected a list of waivers, got dict"),
        ("- a/b/c", "[0]: expected a mapping with keys check, reason, owner, expires"),
        ("- {check: a/b/c, reason: r, owner: o}", "[0].expires: required"),
        ("- {check: a/b/c, reason: r, owner: o, expires: 2027-01-01, ticket: 1}", "[0]: unknown key(s) ['ticket']"),
        ("- {check: a/b, reason: r, owner: o, expires: 2027-01-01}", "[0].check: expected 'model/scenario/check'"),
        ("- {check: a/b/c, reason: '', owner: o, expires: 2027-01-01}", "[0].reason: expected a non-empty string"),
        ("- {check: a/b/c, reason: r, owner: 7, expires: 2027-01-01}", "[0].owner: expected a non-empty string"),
        ("- {check: a/b/c, reason: r, owner: o, expires: soon}", "[0].expires: expected a date YYYY-MM-DD, got 'soon'"),
        ("- {check: a/b/c, reason: r, owner: o, expires: '2027-02-30'}", "[0].expires: expected a date"),
        ("- {check: a/b/c, reason: r, owner: o, expires: 2027-01-01 10:00:00}", "[0].expires: expected a date"),
        (
            "- {check: a/b/c, reason: r, owner: o, expires: 2027-01-01}\n- {check: a/b/c, reason: s, owner: p, "
            "expires: 2027-01-01}",
            "[1].check: 'a/b/c' is already waived by entry [0]",
        ),
        ("- {check: [a, b, c", "not valid YAML"),
        ("- {check: '*/*/*', reason: r, owner: o, expires: 2027-01-01}", "[0].check: the model part must name a model"),
        (
            "- {check: 'm/*/?*', reason: r, owner: o, expires: 2027-01-01}",
            "[0].check: the check part must name a check",
        ),
    ],
)
def test_malformed_waivers_name_file_entry_and_key(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "waivers.yaml"
    path.write_text(text + "\n")
    with pytest.raises(WaiverError) as excinfo:
        load_waivers(path)
    assert str(excinfo.value).startswith(f"{path}: ") and error in str(excinfo.value)


def test_waivers_file_forms() -> None:
    assert parse_waivers(None, "w") == [] and parse_waivers([], "w") == []
    (w,) = parse_waivers([{"check": "a/b/c", "reason": "r", "owner": "o", "expires": "2027-01-31"}], "w")
    assert w.expires == dt.date(2027, 1, 31)
    assert load_waivers(Path("/nonexistent/waivers.yaml")) == []
    # The repository's own file must always load (an empty list, or real waivers).
    assert isinstance(load_waivers(REPO_ROOT / "waivers.yaml"), list)
    assert isinstance(yaml.safe_load((REPO_ROOT / "waivers.yaml").read_text()), list)


# -- command line ----------------------------------------------------------------------------


@pytest.mark.usefixtures("think_on")
def test_cli_exit_codes_and_sign_offs_are_never_clobbered(real: RealSignoff, tmp_path: Path) -> None:
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps(_failing_variant(real)))
    out = tmp_path / "reports"
    (tmp_path / "none.yaml").write_text("[]\n")
    args = ("signoff", "--from-report", str(failing), "--out", str(out), "--waivers", str(tmp_path / "none.yaml"))
    env = {"MLX_PARITY_PROFILES": str(real.profiles)}
    first = _cli(*args, timeout=120, env=env)
    assert first.returncode == 1 and "sign-off: BLOCKED" in first.stdout, first.stderr[-3000:]
    assert "blocking check minicpm5-2b-mini/think-on/decode_logits" in first.stdout
    (directory,) = out.glob("signoff-*")
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    waived = tmp_path / "waived.yaml"
    soon = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=30)).isoformat()  # a waiver's horizon: a year
    waived.write_text(
        yaml.safe_dump(
            [
                {"check": f"minicpm5-2b-mini/think-on/{c}", "reason": "r", "owner": "o", "expires": soon}
                for c in ("decode_logits", "greedy_tokens")
            ]
        )
    )
    second = _cli(*args[:-1], str(waived), timeout=120, env=env)
    assert second.returncode == 0 and "sign-off: SIGNED OFF" in second.stdout, second.stdout + second.stderr
    assert sorted(p.name for p in out.iterdir()) == [directory.name, directory.name + "-2"]
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert not list(out.glob(".*"))  # no staging directory left behind
    # Against the repository's whole profile the same report is a partial run: INCOMPLETE, exit 3.
    partial = _cli(*args[:-1], str(waived), timeout=120)
    assert partial.returncode == 3 and "sign-off: INCOMPLETE" in partial.stdout, partial.stdout + partial.stderr
    assert "not run: " in partial.stdout and "SIGNED OFF" not in partial.stdout

    waived.write_text("- {check: nope}\n")
    bad = _cli(*args[:-1], str(waived), timeout=120, env=env)
    assert bad.returncode == 2 and f"error: {waived}: [0].reason: required" in bad.stderr
    missing = _cli("signoff", "--from-report", str(tmp_path / "absent.json"), "--out", str(out), timeout=120, env=env)
    assert missing.returncode == 2 and "cannot read a JSON report" in missing.stderr


# -- GitHub Actions workflows ----------------------------------------------------------------

WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def test_workflows_validate_against_the_github_workflow_schema() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"pull-request.yml", "nightly-signoff.yml"}
    check = Path(sys.executable).parent / "check-jsonschema"
    out = subprocess.run(
        [str(check), "--builtin-schema", "vendor.github-workflows", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_workflows_pass_actionlint() -> None:
    actionlint = Path(sys.executable).parent / "actionlint"
    files = sorted(WORKFLOWS.glob("*.yml"))
    out = subprocess.run([str(actionlint), *map(str, files)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """The gate above can fail: an undefined step output and a deprecated action are errors."""
    text = (WORKFLOWS / "pull-request.yml").read_text()
    broken = text.replace("steps.py.outputs.version", "steps.pyy.outputs.version").replace("@v5", "@v4", 1)
    (tmp_path / "broken.yml").write_text(broken)
    actionlint = Path(sys.executable).parent / "actionlint"
    out = subprocess.run([str(actionlint), str(tmp_path / "broken.yml")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "pyy" in out.stdout and "node20" in out.stdout, out.stdout + out.stderr


def test_workflows_do_what_the_issue_asks() -> None:
    pr = yaml.safe_load((WORKFLOWS / "pull-request.yml").read_text())
    nightly = yaml.safe_load((WORKFLOWS / "nightly-signoff.yml").read_text())
    # PyYAML reads the key `on` as True (YAML 1.1 boolean).
    assert "pull_request" in pr[True]
    (pr_job,) = pr["jobs"].values()
    assert pr_job["runs-on"].startswith("ubuntu") and "bash .ci/run" in [s.get("run") for s in pr_job["steps"]]
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()
    assert "schedule" in nightly[True]
    job, matrix = nightly["jobs"]["signoff"], nightly["jobs"]["matrix"]
    # Real Metal: a self-hosted Apple Silicon runner (GitHub's hosted arm64 macOS GPU is paravirtual).
    assert job["runs-on"] == ["self-hosted", "macOS", "ARM64", "metal"]
    assert matrix["needs"] == ["signoff", "hosted-cpu"] and matrix["if"] == "always()"
    assert any("python -m harness matrix" in s.get("run", "") for s in matrix["steps"])
    steps = job["steps"]
    cached = " ".join(s["with"]["path"] for s in steps if "actions/cache" in s.get("uses", "") and "path" in s["with"])
    for path in (".venv", ".cache/venvs", ".cache/hf-home", ".cache/blobs", ".cache/artifacts", ".cache/hf-twins"):
        assert path in cached
    assert job["env"]["HF_HOME"].endswith(".cache/hf-home")
    assert any("make signoff" in s.get("run", "") for s in steps)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"].startswith("always()") and "steps.signoff.outputs.dir" in upload["with"]["path"]
    # issue 14: Metal manifests cached, exact Python and every pin file in the venv key, ffmpeg,
    # only the last sign-off kept, hub failures are errors; the PR job saves caches on failure.
    assert "goldens/*/metal-*" in cached
    for job_ in (job, pr_job):
        venv_key = next(s["with"]["key"] for s in job_["steps"] if ".cache/venvs" in s.get("with", {}).get("path", ""))
        assert "oracles/*/requirements*.txt" in venv_key and "steps.py.outputs" in venv_key
        saves = [s for s in job_["steps"] if "actions/cache/save" in s.get("uses", "")]
        assert saves and all(s["if"].startswith("always()") for s in saves)
        assert not any(s.get("uses", "").startswith("actions/cache@") for s in job_["steps"])
    assert any("brew install ffmpeg" in s.get("run", "") for s in steps)
    assert job["env"]["MLX_PARITY_REQUIRE_REAL"] == "1"
    assert any("Keep only the last sign-off" == s.get("name") for s in steps)
    assert "--shm-size" in pr_job["container"]["options"]


@pytest.mark.usefixtures("think_on")
def test_rerendering_a_signoff_does_not_diff_against_itself(real: RealSignoff, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    first = _render(real.report, out)
    again = _render(ParityReport.load(first / "report.json"), out, exclude_previous=first / "report.json")
    assert json.loads((again / "report.json").read_text())["signoff"]["diff"] is None


@pytest.mark.usefixtures("think_on")
def test_quality_section_is_shown_apart_from_the_verdict(real: RealSignoff, tmp_path: Path) -> None:
    """A quality report of the signed-off model (one pair failing its thresholds, one whose in-tree
    cross-check differed) is listed in its own section; the verdict is the same as without it."""
    data = copy.deepcopy(real.report.raw)
    data.pop("signoff")
    without = _render(data, tmp_path / "plain")
    kl = {"mean": {"value": 0.5, "se": 0.01}, "median": {"value": 0.1}, "p95": {"value": 1.0}, "p99": {"value": 2.0}}
    pair = {
        "candidate": {"label": "profile artifact"},
        "ran": "twin",
        "summary": {"kl": kl, "top1_agreement": {"value": 0.5, "se": 0.01}, "ppl_ratio": {"value": 1.5}},
    }
    doc = {
        "model": "minicpm5-2b-mini",
        "generated": "2026-12-02T00:00:00+00:00",
        "device": {"key": real.report.device_key},
        "pairs": [
            pair | {"id": "fails-thresholds", "cross_check": {"status": "equal"}, "quality": {"status": "FAIL"}},
            pair | {"id": "cross-check-differs", "cross_check": {"status": "differs"}, "quality": None},
        ],
    }
    out = tmp_path / "with"
    (out / "quality-minicpm5-2b-mini-x").mkdir(parents=True)
    (out / "quality-minicpm5-2b-mini-x" / "quality.json").write_text(json.dumps(doc))
    directory = _render(data, out, requested_models=["minicpm5-2b-mini"])
    verdict = json.loads((directory / "report.json").read_text())["signoff"]["verdict"]
    assert verdict == json.loads((without / "report.json").read_text())["signoff"]["verdict"] == SIGNED_OFF
    summary = (directory / "summary.md").read_text()
    assert "## Quality (not part of the verdict)" in summary
    assert "| minicpm5-2b-mini | fails-thresholds | profile artifact | twin |" in summary and "| FAIL |" in summary
    page = (directory / "index.html").read_text()
    assert '<section id="quality"><h2>Quality (not part of the verdict)</h2>' in page
    assert "differs (a parity failure)" in page
    assert "no quality report of a signed-off model" in (without / "index.html").read_text()


def test_the_sign_off_carries_the_branch_coverage_figures_it_is_given(tmp_path: Path) -> None:
    """Issue 53 part 1: the number in the sign-off (summary.md, the page, report.json)."""
    from harness.branch_coverage import read_figures

    figures = tmp_path / "coverage.json"
    figures.write_text(json.dumps({"parity": {"branches": 200, "walked": 150, "exempt": 4, "percent": 75.0}}))
    report = _report(("m", "a", "decode_logits", "passed"))
    directory = _render(report, tmp_path / "with", coverage=read_figures(figures))
    assert (
        "- branch coverage: models/ walked by the gates (python -m harness parity): 75.0 % (150/200, 4 exempt"
        in (directory / "summary.md").read_text()
    )
    assert "branch coverage: models/ walked by the gates" in (directory / "index.html").read_text()
    assert json.loads((directory / "report.json").read_text())["branch_coverage"]["parity"]["walked"] == 150
    without = _render(report, tmp_path / "without")
    assert "- branch coverage: not measured for this sign-off" in (without / "summary.md").read_text()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[]", "expected an object keyed by area"),
        ('{"nope": {}}', "expected an object keyed by area"),
        ('{"parity": {"branches": 3, "walked": "2", "exempt": 0}}', "parity.walked must be a count"),
        ('{"parity": {"branches": 3, "walked": 4, "exempt": 0}}', "parity.walked exceeds parity.branches"),
        ("{", "unreadable"),
    ],
)
def test_malformed_coverage_figures_are_refused_naming_the_field(tmp_path: Path, text: str, said: str) -> None:
    from harness.branch_coverage import read_figures

    path = tmp_path / "coverage.json"
    path.write_text(text)
    with pytest.raises(HarnessError, match=said):
        read_figures(path)
