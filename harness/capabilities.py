"""What a profile's checks ask of its implementation, against what the implementation serves
(issue 46 part 1).

Every implementation declares the run kinds it serves (harness/implementations.py RUN_KINDS: an
in-tree row's `serves`, a plug-in's `serves:` in its profile, in its factory's `info` or in its
hello) and may declare the record arrays it writes (`fields`). A check needs the runs its registry
row judges (harness/checks/registry.py `run` and `needs`), and on a scenario that stops at EOS or
runs a batch, a stopped or batched run. A check needing what the implementation does not serve is
refused before anything runs: when the profile loads where the capabilities are known then, else
at the plug-in's hello, each naming the check, what it needs and the implementation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.checks import registry
from harness.checks.context import COMPILED, FREE, STREAM, TEACHER_FORCED
from harness.errors import ProfileError

# A row's needs that are runs of the implementation, as run kinds.
_RUN_OF_NEED = {FREE: "free", TEACHER_FORCED: "teacher_forced", COMPILED: "compiled", STREAM: "streamed"}


def run_kinds(check: str, scenario: Any) -> list[str]:
    """The run kinds `check` needs of the implementation on `scenario`, in a stable order."""
    row = registry.get(check)
    kinds = [_RUN_OF_NEED[n] for n in row.needed if n in _RUN_OF_NEED] + list(row.also_runs)
    if kinds and row.run != "vad":  # every run of a stop or batch scenario is a stopped or batched run
        kinds += ["stopped"] * (getattr(scenario, "stop", None) is not None)
        kinds += ["batched"] * (getattr(scenario, "batch", None) is not None)
    return list(dict.fromkeys(kinds))


def needs(profile: Any) -> tuple[tuple[str, str, str], ...]:
    """(where, check, run kind or `field <array>`) for every check of every scenario."""
    found = []
    for i, s in enumerate(profile.scenarios):
        where = f"scenarios[{i}] ({s.id})"
        for check in profile.checks(s):
            found += [(where, check, kind) for kind in run_kinds(check, s)]
            array = registry.get(check).array
            if array is not None:
                found.append((where, check, f"field {array}"))
    return tuple(found)


def unserved(
    needed: Iterable[tuple[str, str, str]], serves: Iterable[str], fields: Iterable[str] | None
) -> tuple[str, str, str] | None:
    """The first need that `serves` (and `fields`, where declared) does not meet."""
    served, written = set(serves), None if fields is None else set(fields)
    for where, check, kind in needed:
        name = kind.removeprefix("field ")
        if (kind == name and name not in served) or (kind != name and written is not None and name not in written):
            return where, check, kind
    return None


def refusal(need: tuple[str, str, str], label: str, serves: Iterable[str], declared_in: str) -> str:
    """What a refusal says: the check, what it needs, the implementation and what it serves."""
    where, check, kind = need
    if kind.startswith("field "):
        what = f"the record array {kind.removeprefix('field ')!r}, which {label} does not write"
    else:
        what = f"a {kind} run, which {label} does not serve (it serves {sorted(serves)}, {declared_in})"
    return f"{where}: check {check} needs {what}; leave {check} out of the scenario's checks (docs/external.md)"


def check_profile(profile: Any) -> None:
    """The loader's refusal, where the implementation's capabilities are known before it starts:
    an in-tree row's, or a plug-in's declared in its profile (`serves:`, `fields:`)."""
    plugin = profile.under_test.plugin
    if plugin is not None and plugin.serves is None and plugin.fields is None:
        return  # declared, if at all, in its hello: judged there (harness/runners/process.py)
    d = profile.under_test
    declared_in = "harness/implementations.py" if plugin is None else "its profile's implementation.serves"
    need = unserved(needs(profile), d.serves, d.fields)
    if need is not None:
        raise ProfileError(refusal(need, d.name, d.serves, declared_in))


def from_hello(hello: dict[str, Any], plugin: Any) -> tuple[list[str], list[str] | None]:
    """A plug-in's capabilities: its hello's, else its profile's, else what every plug-in served
    before it could say (free and teacher-forced runs, compiled where its decodes name it)."""
    from harness.implementations import UNDECLARED_SERVES

    serves = hello.get("serves", plugin.serves)
    if serves is None:
        serves = [*UNDECLARED_SERVES, *(["compiled"] if "compiled" in hello.get("decodes", []) else [])]
    return list(serves), hello.get("fields", plugin.fields)
