"""Predict a sweep in virtual time: the engine core driven by a closed-loop client, no sleeping, no HTTP.

Metrics follow the client's definitions (docs/ARCHITECTURE.md): aggregate throughput over the steady window
(from the first send until in-flight requests first drop below C), TTFT, TPOT, per-request tok/s, mean E2E.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

from specsweep.config import request_count
from specsweep.sim.engine import ADMISSION_WINDOW_S, Engine, SimRequest, admission_end
from specsweep.sim.profile import Profile, load_profile

DEFAULT_LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
# A closed-loop client sends the next request a little after the previous one finished (its last chunk has
# to be read, the next request written and parsed): ~3 ms for a Python client sharing 2 cores with the
# server, measured with benchmarks/sim_timing.py. The new request joins the next step, not the one starting
# at the instant its predecessor finished.
CLIENT_TURNAROUND_S = 0.003

try:
    from specsweep.analysis.crossover import crossings_log_c
except ImportError:  # the analysis package is optional for the simulator; same interpolation as there

    def crossings_log_c(concurrency: list[float], speedup: list[float]) -> list[float]:
        """Concurrencies where speedup crosses 1, interpolated linearly in log C."""
        out: list[float] = []
        pts = list(zip(concurrency, speedup, strict=True))
        for (c0, s0), (c1, s1) in zip(pts, pts[1:], strict=False):
            d0, d1 = s0 - 1.0, s1 - 1.0
            if d0 == 0:
                out.append(float(c0))
            elif d0 * d1 < 0:
                f = d0 / (d0 - d1)
                out.append(math.exp(math.log(c0) + f * (math.log(c1) - math.log(c0))))
        if pts and pts[-1][1] == 1.0:
            out.append(float(pts[-1][0]))
        return out


@dataclass
class LevelPrediction:
    """One arm at one concurrency, in the client's metric definitions."""

    concurrency: int
    speculative: bool
    n_requests: int
    input_tokens: int
    output_tokens: int
    aggregate_tok_s: float  # steady window
    aggregate_total_tok_s: float  # all output tokens / (last end - first send)
    per_request_tok_s: float  # mean over requests of output_tokens / E2E
    ttft_s: float
    tpot_s: float
    e2e_s: float
    accept_length: float  # mean tokens per verify pass (1.0 for baseline)
    duration_s: float  # first send to last end
    chunks: int
    peak_chunks_per_s: float  # chunks per second over the steady window

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def requests_for_level(concurrency: int, per_concurrency: int = 2, floor: int = 8) -> int:
    return request_count(concurrency, per_concurrency, floor)


def simulate_level(
    profile: Profile,
    speculative: bool,
    concurrency: int,
    n_requests: int,
    input_tokens: int,
    output_tokens: int,
    seed: int = 0,
    max_running_requests: int | None = None,
    warmup_requests: int = 0,
    turnaround_s: float = CLIENT_TURNAROUND_S,
    first_rid: int = 0,
) -> LevelPrediction:
    """Run one closed-loop level in virtual time (warm-up requests first, one at a time, not measured)."""
    engine = Engine(profile, speculative, seed=seed, max_running_requests=max_running_requests, first_rid=first_rid)
    now = 0.0
    for _ in range(warmup_requests):
        engine.new_request(input_tokens, output_tokens, arrival=now)
        now += ADMISSION_WINDOW_S
        while engine.has_work:
            now += engine.step(now).duration
        now += turnaround_s
    t0 = now
    reqs: list[SimRequest] = []
    sent = 0
    pending: list[float] = []  # arrival times of requests sent but not yet in the engine
    for _ in range(min(concurrency, n_requests)):
        reqs.append(engine.new_request(input_tokens, output_tokens, arrival=now))
        sent += 1
    now += ADMISSION_WINDOW_S
    step_ends: list[float] = []
    step_tokens: list[int] = []
    step_chunks: list[int] = []
    window_end = math.inf
    completions = 0
    while engine.has_work or pending:
        if not engine.has_work:
            now = admission_end([max(now, pending[0]), *pending[1:]])
        while pending and pending[0] <= now:
            reqs.append(engine.new_request(input_tokens, output_tokens, arrival=pending.pop(0)))
        res = engine.step(now)
        now += res.duration
        step_ends.append(now)
        step_tokens.append(res.tokens)
        step_chunks.append(len(res.emissions))
        for _ in res.finished:
            completions += 1
            if sent < n_requests:
                pending.append(now + turnaround_s)
                sent += 1
            elif window_end == math.inf:
                window_end = now  # in-flight drops below C for the first time
    if window_end == math.inf:
        window_end = now
    last_end = max(r.finished_at for r in reqs)
    win = [(e, n, c) for e, n, c in zip(step_ends, step_tokens, step_chunks, strict=True) if e <= window_end]
    win_tokens = sum(n for _, n, _ in win)
    win_chunks = sum(c for _, _, c in win)
    span = window_end - t0
    e2e = [r.finished_at - r.arrival for r in reqs]
    ttft = [r.first_token_at - r.arrival for r in reqs]
    tpot = [(r.finished_at - r.first_token_at) / (r.max_new_tokens - 1) for r in reqs if r.max_new_tokens > 1]
    verify = sum(r.verify_ct for r in reqs)
    verify_tokens = sum(r.generated - 1 for r in reqs)
    n = len(reqs)
    return LevelPrediction(
        concurrency=concurrency,
        speculative=speculative,
        n_requests=n,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        aggregate_tok_s=win_tokens / span if span > 0 else 0.0,
        aggregate_total_tok_s=n * output_tokens / (last_end - t0),
        per_request_tok_s=sum(output_tokens / e for e in e2e) / n,
        ttft_s=sum(ttft) / n,
        tpot_s=sum(tpot) / len(tpot) if tpot else math.nan,
        e2e_s=sum(e2e) / n,
        accept_length=verify_tokens / verify if verify else 1.0,
        duration_s=last_end - t0,
        chunks=sum(step_chunks),
        peak_chunks_per_s=win_chunks / span if span > 0 else 0.0,
    )


