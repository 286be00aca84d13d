"""`specsweep preflight`: check GPUs, driver, disk, models, ports and package indexes (`specsweep.stack.preflight`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specsweep.config import ConfigError
from specsweep.stack.preflight import config_specs, preflight, verdict_line, write_findings


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configfile", type=Path, help="the experiment's config (all variants are checked)")
    p.add_argument("--spec", help="one variant's preflight spec as JSON (what the workflow's rule passes)")
    p.add_argument("--variant", action="append", help="check only this variant (repeatable)")
    p.add_argument("--root", type=Path, default=Path("."), help="folder recipe paths are relative to")
    p.add_argument("--out", type=Path, help="also write the findings here as JSON")


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.spec:
        pres = [json.loads(args.spec)]
    elif args.configfile:
        try:
            pres = config_specs(args.configfile, args.variant)
        except (ConfigError, LookupError) as e:
            print(f"specsweep preflight: {e}", file=sys.stderr)
            return 2
    else:
        print("specsweep preflight: give --configfile (or --spec)", file=sys.stderr)
        return 2
    found = preflight(pres, args.root)
    for f in found:
        print(f.line())
    print(verdict_line(found, time.monotonic() - t0))
    if args.out:
        write_findings(args.out, pres, found)
    return 1 if any(f.level == "error" for f in found) else 0
