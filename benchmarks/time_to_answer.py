"""Time to answer: GPU time and crossover interval width, the fixed 8-level grid against adaptive levels.

Virtual time (`specsweep plan`'s machinery, several engine seeds): the demo profile on the default config and
the calibrated Kimi profiles on the Kimi example config, with `--server-start-s` per server start. Real time
(`--real-runs N`): the demo profile through the whole pipeline, each mode run N times (engine seeds 0..N-1),
GPU time read from the cells (`level_s` + waiting for the server, every arm; analysis and MLflow excluded).

Modes: `fixed` (the config's grid, adaptive off), `adaptive` (the config's grid, then refinement rounds: the
default config's setting), `coarse` (a coarser, shorter grid: 1, 3, 10, 30, 100, 250 at 3 turnovers per slot
where the config has more, then the same refinement).
Width: hi - lo of the crossover interval (absolute, in C) and hi/lo; open intervals have no width.

    python benchmarks/time_to_answer.py --seeds 5 --real-runs 2   (--smoke: seconds, the test suite's check)
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.analysis.adaptive import AdaptiveSettings, measuring_seconds  # noqa: E402  (run from a checkout)
from specsweep.config import load, validate  # noqa: E402
from specsweep.sim.profile import load_profile  # noqa: E402
from specsweep.virtual.plan import plan_sweep  # noqa: E402

COARSE = [1, 3, 10, 30, 100, 250]
KIMI_PROFILES = ["kimi-k25-cu128", "kimi-k25-cu130", "kimi-k25-cu130-fusion"]


def modes(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three sweeps of a config: fixed grid, adaptive on the grid, adaptive on the coarse grid."""
    adaptive = {**config["adaptive"], "enabled": True}
    if not config["adaptive"]["enabled"]:  # a config without its own refinement: the default config's
        adaptive.update(added_per_concurrency=3 * config["workload"]["requests"]["per_concurrency"], max_rounds=2)
    fixed = copy.deepcopy(config)
    fixed["adaptive"]["enabled"] = False
    on_grid = {**copy.deepcopy(config), "adaptive": adaptive}
    coarse = {**copy.deepcopy(on_grid), "concurrency": COARSE}
    per_c = config["workload"]["requests"]["per_concurrency"]
    coarse["adaptive"]["grid_per_concurrency"] = min(3, per_c)  # far from the crossover a rough figure is enough
    return {"fixed": fixed, "adaptive": on_grid, "coarse": coarse}


