"""`specsweep server-host` (internal): a SLURM job's server host (`specsweep.serving.serverhost`).

Started by `serverhost.start_host` from the job's batch step; nobody runs it by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specsweep.serving.serverhost import serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inbox", required=True, type=Path)
    parser.add_argument("--owner-pid", required=True, type=int)
    parser.add_argument("--owner-started", required=True, type=float)


def run(args: argparse.Namespace) -> int:
    return serve(args.inbox, args.owner_pid, args.owner_started)
