"""`specsweep records-doc`: print (or --write) docs/records.md from the files' typed records."""

from __future__ import annotations

import argparse
import sys

from specsweep.records.doc import DOC_PATH, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", action="store_true", help=f"write {DOC_PATH} instead of printing it")


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.write:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0
