"""`specsweep servers`: list or stop the servers of an experiment; `supervise` (internal) runs and watches one."""

from __future__ import annotations

import argparse
from pathlib import Path

from specsweep.serving.servers import listing, stop_all, supervise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="list running servers of an experiment")
    ls.add_argument("--state-dir", required=True, type=Path)
    st = sub.add_parser("stop", help="stop every server of an experiment on this node")
    st.add_argument("--state-dir", required=True, type=Path)
    sv = sub.add_parser("supervise", help="(internal) run and watch one server")
    sv.add_argument("--spec-file", required=True, type=Path)
    sv.add_argument("--record", required=True, type=Path)
    sv.add_argument("--owner-pid", required=True, type=int)
    sv.add_argument("--owner-started", required=True, type=float)


def run(args: argparse.Namespace) -> int:
    if args.action == "supervise":
        return supervise(args.spec_file, args.record, args.owner_pid, args.owner_started)
    if args.action == "stop":
        n = stop_all(args.state_dir, reason="asked by user")
        print(f"stopped {n} server(s)")
        return 0
    for line in listing(args.state_dir):
        print(line)
    return 0
