"""`specsweep derive-stacks`: rebuild the packaged Kimi profiles' fits from the seed table
(`specsweep.virtual.derive_stacks`), print them and write them as JSON."""

from __future__ import annotations

import argparse
import json

from specsweep.virtual.derive_stacks import derive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write the derived values to")


def run(args: argparse.Namespace) -> int:
    out = derive()
    for name, d in out.items():
        print(name, d.get("kept", ""), json.dumps({k: float(f"{v:.4g}") for k, v in d["best"].items()}))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0
