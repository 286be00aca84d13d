"""Is this host quiet? Time the host itself, with nothing of specsweep running.

A paired ratio of two servers' blocks is only as steady as the machine under them. On a VM the hypervisor can
slow every vCPU for tens of seconds (other guests on the same cores or memory, host frequency) without any of
it showing as steal time or as a smaller CPU share granted to the server, so no gate inside the guest sees it:
such a slow spell that covers one arm's block and not the other's moves that round's ratio. This script pins
one probe process to each CPU, times the same small kernels over and over (a pure-Python loop: the
interpreter's speed, as an engine's scheduler and a CPU engine's Python run; a numpy sum over 16 MB: memory
bandwidth), and prints, per CPU and kernel, each bin's median time against the whole run's median: how deep and
how long the slow spells are, and whether the CPUs slow together (the host) or one alone (a process of this
guest). /proc/stat's steal over the run is printed beside it.

    python benchmarks/host_noise.py [--seconds 150] [--bin-s 10] [--slow 0.10]

Read with docs/analysis.md ("Is the host quiet?"): a level's rounds can only be as close as the host's bins
that its blocks span.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from specsweep.client.cpu import host_snapshot  # noqa: E402

KERNELS = ("python", "memory")


def probe(cpu: int, seconds: float, pause_s: float, out: mp.Queue) -> None:
    """Time both kernels on `cpu` until `seconds` have passed: rows of (time, python s, memory s)."""
    os.sched_setaffinity(0, {cpu})
    data = np.random.default_rng(cpu).random(2_000_000)  # 16 MB: past the caches
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        x = 0
        for i in range(100_000):
            x += i * i
        t1 = time.perf_counter()
        for _ in range(5):
            data.sum()
        t2 = time.perf_counter()
        rows.append((time.monotonic(), t1 - t0, t2 - t1))
        time.sleep(pause_s)
    out.put((cpu, rows))


def spells(rel: np.ndarray, slow: float) -> tuple[float, int]:
    """The share of bins slower than 1 + slow, and the longest run of them (bins)."""
    hit = rel > 1 + slow
    longest = run = 0
    for h in hit:
        run = run + 1 if h else 0
        longest = max(longest, run)
    return float(hit.mean()) if hit.size else 0.0, longest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=150.0, help="how long to probe")
    ap.add_argument("--bin-s", type=float, default=10.0, help="bin width: about one interleaved round of blocks")
    ap.add_argument("--slow", type=float, default=0.10, help="a bin this much slower than the median is slow")
    ap.add_argument("--pause-s", type=float, default=0.1, help="between probes (the probe is ~30 ms)")
    ap.add_argument("--smoke", action="store_true", help="4 s, 1 s bins: the script runs (the pipeline tier)")
    args = ap.parse_args()
    if args.smoke:
        args.seconds, args.bin_s = 4.0, 1.0
    cpus = sorted(os.sched_getaffinity(0))
    before = host_snapshot(tuple(cpus), None)
    queue: mp.Queue = mp.Queue()
    procs = [mp.Process(target=probe, args=(c, args.seconds, args.pause_s, queue)) for c in cpus]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    steal = host_snapshot(tuple(cpus), None).since(before)["steal_share"]
    t0 = min(rows[0][0] for rows in results.values())
    print(f"host probe: {len(cpus)} CPUs, {args.seconds:g} s, {args.bin_s:g}-s bins; steal over the run {steal:.2%}")
    print("each bin's median time over the run's median (1.00: as fast as usual; a bin > 1 + slow is slow)")
    binned: dict[tuple[int, str], np.ndarray] = {}
    for cpu in cpus:
        rows = np.array(results[cpu])
        bins = ((rows[:, 0] - t0) // args.bin_s).astype(int)
        for k, name in enumerate(KERNELS):
            x = rows[:, k + 1]
            rel = np.array([np.median(x[bins == b]) for b in np.unique(bins)]) / np.median(x)
            binned[(cpu, name)] = rel
            share, longest = spells(rel, args.slow)
            print(
                f"cpu{cpu} {name:6} median {np.median(x) * 1e3:5.1f} ms | slow bins {share:4.0%}, longest "
                f"{longest * args.bin_s:4.0f} s, worst {rel.max():.2f}x | " + " ".join(f"{v:.2f}" for v in rel)
            )
    if len(cpus) > 1:
        for name in KERNELS:
            series = [binned[(c, name)] for c in cpus]
            n = min(s.size for s in series)
            r = np.corrcoef(series[0][:n], series[1][:n])[0, 1] if n > 2 else float("nan")
            print(f"{name}: cpu{cpus[0]} and cpu{cpus[1]} bins correlate r = {r:.2f} (near 1: the host slows both)")
    print(f"{'smoke: ' if args.smoke else ''}host timed: {sum(len(r) for r in results.values())} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
