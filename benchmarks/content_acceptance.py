"""Does what is generated change speculation's payoff? Accept length and crossover per content, on vLLM CPU.

Runs two closed-loop experiments made by the real-engine tier's config (tests/real_engine/test_vllm_workloads.py:
the tiny local Llama, baseline vs ngram K=3, chat requests, C = 1, 4, 3 repeats): the seeded synthetic words, and
a chat-jsonl dataset of templated, self-repeating text (the tier runs that dataset open-loop only). `--runs N`
repeats both from scratch (fresh servers, same seeds) and prints, per content and level, the ngram arm's accept
length (vLLM's counters) and the speedup, and each run's crossover, so the spread between runs is visible.

    .venv/bin/python benchmarks/content_acceptance.py [--runs 2] [--out /tmp/content] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.real_engine.test_vllm_workloads import LEVELS, config_for, run, templated_dataset  # noqa: E402


def accept(variant_dir: Path, c: int) -> float:
    s = json.loads((variant_dir / "ngram" / f"c{c}" / "summary.json").read_text())
    return float(s["metrics"]["accept_length"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--smoke", action="store_true", help="build and validate both configs and the dataset; no run")
    args = ap.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="content-"))
    data = templated_dataset(root / "templated.jsonl")
    if args.smoke:  # the real engine takes minutes: check that what a run is given is still accepted
        from specsweep.config import validate

        for name in ("words", "templated"):
            cfg = validate(config_for(name, data if name == "templated" else None))
            print(f"smoke: {name} config valid ({cfg['experiment']}, levels {cfg['concurrency']})")
        return 0
    figures: dict[str, list[dict]] = {"words": [], "templated": []}
    for r in range(args.runs):
        for name in figures:
            t0 = time.monotonic()
            workdir = root / f"run{r}" / name
            config = config_for(name, data if name == "templated" else None)
            variant_dir = run(workdir, config)
            result = json.loads((variant_dir / "crossover.json").read_text())["arms"]["ngram"]
            figures[name].append(
                {
                    "accept": {c: accept(variant_dir, c) for c in LEVELS},
                    "speedup": {int(row["concurrency"]): row["speedup"] for row in result["per_level"]},
                    "crossover": result["crossover"],
                    "verdict": result["verdict"]["kind"],
                    "wall_s": time.monotonic() - t0,
                }
            )
    print(f"vLLM CPU (real engine), ngram K=3 vs baseline, chat requests, {args.runs} run(s); median [min, max]")
    print(f"{'content':>10} | {'C':>3} | {'accept length':>22} | {'speedup (tok/s)':>22}")
    for name, runs in figures.items():
        for c in LEVELS:
            acc = [f["accept"][c] for f in runs]
            sp = [f["speedup"][c] for f in runs]
            print(f"{name:>10} | {c:>3} | {spread(acc):>22} | {spread(sp):>22}")
    for name, runs in figures.items():
        for i, f in enumerate(runs):
            x = f["crossover"] or {}
            print(
                f"{name:>10} run {i}: crossover C={x.get('estimate')} [{x.get('lo')}, {x.get('hi')}] "
                f"({f['verdict']}), {f['wall_s']:.0f} s"
            )
    print(f"runs kept under {root}")
    return 0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"


if __name__ == "__main__":
    sys.exit(main())
