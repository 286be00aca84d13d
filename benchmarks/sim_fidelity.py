"""Fidelity of the Kimi-K2.5 profiles to the user's seed measurements (a figure per level, not a test).

Prints, per level of the CUDA 13 + fusion EAGLE-3 closed-loop sweep, measured vs simulated aggregate
throughput and the error, the level simulated the way the seed was measured (the profile's reference workload:
no ramp requests, whole-level throughput); then what the pipeline would measure of the same levels (staggered
slots, steady window); then the four single-stream figures (decode rate of one request, 1/TPOT) against their
stacks' profiles. Also shows per-request tok/s and mean latency, which were not fitted.
Run: .venv/bin/python benchmarks/sim_fidelity.py [--seed 0]
"""

from __future__ import annotations

import argparse
import csv

from specsweep.sim.profile import load_profile
from specsweep.virtual.fit import Target, load_targets, seed_csv_path, simulated_tok_s, workload_of
from specsweep.virtual.predict import simulate_level

SINGLE_STREAM = [  # (seed stack, arm, profile)
    ("cuda12.8", "baseline", "kimi-k25-cu128"),
    ("cuda12.8", "eagle3", "kimi-k25-cu128"),
    ("cuda13", "baseline", "kimi-k25-cu130"),
    ("cuda13-fusion", "eagle3", "kimi-k25-cu130-fusion"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="the test suite's check (the whole run takes seconds)")
    args = ap.parse_args(argv)
    rows = list(csv.DictReader(seed_csv_path().open()))
    p = load_profile("kimi-k25-cu130-fusion")
    w = workload_of(p)
    print(f"profile {p.name}; assumed seed workload: {w}")
    print(
        f"{'C':>4} {'measured':>9} {'sim':>8} {'error':>7} | {'req tok/s':>9} {'sim':>6} | {'latency s':>9} {'sim':>6}"
        f" | {'staggered steady':>16}"
    )
    worst = 0.0
    for t in load_targets(seed_csv_path(), "eagle3", w, stack="cuda13-fusion", single_stream=False):
        got = simulated_tok_s(p, t, seed=args.seed)
        lp = simulate_level(
            p, True, t.concurrency, t.n_requests, t.input_tokens, t.output_tokens, seed=args.seed, stagger=t.stagger
        )
        staggered = simulate_level(
            p, True, t.concurrency, t.n_requests, t.input_tokens, t.output_tokens, seed=args.seed, stagger=True
        )
        row = next(r for r in rows if r["mode"] == "closed_loop" and int(r["concurrency"]) == t.concurrency)
        err = got / t.tok_s - 1
        worst = max(worst, abs(err))
        print(
            f"{t.concurrency:>4} {t.tok_s:>9.1f} {got:>8.1f} {100 * err:>+6.1f}% | "
            f"{float(row['per_request_tok_s']):>9.1f} {lp.per_request_tok_s:>6.1f} | "
            f"{float(row['mean_latency_s']):>9.1f} {lp.e2e_s:>6.1f} | {staggered.aggregate_tok_s:>16.1f}"
        )
    print(f"max |aggregate error| {100 * worst:.1f}%")
    print("single stream (decode tok/s of one request):")
    for stack, arm, name in SINGLE_STREAM:
        prof = load_profile(name)
        pw = workload_of(prof)
        measured = next(
            float(r["aggregate_tok_s"])
            for r in rows
            if r["stack"] == stack and r["arm"] == arm and r["mode"] == "single_stream"
        )
        t = Target(
            arm != "baseline",
            "single_stream",
            1,
            measured,
            pw["single_stream_input_tokens"],
            pw["output_tokens"],
            1,
        )
        got = simulated_tok_s(prof, t, seed=args.seed)
        print(
            f"  {stack:>14} {arm:>8} ({name}): measured {measured:6.1f}  sim {got:6.1f}  "
            f"error {100 * (got / measured - 1):+5.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
