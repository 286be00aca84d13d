"""Does the answer repeat? Run an experiment several times in fresh folders (or read finished ones) and print
each run's crossover table, its valid cells, prefix-cache hit rates and client figures, then the verdicts side
by side.

    python benchmarks/repeatability.py --runs 5                                   # the embedded default
    python benchmarks/repeatability.py --config config/examples/vllm-cpu-tiny.yaml --runs 3
    python benchmarks/repeatability.py --results /tmp/pytest-of-root/pytest-*/real_vllm0/results/vllm-cpu-tiny

A run is fresh: its own temporary folder, its own servers, its own MLflow store; only built stack environments
are shared (`--envs-dir`, default <repo>/results/_envs), since building them measures nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.analysis.table import format_table  # noqa: E402  (run from a checkout, package not installed)
from specsweep.config import defaults  # noqa: E402
from specsweep.measure.summary import read_judged  # noqa: E402


def run_once(config: Path, envs_dir: Path, keep: bool) -> tuple[Path, float]:
    """One fresh `snakemake --cores 1 crossover`; returns (results/<experiment> folder, wall seconds)."""
    cfg = yaml.safe_load(config.read_text())
    cfg["envs_dir"] = str(envs_dir)
    for v in cfg["variants"].values():  # recipes are relative to the repository
        if v.get("recipe") and not Path(v["recipe"]).is_absolute():
            v["recipe"] = str(REPO / v["recipe"])
    work = Path(tempfile.mkdtemp(prefix="specsweep-repeat-"))
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1", "crossover"]
    t0 = time.monotonic()
    proc = subprocess.run([*cmd, "--configfile", "config.yaml"], cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed in {work}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res = work / "results" / cfg["experiment"]
    if not keep:
        kept = Path(tempfile.mkdtemp(prefix="specsweep-repeat-results-"))
        shutil.copytree(res, kept / res.name, ignore=shutil.ignore_patterns(".servers", "models", "logs"))
        shutil.rmtree(work, ignore_errors=True)
        res = kept / res.name
    return res, wall


def gates_of(res: Path) -> dict[str, Any]:
    """The gates the experiment's analysis judged with: its config's (beside `results/`, where snakemake ran)
    over the defaults; the defaults where no config is there (a results folder copied elsewhere)."""
    config = res.parents[1] / "config.yaml"
    given = (yaml.safe_load(config.read_text()) or {}).get("gates") if config.is_file() else None
    return {**defaults("gates"), **(given or {})}


def cell_lines(res: Path) -> list[str]:
    """Per cell: validity, prefix-cache hit rate, the client's worst CPU shares and the other processes'."""
    out = []
    gates = gates_of(res)
    for p in sorted(res.glob("*/*/c*/summary.json"), key=lambda p: (p.parts[-3], int(p.parent.name[1:]))):
        s = read_judged(p.parent, gates)[0]
        m = s["metrics"]
        c, cache = m.get("client") or {}, m.get("prefix_cache") or {}
        hit = cache.get("hit_rate")

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.1f}%"

        lag = c.get("loop_lag_excess_p99_ms")

        out.append(
            f"    {p.parts[-4]}/{p.parts[-3]}/{p.parent.name:<5} valid={'yes' if s['validity']['valid'] else 'NO '} "
            f"cache-hit={pct(hit):>6} client cpu={pct(c.get('busy_share')):>6} wait={pct(c.get('wait_share')):>6} "
            f"others={pct(c.get('foreign_cpu_share')):>6} lag-excess p99="
            + ("-" if lag is None else f"{lag:.2f} ms")
            + ("" if s["validity"]["valid"] else f"  ({'; '.join(s['validity']['reasons'])[:160]})")
        )
    return out


def describe(res: Path) -> list[dict[str, Any]]:
    """The verdict of every variant and speculative arm of one finished experiment folder."""
    rows = []
    for path in sorted(res.glob("*/crossover.json")):
        out = json.loads(path.read_text())
        print(format_table(out))
        for arm, ar in out["arms"].items():
            x = ar.get("crossover") or {}
            rows.append(
                {
                    "variant": out["variant"],
                    "arm": arm,
                    "verdict": (ar.get("verdict") or {}).get("kind"),
                    "estimate": x.get("estimate"),
                    "lo": x.get("lo"),
                    "hi": x.get("hi"),
                    "threshold": (out.get("policy") or {}).get(arm, {}).get("threshold"),
                }
            )
        for family, proof in (out.get("policy_proof") or {}).items():
            ratios = ", ".join(
                f"{r['concurrency']:g}: {_f(r['ratio'])} [{_f(r['ratio_lo'])}, {_f(r['ratio_hi'])}]"
                for r in proof.get("per_level") or []
            )
            rows.append(
                {
                    "variant": out["variant"],
                    "arm": proof.get("policy_arm", f"{family}-policy"),
                    "verdict": "policy " + ("holds" if proof.get("holds") else str(proof.get("verdict"))[:60]),
                    "schedule": proof.get("schedule"),
                    "regret": ratios,
                    "output_match_min": proof.get("output_match_min"),
                }
            )
    summaries = list(res.glob("*/*/c*/summary.json"))
    valid = sum(read_judged(p.parent, gates_of(res))[0]["validity"]["valid"] for p in summaries)
    print(f"  valid cells: {valid}/{len(summaries)}")
    print("\n".join(cell_lines(res)))
    for r in rows:
        r["valid"] = f"{valid}/{len(summaries)}"
    return rows


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--envs-dir", type=Path, default=REPO / "results" / "_envs")
    parser.add_argument("--keep", action="store_true", help="keep each run's whole folder")
    parser.add_argument("--results", type=Path, nargs="+", help="finished results/<experiment> folders instead")
    parser.add_argument("--smoke", action="store_true", help="with --results: the test suite's check that it runs")
    args = parser.parse_args(argv)
    if args.smoke and not args.results:
        parser.error("--smoke reads finished runs: give --results DIR (the test suite passes its tiny run)")
    folders: list[tuple[Path, float | None]] = [(p, None) for p in args.results or []]
    if not folders:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs} ...", flush=True)
            folders.append(run_once(args.config, args.envs_dir.absolute(), args.keep))
    table = []
    for i, (res, wall) in enumerate(folders, 1):
        print(f"\n=== run {i}: {res}" + (f" (wall {wall:.0f} s)" if wall else ""))
        table += [{"run": i, "wall_s": wall, **r} for r in describe(res)]
    print("\nrun | variant/arm | valid | verdict | crossover [interval] | threshold | wall")
    for r in table:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s"
        if "schedule" in r:
            same = r["output_match_min"]
            print(
                f"{r['run']:>3} | {r['variant']}/{r['arm']} | {r['valid']} | {r['verdict']} | schedule "
                f"{r['schedule']} | policy/best {r['regret']} | same output >= "
                + ("-" if same is None else f"{100 * same:.1f}%")
            )
            continue
        print(
            f"{r['run']:>3} | {r['variant']}/{r['arm']} | {r['valid']} | {r['verdict']} | "
            f"{_f(r['estimate'])} [{_f(r['lo'])}, {_f(r['hi'])}] | {_f(r['threshold'])} | {wall}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
