"""The one command line of the harness: `python -m harness <verb> [options]`.

Every verb registers its arguments on one parser (harness/cli/verbs.py, shared options in
harness/cli/options.py) and runs as a function of the parsed arguments; no other module
parses arguments (tests/test_layout.py). The environment is checked before any verb starts
(harness/settings.py). A verb's own argument check that fails raises `UsageError`, which is
reported as argparse reports a bad option: the verb's usage and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from harness.errors import HarnessError, UsageError

__all__ = ["UsageError", "build_parser", "main"]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from harness.cli.verbs import VERBS

    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="The parity harness: every face of it (the Makefile's targets call these).",
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs = {}
    for verb in VERBS:
        kwargs = {} if verb.hidden else {"help": verb.help}
        verbs[verb.name] = sub.add_parser(verb.name, description=verb.help or None, **kwargs)
        verb.arguments(verbs[verb.name])
    return parser, verbs


def main(argv: list[str] | None = None) -> int:
    from harness.cli.verbs import BY_NAME
    from harness.device import select_device
    from harness.settings import check_all

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        check_all()  # a bad environment setting stops every verb before it starts
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    parser, subparsers = build_parser()
    args, extra = parser.parse_known_args(argv)
    verb = BY_NAME[args.verb]
    if extra and not verb.extra:
        subparsers[verb.name].error(f"unrecognized arguments: {' '.join(extra)}")
    if extra[:1] == ["--"]:
        extra = extra[1:]
    args.extra = extra
    args.argv = argv[1:]  # the verb's own command line, for results that record how they were made
    module, function = verb.target.split(":")
    try:
        select_device()  # MLX_PARITY_DEVICE's device is MLX's default before any model module is imported
        return int(getattr(importlib.import_module(module), function)(args))
    except UsageError as e:
        subparsers[verb.name].error(str(e))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: said in a line, no traceback; what was half built is swept
        print(f"interrupted: python -m harness {args.verb} stopped", file=sys.stderr)
        return 130
