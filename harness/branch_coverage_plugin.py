"""A pytest plugin whose import starts recording models/' branch coverage (MLX_PARITY_COVERAGE):
`python -m harness parity` names it first on pytest's command line, so the controller and every
xdist worker (which replay that command line) record before any model module is imported
(harness/branch_coverage.py)."""

from harness import branch_coverage

branch_coverage.start("parity")
