"""Real-time fidelity of the simulated server: achieved vs model throughput per level.

Starts `specsweep serve-sim` in a subprocess (its own core), drives it with the sim's own minimal
closed-loop client (specsweep.virtual.loadcheck) and compares the steady-window aggregate throughput with the
virtual-time prediction of the same profile, workload and seed. Drift = achieved / model - 1. Both sides use
the pipeline's staggered slots (C ramp requests, then the measured ones; `--no-stagger` for none) and the
metrics module's steady window. The server CPU column is its process tree's CPU time over the level's wall time.
Run: .venv/bin/python benchmarks/sim_timing.py [--profile demo] [--speculative] [--levels 1,10,70,250] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import psutil

from specsweep.sim.profile import load_profile
from specsweep.telemetry.process import tree_cpu
from specsweep.virtual.loadcheck import closed_loop, sim_server
from specsweep.virtual.predict import WORKLOAD_DEFAULTS, requests_for_level, simulate_level


async def resets(url: str) -> int:
    """Cumulative times the server's loop fell behind and restarted its schedule."""
    async with aiohttp.ClientSession() as s, s.get(url + "/server_info") as r:
        return int((await r.json())["sim_loop"]["schedule_resets"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--speculative", action="store_true")
    ap.add_argument("--levels", default="1,10,70,250")
    ap.add_argument("--input-tokens", type=int, default=WORKLOAD_DEFAULTS["input_tokens"])
    ap.add_argument("--output-tokens", type=int, default=WORKLOAD_DEFAULTS["output_tokens"])
    ap.add_argument("--requests-per-concurrency", type=float, default=WORKLOAD_DEFAULTS["requests_per_concurrency"])
    ap.add_argument("--requests-floor", type=int, default=WORKLOAD_DEFAULTS["requests_floor"])
    ap.add_argument("--stagger", action=argparse.BooleanOptionalAction, default=WORKLOAD_DEFAULTS["stagger"])
    ap.add_argument("--smoke", action="store_true", help="two small levels, few requests: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.levels, args.requests_per_concurrency, args.requests_floor, args.output_tokens = "1,4", 1, 4, 16
    profile = load_profile(args.profile)
    levels = [int(x) for x in args.levels.split(",")]
    server_argv = ["--profile", args.profile, "--debug-timestamps", "--draws-by-request"] + (
        ["--speculative"] if args.speculative else []
    )
    print(
        f"profile={profile.name} speculative={args.speculative} in={args.input_tokens} out={args.output_tokens} "
        f"stagger={args.stagger}"
    )
    print("drift = achieved / model - 1; 'total' = all tokens / (last end - first send), 'steady' = steady window")
    print(
        f"{'C':>5} {'N':>5} {'model tok/s':>12} {'achieved':>10} {'total':>7} {'steady':>7} {'E2E':>7} "
        f"{'chunks/s':>9} {'max lag ms':>10} {'resets':>6} {'server CPU':>10}"
    )
    with sim_server(*server_argv) as url:
        # the server is this process's child: its CPU share per level says how much room the profile leaves it
        server_pid = psutil.Process().children()[0].pid
        asyncio.run(closed_loop(url, 1, 2, args.input_tokens, args.output_tokens, stagger=False))  # warm-up
        sent = 2  # the server numbers requests; ids seed acceptance draws, so the model replays the same ids
        for c in levels:
            n = requests_for_level(c, args.requests_per_concurrency, args.requests_floor)
            model = simulate_level(
                profile,
                args.speculative,
                c,
                n,
                args.input_tokens,
                args.output_tokens,
                first_rid=sent,
                stagger=args.stagger,
                fill=False,  # loadcheck's client sends no fillers
            )
            sent += n + model.ramp_requests
            cpu0, wall0 = tree_cpu(server_pid), time.monotonic()
            got = asyncio.run(closed_loop(url, c, n, args.input_tokens, args.output_tokens, stagger=args.stagger))
            cpu1, wall1 = tree_cpu(server_pid), time.monotonic()
            server_share = (cpu1[0] - cpu0[0]) / (wall1 - wall0) if cpu0 and cpu1 else float("nan")
            total = got.aggregate_total_tok_s / model.aggregate_total_tok_s - 1
            steady = got.aggregate_tok_s / model.aggregate_tok_s - 1
            e2e = got.e2e_s / model.e2e_s - 1
            rate = got.chunks / got.duration_s
            print(
                f"{c:>5} {n:>5} {model.aggregate_total_tok_s:>12.1f} {got.aggregate_total_tok_s:>10.1f} "
                f"{100 * total:>+6.2f}% {100 * steady:>+6.2f}% {100 * e2e:>+6.2f}% {rate:>9.0f} "
                f"{1000 * got.max_lag_s:>10.2f} {asyncio.run(resets(url)):>6} {100 * server_share:>9.0f}%"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
