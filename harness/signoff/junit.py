"""junit.xml: one testsuite per model (one testcase per check), plus one for the waivers.

CI systems read JUnit XML; the mapping follows the sign-off's statuses: FAIL is a
<failure>, ERROR an <error>, WAIVED a <skipped> whose message names the waiver. An expired
waiver is a <failure> in the `signoff.waivers` suite, and so is each check of the requested
profiles that did not run in the `signoff.not-run` suite (an INCOMPLETE sign-off), so the
XML fails exactly when the sign-off does not sign off (a model without results has no
suite: the summary says so).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from harness.signoff.model import CheckStatus, SignoffReport


def render_junit(doc: SignoffReport) -> bytes:
    s = doc.signoff
    root = ET.Element("testsuites", name=f"parity sign-off {s.harness_version} {s.device_key}")
    facts = {"verdict": s.verdict, "device_key": s.device_key, "harness_commit": doc.parity.harness_commit}
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for model in s.models:
        checks = [c for c in s.checks if c.model == model]
        suite = ET.SubElement(root, "testsuite", name=model, timestamp=doc.parity.started)
        counts = {
            "tests": len(checks),
            "failures": sum(c.status == "FAIL" for c in checks),
            "errors": sum(c.status == "ERROR" for c in checks),
            "skipped": sum(c.status == "WAIVED" for c in checks),
        }
        suite.attrib |= {k: str(v) for k, v in counts.items()} | {"time": f"{sum(c.seconds for c in checks):.3f}"}
        props = ET.SubElement(suite, "properties")
        for name, value in (facts | {"tier": ",".join(sorted({c.tier for c in checks}))}).items():
            ET.SubElement(props, "property", name=name, value=value)
        for c in checks:
            _testcase(suite, c)
        totals = {k: totals[k] + counts[k] for k in totals}
    if s.waivers:
        suite = ET.SubElement(root, "testsuite", name="signoff.waivers")
        expired = [w for w in s.waivers if w.state == "expired"]
        suite.attrib |= {"tests": str(len(s.waivers)), "failures": str(len(expired)), "errors": "0", "skipped": "0"}
        for w in s.waivers:
            case = ET.SubElement(suite, "testcase", classname="signoff.waivers", name=w.check, time="0")
            if w.state == "expired":
                ET.SubElement(case, "failure", message=f"waiver expired on {w.expires} (owner {w.owner})")
            ET.SubElement(case, "system-out").text = f"{w.reason} (owner {w.owner}, expires {w.expires}): {w.note}"
        totals["tests"] += len(s.waivers)
        totals["failures"] += len(expired)
    if s.not_run:
        suite = ET.SubElement(root, "testsuite", name="signoff.not-run")
        suite.attrib |= {"tests": str(len(s.not_run)), "failures": str(len(s.not_run)), "errors": "0", "skipped": "0"}
        for cid in s.not_run:
            model, scenario, check = cid.split("/", 2)
            case = ET.SubElement(suite, "testcase", classname=f"{model}.{scenario}", name=check, time="0")
            message = f"not run: {cid} has no result (deselected or absent from the report): the sign-off is incomplete"
            ET.SubElement(case, "failure", message=message, type="NotRun")
        totals["tests"] += len(s.not_run)
        totals["failures"] += len(s.not_run)
    root.attrib |= {k: str(v) for k, v in totals.items()}
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _testcase(suite: ET.Element, c: CheckStatus) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"{c.model}.{c.scenario}", name=c.check, time=f"{c.seconds:.3f}")
    # The message is the one-line headline (module included); the element's text the summary in full.
    if c.status == "FAIL":
        ET.SubElement(case, "failure", message=c.headline, type="ParityFailure").text = c.summary
    elif c.status == "ERROR":
        ET.SubElement(case, "error", message=c.headline, type="HarnessError").text = c.summary
    elif c.status == "WAIVED":
        ET.SubElement(case, "skipped", message=f"WAIVED by {c.waiver}: {c.summary}"[:500])
