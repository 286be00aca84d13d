"""`specsweep config-doc`: print (or --write) config/README.md from the config schema."""

from __future__ import annotations

import argparse
import sys

from specsweep.configdoc import README_PATH, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", action="store_true", help=f"write {README_PATH} instead of printing it")


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.write:
        README_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {README_PATH}")
    else:
        sys.stdout.write(text)
    return 0
