"""Sign-off: every profile's parity run judged, with waivers, into one report directory.

Reports read results only: everything here is rendered from the parity JSON report that
`python -m harness parity` writes (harness/report.py), so a sign-off can be re-rendered
from its own report.json. Stages, each testable alone, data flowing one way:

- `model`    the parity report as read, and the sign-off's typed judgement of it
- `waivers`  waivers.yaml validated into Waiver objects
- `verdict`  statuses, waiver use, blockers: SIGNED OFF or BLOCKED
- `diff`     what changed since the previous sign-off
- `headline` one line per non-passing check (step, max ULP, first diverging module)
- `plots`    per-step PNGs of the scenarios whose logits differ (matplotlib Agg)
- `page`, `summary`, `junit`  the renderers (index.html from templates/, summary.md, junit.xml)
- `writer`   the directory: staged, renamed into place, never over an earlier one
- `cli`      `python -m harness signoff`: run parity, then all of the above

docs/signoff.md describes the outputs and the rules.
"""
