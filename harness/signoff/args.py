"""The `signoff` subcommand's options, apart from cli.py so building the parser imports no plotting."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[], help="profile name (repeatable); default: all")
    parser.add_argument("--out", help="parent folder of the sign-off directory (default: reports/)")
    parser.add_argument("--previous", help="report.json (or sign-off folder) to diff against (default: newest)")
    parser.add_argument("--waivers", help="waivers YAML (default: waivers.yaml at the repo root)")
    parser.add_argument("--from-report", help="sign off this existing parity JSON report instead of running")
    parser.add_argument("-n", "--workers", help="pytest-xdist workers for the parity run (e.g. auto)")