@dataclass
class SweepPrediction:
    baseline: list[LevelPrediction]
    speculative: list[LevelPrediction]

    def speedup(self) -> list[float]:
        return [s.aggregate_tok_s / b.aggregate_tok_s for b, s in zip(self.baseline, self.speculative, strict=True)]

    def crossovers(self) -> list[float]:
        return crossings_log_c([float(b.concurrency) for b in self.baseline], self.speedup())


def predict_sweep(
    profile: Profile,
    levels: list[int],
    input_tokens: int = 128,
    output_tokens: int = 64,
    per_concurrency: int = 2,
    floor: int = 8,
    seed: int = 0,
    max_running_requests: int | None = None,
) -> SweepPrediction:
    """Both arms at every level, with the config's request-count rule."""
    arms = {}
    for spec in (False, True):
        arms[spec] = [
            simulate_level(
                profile,
                spec,
                c,
                requests_for_level(c, per_concurrency, floor),
                input_tokens,
                output_tokens,
                seed=seed,
                max_running_requests=max_running_requests,
            )
            for c in levels
        ]
    return SweepPrediction(arms[False], arms[True])


def format_sweep(profile: Profile, sweep: SweepPrediction) -> str:
    lines = [
        f"profile={profile.name} ({'ILLUSTRATIVE' if profile.illustrative else 'calibrated'}), "
        f"source=simulated (virtual time)"
    ]
    for arm in (profile.reference or {}).get("uncalibrated_arms") or []:
        lines.append(
            f"CAUTION: the {arm} arm of this profile was not calibrated against measurements under load; its "
            "curve (and any crossover) is an extrapolation. Measure a few of its cells and run `specsweep calibrate`."
        )
    head = (
        f"{'C':>5} {'arm':>11} {'agg tok/s':>10} {'req tok/s':>10} {'TTFT s':>8} {'TPOT ms':>8} "
        f"{'E2E s':>8} {'accept':>6}"
    )
    lines.append(head)
    for b, s in zip(sweep.baseline, sweep.speculative, strict=True):
        for p, arm in ((b, "baseline"), (s, "speculative")):
            lines.append(
                f"{p.concurrency:>5} {arm:>11} {p.aggregate_tok_s:>10.1f} {p.per_request_tok_s:>10.1f} "
                f"{p.ttft_s:>8.3f} {p.tpot_s * 1000:>8.2f} {p.e2e_s:>8.2f} {p.accept_length:>6.2f}"
            )
    lines.append(
        "speedup (speculative/baseline aggregate): "
        + ", ".join(f"C={b.concurrency}: {x:.2f}" for b, x in zip(sweep.baseline, sweep.speedup(), strict=True))
    )
    cx = sweep.crossovers()
    lines.append("crossover C: " + (", ".join(f"{c:.1f}" for c in cx) if cx else "none in range"))
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="demo", help="packaged profile name or YAML path")
    parser.add_argument("--concurrency", type=_int_list, default=DEFAULT_LEVELS, help="comma-separated levels")
    # Unset workload options take the profile's reference workload (what it was calibrated on), else these.
    parser.add_argument("--input-tokens", type=int, default=None, help="default: profile's reference, else 128")
    parser.add_argument("--output-tokens", type=int, default=None, help="default: profile's reference, else 64")
    parser.add_argument("--requests-per-concurrency", type=int, default=None, help="default: reference, else 2")
    parser.add_argument("--requests-floor", type=int, default=None, help="default: reference, else 8")
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


WORKLOAD_DEFAULTS = {"input_tokens": 128, "output_tokens": 64, "requests_per_concurrency": 2, "requests_floor": 8}


def resolve_workload(args: argparse.Namespace, profile: Profile) -> None:
    """Fill unset workload options from the profile's reference workload, then from the demo defaults."""
    ref = (profile.reference or {}).get("workload") or {}
    for key, default in WORKLOAD_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, int(ref.get(key, default)))


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    resolve_workload(args, profile)
    workload = {k: getattr(args, k) for k in WORKLOAD_DEFAULTS}
    t = time.perf_counter()
    sweep = predict_sweep(
        profile,
        args.concurrency,
        args.input_tokens,
        args.output_tokens,
        args.requests_per_concurrency,
        args.requests_floor,
        args.seed,
        args.max_running_requests,
    )
    elapsed = time.perf_counter() - t
    if args.json:
        print(
            json.dumps(
                {
                    "profile": profile.name,
                    "illustrative": profile.illustrative,
                    "workload": workload,
                    "baseline": [p.as_dict() for p in sweep.baseline],
                    "speculative": [p.as_dict() for p in sweep.speculative],
                    "speedup": sweep.speedup(),
                    "crossovers": sweep.crossovers(),
                    "elapsed_s": elapsed,
                },
                indent=2,
            )
        )
    else:
        print(
            f"workload: input {args.input_tokens} / output {args.output_tokens} tokens, requests per level "
            f"max({args.requests_floor}, {args.requests_per_concurrency} x C)"
        )
        print(format_sweep(profile, sweep))
        print(f"(predicted in {elapsed:.3f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.sim.predict", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
