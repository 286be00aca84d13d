"""Out-of-sample validation of `predict`'s 90% intervals: calibrate on some measured cells, predict the others.

Two sources of measured cells:
- `--measured DIR [DIR ...]`: results of the vLLM CPU example (config/examples/vllm-cpu-tiny.yaml), one directory
  per run (`results/vllm-cpu-tiny/cpu-tiny`); `python benchmarks/repeatability.py --config
  config/examples/vllm-cpu-tiny.yaml --runs N` makes them. Per run: leave one level out (calibrate on both arms
  at the other levels, predict both arms at the held-out level) and cross-arm (calibrate on one arm at every
  level, predict the other).
- `--seed`: the seed table's EAGLE-3 sweep (kimi-k25-cu130-fusion), leave one level out.

Prints one row per held-out point (measured, predicted, error, 90% interval, inside or not) and the coverage per
mode. The starting profile for the vLLM CPU engine is `CPU_BASE` (no hardware facts: no physical bounds, each cost
searched over base /30 .. x30).

    python benchmarks/sim_validation.py --measured /tmp/run1/.../cpu-tiny /tmp/run2/.../cpu-tiny
    python benchmarks/sim_validation.py --seed
    python benchmarks/sim_validation.py --smoke     # seconds: the test suite's check that it runs
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.sim.profile import Profile, load_profile, profile_from_dict  # noqa: E402
from specsweep.virtual.fit import (  # noqa: E402  (run from a checkout, package not installed)
    Target,
    load_targets,
    seed_csv_path,
    simulated_tok_s,
    workload_of,
)
from specsweep.virtual.uncertainty import identify, sweep_intervals  # noqa: E402

# A starting point for the tiny Llama on vLLM's CPU build (step ~2 ms at batch 1, ~9 ms at 64; ngram drafts
# nearly free, accepted ~95%): every value is fitted, this only sets where the search starts.
CPU_BASE = {
    "name": "vllm-cpu-tiny-base",
    "description": "starting point for calibrating the vLLM CPU example (tiny Llama, ngram K=3)",
    "model": {"layers": 2, "allreduces_per_layer": 0, "tensor_parallel": 1},
    "step": {
        "fixed_s": 0.002,
        "per_seq_s": 0.0001,
        "per_token_s": 0.0001,
        "prefill_token_s": 0.00001,
        "per_context_token_s": 0.0000001,
    },
    "batching": {"max_running_requests": 64, "prefill_chunk_tokens": 2048, "max_model_len": 2048},
    "speculative": {
        "algorithm": "ngram",
        "draft_tokens": 3,
        "accept_prob": 0.9,
        "draft_step_s": 0.0001,
        "draft_per_seq_s": 0.00001,
    },
}


@dataclasses.dataclass
class Row:
    source: str
    mode: str
    arm: str
    concurrency: int
    measured: float
    predicted: float
    lo: float
    hi: float

    @property
    def inside(self) -> bool:
        return self.lo <= self.measured <= self.hi

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def predict_points(profile: Profile, uncertainty: dict, held: list[Target]) -> list[tuple[float, float, float]]:
    """(point, lo, hi) for each held-out target: the point simulated as the cell was measured, the interval
    from the plausible profiles (`sweep_intervals`) around it."""
    out = []
    for t in held:
        point = simulated_tok_s(profile, t)
        iv = sweep_intervals(profile, uncertainty, [t.concurrency], [point], [point], t.input_tokens, t.output_tokens)
        lv = iv.levels[0]
        out.append(lv.speculative if t.speculative else lv.baseline)
    return out


def validate(source: str, base: Profile, targets: list[Target], cross_arm: bool, smoke: bool = False) -> list[Row]:
    """Held-out rows; `smoke`: one held-out level, two parameters on a 3-point grid (runs, means nothing)."""
    rows = []
    closed = [t for t in targets if t.mode == "closed_loop"]
    levels = sorted({t.concurrency for t in closed})[: 1 if smoke else None]
    fit = {"params": ["step.fixed_s", "step.per_seq_s"], "grid": 3} if smoke else {}
    for level in levels:
        train = [t for t in targets if not (t.mode == "closed_loop" and t.concurrency == level)]
        held = [t for t in closed if t.concurrency == level]
        ident = identify(base, train, **fit)
        for t, (p, lo, hi) in zip(held, predict_points(ident.profile, ident.as_dict(), held), strict=True):
            arm = "spec" if t.speculative else "baseline"
            rows.append(Row(source, "leave-level-out", arm, level, t.tok_s, p, lo, hi))
    if cross_arm:
        for train_spec in (False, True):
            train = [t for t in closed if t.speculative == train_spec]
            held = [t for t in closed if t.speculative != train_spec]
            ident = identify(base, train, **fit)
            for t, (p, lo, hi) in zip(held, predict_points(ident.profile, ident.as_dict(), held), strict=True):
                mode = "spec->baseline" if train_spec else "baseline->spec"
                rows.append(
                    Row(source, mode, "spec" if t.speculative else "baseline", t.concurrency, t.tok_s, p, lo, hi)
                )
    return rows


def report(rows: list[Row]) -> None:
    print(
        f"{'source':>12} {'mode':>16} {'arm':>8} {'C':>4} {'measured':>9} {'predicted':>9} {'error':>7} "
        f"{'90% interval':>21} inside"
    )
    for r in rows:
        print(
            f"{r.source:>12} {r.mode:>16} {r.arm:>8} {r.concurrency:>4} {r.measured:>9.1f} {r.predicted:>9.1f} "
            f"{100 * r.error:>+6.1f}% [{r.lo:>8.1f}, {r.hi:>8.1f}] {'yes' if r.inside else 'NO'}"
        )
    print("coverage (held-out points inside their 90% interval) and |error|:")
    for mode in sorted({r.mode for r in rows}):
        sel = [r for r in rows if r.mode == mode]
        inside = sum(r.inside for r in sel)
        errs = [abs(r.error) for r in sel]
        print(
            f"  {mode:>16}: {inside}/{len(sel)} = {100 * inside / len(sel):.0f}% inside; |error| median "
            f"{100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}%"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", nargs="*", type=Path, default=[], help="vLLM CPU runs' variant directories")
    parser.add_argument("--spec-arm", default="ngram-k3", help="the speculative arm to pair with the baseline")
    parser.add_argument("--seed", action="store_true", help="also: the seed table's EAGLE-3 sweep, leave one out")
    parser.add_argument("--smoke", action="store_true", help="--seed on one level, a coarse fit: seconds")
    args = parser.parse_args(argv)
    args.seed = args.seed or args.smoke
    t0 = time.monotonic()
    rows: list[Row] = []
    cpu_base = profile_from_dict(CPU_BASE)
    for i, run in enumerate(args.measured):
        targets = load_targets(run, args.spec_arm, workload_of(cpu_base))
        if not targets:
            print(f"{run}: no valid cells of baseline / {args.spec_arm}", file=sys.stderr)
            continue
        rows += validate(f"vllm-run{i + 1}", cpu_base, targets, cross_arm=True, smoke=args.smoke)
    if args.seed:
        base = load_profile("kimi-k25-cu130-fusion")
        targets = load_targets(seed_csv_path(), "eagle3", workload_of(base), stack="cuda13-fusion")
        rows += validate("seed-fusion", base, targets, cross_arm=False, smoke=args.smoke)
    if not rows:
        parser.error("nothing to validate: give --measured DIR ... and/or --seed")
    report(rows)
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
