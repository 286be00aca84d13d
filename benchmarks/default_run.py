"""Time the README's main job (`snakemake --cores 1 crossover`, embedded default) and where the time goes.

Runs in a fresh temporary folder (a copy of nothing but the config), so it measures a first run. Prints the wall
time, the share spent measuring (cells' closed loops) and the rest: server start-up, warm-up and flushes, the
environment fingerprint, analysis, MLflow tracking and Snakemake itself. Figures come from Snakemake's
`benchmark:` files and the cells' summary.json.

    python benchmarks/default_run.py [--config config/config.yaml]
    python benchmarks/default_run.py --results DIR    # a finished run (DIR holds config.yaml and results/)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.config import defaults  # noqa: E402  (run from a checkout, package not installed)
from specsweep.summary import read_judged  # noqa: E402


def report(work: Path, exp: str, wall: float | None, stdout: str) -> int:
    """Where a finished run's time went, from its `benchmark:` files and cells; `wall` None: not timed here (the
    split of the parts is still measured; Snakemake's own share cannot be known)."""
    res = work / "results" / exp
    bench = {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0]) for p in (res / "benchmarks").glob("*.tsv")}
    summaries = [read_judged(p.parent, defaults("gates"))[0] for p in res.glob("*/*/c*/summary.json")]
    if not summaries:
        print(f"no cells under {res}: not a finished run of experiment {exp!r}", file=sys.stderr)
        return 1
    measuring = sum(s["measured_s"] for s in summaries)
    cells = sum(v for k, v in bench.items() if k.startswith("cell."))
    startup = sum(s["server"]["ready_after_s"] for s in summaries)
    tracking = sum(v for k, v in bench.items() if k.startswith("track_"))
    analysis = sum(v for k, v in bench.items() if k.startswith("crossover."))
    env = sum(v for k, v in bench.items() if k.startswith(("env.", "model.")))
    rows = [
        ("measuring (closed loops)", measuring),
        ("server start-up / reuse checks", startup),
        ("warm-up, flush, prompts, cell process", cells - measuring - startup),
        ("environment fingerprint / model build", env),
        ("crossover analysis + plots", analysis),
        ("MLflow tracking", tracking),
    ]
    total = wall if wall is not None else cells + env + analysis + tracking
    if wall is not None:
        rows.append(("Snakemake itself (parse, scheduling)", wall - cells - tracking - analysis - env))
        print(f"default run: {len(summaries)} cells, wall {wall:.1f} s ({work})")
    else:
        print(f"finished run: {len(summaries)} cells, wall not timed here; jobs' own time {total:.1f} s ({work})")
    for name, secs in rows:
        print(f"  {name:<42} {secs:7.1f} s  {100 * secs / total:5.1f} %")
    print(f"  outside measuring: {total - measuring:.1f} s ({100 * (total - measuring) / total:.1f} %)")
    valid = sum(bool(s["validity"]["valid"]) for s in summaries)
    print(f"  valid cells: {valid}/{len(summaries)}")
    if stdout:
        print(stdout[stdout.find("=" * 20) :])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--results", type=Path, help="a finished run's folder (holding results/): report, not run")
    parser.add_argument("--smoke", action="store_true", help="with --results: the test suite's check that it runs")
    args = parser.parse_args(argv)
    if args.smoke and not args.results:
        parser.error("--smoke reports a finished run: give --results DIR (the test suite passes its tiny run)")
    exp = yaml.safe_load(args.config.read_text())["experiment"]
    if args.results:
        exp = yaml.safe_load((args.results / "config.yaml").read_text())["experiment"]
        return report(args.results, exp, None, "")
    work = Path(tempfile.mkdtemp(prefix="specsweep-default-run-"))
    shutil.copy(args.config, work / "config.yaml")
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--cores",
        "1",
        "crossover",
        "--configfile",
        "config.yaml",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return 1
    rc = report(work, exp, wall, proc.stdout)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
