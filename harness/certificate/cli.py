"""`python -m harness certify --model M [--calibrate [--write] [--isa ISA ...]] [--out DIR]`.

Without `--calibrate`: the conversion certificate of M's artifact (harness/certificate/run.py),
written as a new folder `reports/certificate-<model>-<key>[-N]/certificate.json` (never replacing
one), its verdict printed; exit 0 PASS, 1 FAIL, 2 ERROR. With `--calibrate`: the runtime measured
under each of its settings (CTranslate2: every CPU ISA this processor has; llama.cpp: threads and
batch sizes; or those named), the derived bound printed; `--write`
records it (harness/certificate/record.py) for review and commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.certificate.record import CertificateError
from harness.certificate.run import ISAS, LLAMA_SETTINGS, calibrate, certify
from harness.errors import HarnessError, ProfileError
from harness.oracle.torch_key import cpu_flags
from harness.paths import reports_dir
from harness.profile.load import find_profile


def cpu_isas() -> list[str]:
    """The CTranslate2 ISAs this CPU runs (from /proc/cpuinfo's flags; GENERIC elsewhere)."""
    flags = cpu_flags()
    has = {"GENERIC": True, "AVX": "avx" in flags, "AVX2": "avx2" in flags, "AVX512": "avx512f" in flags}
    return [isa for isa in ISAS if has[isa]]


def run(args: argparse.Namespace) -> int:
    from harness.session import ParitySession

    try:
        profile = find_profile(args.model)
        if profile.certificate is None:
            raise ProfileError(f"{profile.source_file}: certificate: the profile names no conversion certificate")
        session = ParitySession(selected_scenarios={profile.name: set(profile.certificate.scenarios)})
        if args.calibrate:
            settings = args.setting or (
                cpu_isas() if profile.certificate.runtime == "ctranslate2" else list(LLAMA_SETTINGS)
            )
            record = calibrate(
                session,
                profile,
                args.write,
                settings,
                " ".join(["python -m harness certify", *args.argv]),
            )
            print(json.dumps(record.bound, indent=1))
            print("written: " + str(args.write).lower() + " (review and commit the record)" * bool(args.write))
            return 0
        doc = certify(session, profile)
    except (HarnessError, CertificateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from harness.signoff.writer import write_signoff_dir

    data = (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    directory = write_signoff_dir(
        Path(args.out) if args.out else reports_dir(),
        f"certificate-{profile.name}-{doc['device_key']}",
        {"certificate.json": data},
    )
    print(f"conversion certificate {profile.name} ({doc['runtime']}): {doc['verdict']}")
    for problem in doc["problems"]:
        print(f"  {problem}")
    print(f"written: {directory}/certificate.json")
    return {"PASS": 0, "FAIL": 1}.get(doc["verdict"], 2)
