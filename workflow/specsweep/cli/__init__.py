"""The `specsweep` console command: every subcommand, each in a module of this package (`SUBCOMMANDS`)."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help). Each module is specsweep.cli.<name> and defines add_arguments(parser) and
# run(args) -> int; the library it calls holds no command-line code (tests/unit/test_cli_layout.py).
# This package imports only the standard library, and a subcommand's module only when it runs: `tiny-model` runs
# with a variant's interpreter, which has torch but not the project's own packages.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve-sim": ("specsweep.cli.serve_sim", "run the simulated engine server (OpenAI + SGLang APIs)"),
    "predict": ("specsweep.cli.predict", "predict a sweep and its crossover in virtual time"),
    "plan": ("specsweep.cli.plan", "plan a config's sweep in virtual time: levels, GPU time, interval width"),
    "calibrate": ("specsweep.cli.calibrate", "fit a simulated-engine profile to measured cells"),
    "derive-stacks": (
        "specsweep.cli.derive_stacks",
        "rebuild the packaged Kimi profiles' fits from the seed table (provenance of their numbers)",
    ),
    "bench": ("specsweep.cli.bench", "measure a running server at several concurrency levels"),
    "preflight": (
        "specsweep.cli.preflight",
        "check GPUs, driver, disk, models, ports and package indexes before anything is built",
    ),
    "build-env": ("specsweep.cli.build_env", "build (or reuse) a recipe's environment and print its interpreter"),
    "fingerprint": ("specsweep.cli.fingerprint", "write a stack fingerprint JSON"),
    "build-model": ("specsweep.cli.build_model", "build a model locally in a variant's environment"),
    "tiny-model": (
        "specsweep.cli.tiny_model",
        "(internal: build-model runs it with the variant's interpreter) write a tiny random Llama model",
    ),
    "cell": ("specsweep.cli.cell", "measure one cell (variant x arm x concurrency)"),
    "paired-level": ("specsweep.cli.paired_level", "measure one level of every fixed arm in interleaved blocks"),
    "merge-segments": (
        "specsweep.cli.merge_segments",
        "merge each fixed arm's instance cells at a level into its cell",
    ),
    "segment-need": (
        "specsweep.cli.segment_need",
        "(the DAG's checkpoint) decide whether a sequential level measures another instance pair",
    ),
    "servers": ("specsweep.cli.servers", "list or stop the servers of an experiment"),
    "server-host": ("specsweep.cli.server_host", "(internal) a SLURM job's server host, started from its batch step"),
    "crossover": ("specsweep.cli.crossover", "compute a variant's crossover, plots and policy"),
    "refine": ("specsweep.cli.refine", "choose the levels an adaptive round adds inside the crossover interval"),
    "schedule": (
        "specsweep.cli.schedule",
        "derive each speculative arm's schedule (K per load)",
    ),
    "contents": ("specsweep.cli.contents", "a variant's answer per content class and for its traffic mix"),
    "compare": ("specsweep.cli.compare", "compare variants arm by arm"),
    "track": ("specsweep.cli.track", "log cells and crossovers to MLflow"),
    "config-doc": ("specsweep.cli.config_doc", "print (or --write) config/README.md from the config schema"),
    "records-doc": ("specsweep.cli.records_doc", "print (or --write) docs/records.md from the files' typed records"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsweep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        # Arguments are added lazily in main() so that one broken module never hides the others' help.
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        sub = argparse.ArgumentParser(prog=f"specsweep {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        return int(module.run(args) or 0)
    parser.parse_args(argv)
    return 2
