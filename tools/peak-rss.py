#!/usr/bin/env python3
"""Run a command and report the peak memory of its whole process tree (Linux, /proc).

    python3 tools/peak-rss.py [--interval 0.2] -- make signoff SIGNOFF_MODELS="a b"

Two figures, printed to stderr after the command ends, and its exit code passed through:
- tree peak: the largest sum of VmRSS over the command and all its descendants, sampled
  every --interval seconds (what a runner's memory limit sees; shared pages counted once per
  process, so it is an upper bound);
- largest process: the largest VmHWM (the kernel's own high-water mark, exact between
  samples) of any single process in the tree, with its command line.
`ru_maxrss` of RUSAGE_CHILDREN is not enough: it is one process's peak, never a sum of
processes alive at once (the sign-off's parent and its parity child).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    except OSError:
        pass
    return out


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = _status(int(name)).get("PPid")
            if ppid:
                children.setdefault(int(ppid), []).append(int(name))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def _kib(value: str | None) -> int:
    return int(value.split()[0]) if value else 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if not os.path.isdir("/proc/self"):
        parser.error("needs Linux /proc")
    proc = subprocess.Popen(command)
    tree_peak, largest, largest_cmd = 0, 0, ""
    while proc.poll() is None:
        total = 0
        for pid in _tree(proc.pid):
            status = _status(pid)
            total += _kib(status.get("VmRSS"))
            hwm = _kib(status.get("VmHWM"))
            if hwm > largest:
                largest, largest_cmd = hwm, _cmdline(pid)
        tree_peak = max(tree_peak, total)
        time.sleep(args.interval)
    print(f"tree peak: {tree_peak / 1024:.0f} MB (sampled every {args.interval} s)", file=sys.stderr)
    print(f"largest process: {largest / 1024:.0f} MB ({largest_cmd})", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
