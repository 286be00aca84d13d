"""Do an open-loop sweep and a closed-loop sweep of the same arm agree when expressed in running requests?

Against the simulated engine (a `serve-sim` process pinned to CPU 0, the client to CPU 1), per arm: a closed
loop at each C of a grid, then open loops at each rate (Poisson arrivals); each open level's TPOT p50 and E2E
p50 are compared with the closed sweep's at the batch the open level ran with (its in-flight count while any
request ran; log-log interpolation between the closed levels), beside its plain in-flight mean and Little's
law. Repeated `--runs` times, with fresh servers; prints each figure's spread.

    .venv/bin/python benchmarks/open_closed_consistency.py [--runs 3] [--rates 5,20,40] [--grid 1,2,4,8,16,32] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import numpy as np

from specsweep.client.arrivals import ArrivalPlan, gamma_times
from specsweep.client.backends import RequestSpec
from specsweep.client.loadgen import measure_level
from specsweep.client.prompts import level_prompts
from specsweep.config import request_count
from specsweep.measure.metrics import measure_summary

INPUT, OUTPUT, DURATION_S = 64, 32, 8.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def sim_server(speculative: bool) -> Iterator[str]:
    """A simulated engine on 127.0.0.1, pinned to CPU 0; always stopped."""
    port = free_port()
    argv = [sys.executable, "-m", "specsweep", "serve-sim", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        ["taskset", "-c", "0", *argv, *(["--speculative"] if speculative else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def ready(url: str) -> None:
    for _ in range(200):
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready")


async def closed(url: str, c: int, seed: int) -> dict:
    n = request_count(c, 6, 8)
    prompts = await level_prompts(c, n + c, 1, c, INPUT, seed=seed, url=url)
    lvl = await measure_level(RequestSpec(url=url), c, n, prompts, OUTPUT, warmup=2, idle_probe_s=0.2)
    return measure_summary(lvl.records, c)["metrics"]


async def opened(url: str, rate: float, seed: int, duration_s: float = DURATION_S) -> dict:
    n = max(8, int(rate * duration_s))
    prompts = await level_prompts(rate, n, 1, 8, INPUT, seed=seed, url=url)
    plans = [ArrivalPlan(gamma_times(rate, n, seed))]
    warm = ArrivalPlan(gamma_times(rate, 8, seed + 1))
    lvl = await measure_level(
        RequestSpec(url=url),
        64,
        n,
        prompts,
        OUTPUT,
        warmup=1,
        plans=plans,
        max_in_flight=1024,
        warmup_plan=warm,
        idle_probe_s=0.2,
    )
    return measure_summary(lvl.records, 1024)["metrics"]


def interp(x: float, xs: list[float], ys: list[float]) -> float:
    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


async def one_run(
    speculative: bool, grid: list[int], rates: list[float], seed: int, duration_s: float = DURATION_S
) -> list[dict]:
    with sim_server(speculative) as url:
        await ready(url)
        cl = [await closed(url, c, seed) for c in grid]
        xs = [m["running_requests"]["busy_mean"] for m in cl]
        rows = []
        for rate in rates:
            m = await opened(url, rate, seed, duration_s)
            run = m["running_requests"]["busy_mean"]  # the batch the engine stepped with
            row = {"rate": rate, "running": run, "mean": m["running_requests"]["mean"]}
            row["littles"] = m["running_requests"]["littles_law"]
            for key in ("tpot_ms", "e2e_ms"):
                row[f"{key}_open"] = m[key]["p50"]
                row[f"{key}_closed"] = interp(run, xs, [c[key]["p50"] for c in cl]) if xs[0] <= run <= xs[-1] else None
            rows.append(row)
        return rows


def spread(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{np.median(v):.3g} [{min(v):.3g}, {max(v):.3g}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rates", default="5,20,40")
    ap.add_argument("--grid", default="1,2,4,8,16,32")
    ap.add_argument("--smoke", action="store_true", help="one run, two closed levels, one rate: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.runs, args.rates, args.grid = 1, "20", "2,8"
    duration = 1.0 if args.smoke else DURATION_S
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})  # the client on CPU 1, the server on CPU 0
    grid = [int(x) for x in args.grid.split(",")]
    rates = [float(x) for x in args.rates.split(",")]
    for speculative in (False, True):
        runs = [asyncio.run(one_run(speculative, grid, rates, 10 + r, duration)) for r in range(args.runs)]
        print(f"\narm {'eagle3 (speculative)' if speculative else 'baseline'}: {args.runs} runs, median [min, max]")
        head = ("req/s", "batch (busy mean)", "in-flight mean", "Little", "TPOT p50 ms open / closed@batch",
                "E2E p50 ms open / closed@batch", "TPOT open/closed")  # fmt: skip
        print(" | ".join(head))
        for i, rate in enumerate(rates):
            rows = [run[i] for run in runs]
            ratio = [r["tpot_ms_open"] / r["tpot_ms_closed"] for r in rows if r["tpot_ms_closed"]]

            def col(key: str, rows: list[dict] = rows) -> str:
                return spread([r[key] for r in rows])

            tpot = col("tpot_ms_open") + " / " + col("tpot_ms_closed")
            e2e = col("e2e_ms_open") + " / " + col("e2e_ms_closed")
            print(" | ".join([f"{rate:g}", col("running"), col("mean"), col("littles"), tpot, e2e, spread(ratio)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