def width(x: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """(hi - lo, hi / lo) of a crossover interval; (None, None) when it is open or absent."""
    st = (x or {}).get("states") or {}
    if st.get("lo") == st.get("hi") == "within":
        return float(x["hi"] - x["lo"]), float(x["hi"] / x["lo"])
    return None, None


def row(name: str, widths: list[float | None], ratios: list[float | None], minutes: list[float], ref: dict) -> str:
    closed = [w for w in widths if w is not None]
    rs = [r for r in ratios if r is not None]
    w_txt = f"{np.median(closed):6.1f} [{min(closed):.1f}-{max(closed):.1f}]" if closed else "  open        "
    r_txt = f"{np.median(rs):5.2f}x" if rs else "  -   "
    t = float(np.median(minutes))
    rel_w = f"{np.median(closed) / ref['width']:.2f}" if closed and ref.get("width") else "-"
    rel_t = f"{t / ref['minutes']:.2f}" if ref.get("minutes") else "-"
    return (
        f"  {name:<9} width {w_txt} {r_txt} ({len(closed)}/{len(widths)} closed)  GPU {t:7.1f} min "
        f"[{min(minutes):.1f}-{max(minutes):.1f}]  vs fixed: width {rel_w}, time {rel_t}"
    )


def virtual(config: dict[str, Any], profile_name: str, variant: str, seeds: int, start_s: float) -> None:
    profile = load_profile(profile_name)
    print(
        f"\n{profile_name} ({'ILLUSTRATIVE' if profile.illustrative else 'calibrated'}), virtual time, "
        f"{seeds} seeds, {start_s:g} s per server start"
    )
    ref: dict[str, float] = {}
    for name, cfg in modes(config).items():
        settings = AdaptiveSettings.from_config(cfg) if cfg["adaptive"]["enabled"] else None
        plans = [plan_sweep(profile, cfg, variant, settings, seed, start_s) for seed in range(seeds)]
        ws = [width(p.crossover.get("eagle3")) for p in plans]
        minutes = [p.total_s / 60 for p in plans]
        verdict = sorted({p.crossover.get("eagle3", {}).get("states", {}).get("estimate", "none") for p in plans})
        if name == "fixed":
            closed = [w for w, _ in ws if w is not None]
            ref = {"width": float(np.median(closed)) if closed else 0.0, "minutes": float(np.median(minutes))}
        print(row(name, [w for w, _ in ws], [r for _, r in ws], minutes, ref) + f"  estimate: {','.join(verdict)}")
        print(f"            levels (seed 0): {', '.join(map(str, plans[0].levels))}")


def real(config: dict[str, Any], runs: int, only: list[str] | None = None) -> None:
    print(f"\ndemo, real time through the pipeline (sim engine on this machine), {runs} run(s) per mode")
    ref: dict[str, float] = {}
    for name, cfg in modes(config).items():
        if only and name not in only and name != "fixed":
            continue
        widths, ratios, minutes, walls = [], [], [], []
        for seed in range(runs):
            c = copy.deepcopy(cfg)
            c["experiment"] = f"tta-{name}"
            c["mlflow"]["enabled"] = False
            c["variants"]["sim"]["sim_args"] = ["--seed", str(seed)]
            work = Path(tempfile.mkdtemp(prefix="specsweep-tta-"))
            (work / "config.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
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
            walls.append(time.monotonic() - t0)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"pipeline run failed in {work}")
            res = work / "results" / c["experiment"] / "sim"
            out = json.loads((res / "crossover.json").read_text())
            w, r = width(out["arms"]["eagle3"]["crossover"])
            widths.append(w)
            ratios.append(r)
            summaries = [json.loads(p.read_text()) for p in res.glob("*/c*/summary.json")]
            minutes.append(measuring_seconds(summaries) / 60)
            print(
                f"    {name} run {seed}: levels {out['arms']['eagle3']['levels']}, crossover "
                f"{out['arms']['eagle3']['crossover']['estimate']:.3g} [{out['arms']['eagle3']['crossover']['lo']}, "
                f"{out['arms']['eagle3']['crossover']['hi']}], GPU {minutes[-1]:.2f} min, wall {walls[-1]:.0f} s"
            )
            shutil.rmtree(work, ignore_errors=True)
        if name == "fixed":
            closed = [w for w in widths if w is not None]
            ref = {"width": float(np.median(closed)) if closed else 0.0, "minutes": float(np.median(minutes))}
        print(row(name, widths, ratios, minutes, ref) + f"  wall median {np.median(walls):.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="engine seeds per mode in virtual time")
    parser.add_argument("--real-runs", type=int, default=0, help="pipeline runs per mode on the demo profile")
    parser.add_argument("--server-start-s", type=float, default=180.0, help="per server start on the Kimi box")
    parser.add_argument("--modes", nargs="+", help="real runs of these modes only (fixed always runs: the reference)")
    parser.add_argument("--no-virtual", action="store_true", help="skip the virtual-time part")
    parser.add_argument("--smoke", action="store_true", help="one seed, one Kimi profile, virtual time only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.real_runs = 1, 0
    default = load(REPO / "config" / "config.yaml")
    kimi = validate(yaml.safe_load((REPO / "config" / "examples" / "kimi-k25-8gpu.yaml").read_text()))
    if args.smoke:  # three levels, few requests: every path runs, the figures mean nothing
        for cfg in (default, kimi):
            cfg["concurrency"] = [1, 10, 100]
            cfg["workload"]["requests"] = {**cfg["workload"]["requests"], "per_concurrency": 1, "floor": 4}
    if not args.no_virtual:
        virtual(default, "demo", "sim", args.seeds, 0.0)
        variant = next(iter(kimi["variants"]))  # the example's first stack (its names follow SGLang's builds)
        for name in KIMI_PROFILES[:1] if args.smoke else KIMI_PROFILES:
            virtual(kimi, name, variant, args.seeds, args.server_start_s)
    if args.real_runs:
        real(default, args.real_runs, args.modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
