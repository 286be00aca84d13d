"""The `specsweep` console command: one subcommand per module, each also runnable standalone."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve-sim": ("specsweep.sim.server", "run the simulated engine server (OpenAI + SGLang APIs)"),
    "predict": ("specsweep.sim.predict_cli", "predict a sweep and its crossover in virtual time"),
    "plan": ("specsweep.sim.plan", "plan a config's sweep in virtual time: levels, GPU time, interval width"),
    "calibrate": ("specsweep.sim.calibrate", "fit a simulated-engine profile to measured cells"),
    "bench": ("specsweep.client.bench", "measure a running server at several concurrency levels"),
    "preflight": (
        "specsweep.preflight",
        "check GPUs, driver, disk, models, ports and package indexes before anything is built",
    ),
    "fingerprint": ("specsweep.fingerprint", "write a stack fingerprint JSON"),
    "build-model": ("specsweep.modelbuild", "build a model locally in a variant's environment"),
    "cell": ("specsweep.cell", "measure one cell (variant x arm x concurrency)"),
    "paired-level": ("specsweep.interleave", "measure one level of every fixed arm in interleaved blocks"),
    "merge-segments": ("specsweep.segments", "merge each fixed arm's instance cells at a level into its cell"),
    "servers": ("specsweep.servers", "list or stop the servers of an experiment"),
    "crossover": ("specsweep.analysis.cli", "compute a variant's crossover, plots and policy"),
    "refine": ("specsweep.analysis.adaptive", "choose the levels an adaptive round adds inside the crossover interval"),
    "schedule": (
        "specsweep.analysis.schedule",
        "derive each speculative arm's schedule (K per load)",
    ),
    "compare": ("specsweep.analysis.compare", "compare variants arm by arm"),
    "track": ("specsweep.tracking", "log cells and crossovers to MLflow"),
    "config-doc": ("specsweep.configdoc", "print (or --write) config/README.md from the config schema"),
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


if __name__ == "__main__":
    sys.exit(main())
