"""Predict a sweep in virtual time: the engine core driven by a closed-loop client, no sleeping, no HTTP.

The virtual client does what the real one does (`specsweep.client.loadgen.run_closed_loop`): C slots, with
`stagger` a shortened ramp request per slot first (`loadgen.ramp_length`), then the measured requests, each
slot sending its next request when its previous one ends, then fillers until the last measured request ends
(the fillers still running then aborted). The figures use the metrics module's definitions
(docs/metrics.md): the steady window is `specsweep.measure.metrics.steady_window` of the level's send and end times,
latencies follow `metrics.per_request` over the measured (non-ramp) requests.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specsweep.analysis.crossover import crossings_log_c
from specsweep.client.backends import ABORTED
from specsweep.client.loadgen import filler_count, ramp_length
from specsweep.config import request_count
from specsweep.measure.metrics import steady_window
from specsweep.sim.engine import Engine, Schedule, SimRequest
from specsweep.sim.profile import Profile

DEFAULT_LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
# A closed-loop client sends the next request a little after the previous one finished (the server writes its
# last chunk, the client reads it, writes the next request, the server parses it): ~2 ms for a Python client
# sharing 2 cores with the server, measured with benchmarks/sim_timing.py (C=1, both arms). The new request joins
# the next step, not the one starting at the instant its predecessor finished.
CLIENT_TURNAROUND_S = 0.002
# The workload when neither an option nor the profile's reference workload sets it: the pipeline's defaults
# (workflow/schemas/config.schema.yaml, `workload:`; tests/unit/test_sim_predict.py keeps them equal).
WORKLOAD_DEFAULTS: dict[str, Any] = {
    "input_tokens": 128,
    "output_tokens": 64,
    "requests_per_concurrency": 4,
    "requests_floor": 8,
    "stagger": True,
}


@dataclass
class LevelPrediction:
    """One arm at one concurrency, in the metrics module's definitions (docs/metrics.md)."""

    concurrency: int
    speculative: bool
    n_requests: int  # measured requests (ramp requests not included)
    input_tokens: int
    output_tokens: int
    aggregate_tok_s: float  # steady window: metrics `output_tok_s_steady` (NaN when the window is empty)
    aggregate_total_tok_s: float  # all output tokens, ramp included / (last end - first send): `output_tok_s_total`
    per_request_tok_s: float  # mean over measured requests of output_tokens / E2E
    ttft_s: float  # mean over measured requests
    tpot_s: float  # mean over measured requests with >= 2 tokens of (E2E - TTFT) / (tokens - 1)
    e2e_s: float  # mean over measured requests, send to last token
    accept_length: float  # tokens per verify pass over the level's requests (1.0 for baseline)
    duration_s: float  # first send to last end
    chunks: int
    peak_chunks_per_s: float  # chunks per second over the steady window
    stagger: bool = True
    ramp_requests: int = 0
    steady_window_s: float = 0.0
    switches: int = 0  # schedule switches of the draft length during the level (0 without a schedule)

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


@dataclass
class VirtualLevel:
    """What one virtual-time level did: its requests in send order and its steps."""

    concurrency: int
    t0: float  # virtual time of the first send (after the warm-up)
    requests: list[SimRequest]  # in send order; `tag` is the client slot
    ramp: list[bool]
    filler: list[bool]  # sent after the measured requests, aborted when the last of them ended
    step_ends: np.ndarray
    step_tokens: np.ndarray
    step_chunks: np.ndarray
    chunks: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # rid -> (time, tokens), if traced
    switches: int = 0  # steps whose draft length differed from the step before's (a schedule switching)
    catchup_tokens: int = 0  # draft-model tokens re-prefilled when drafting resumed

    @property
    def sends(self) -> np.ndarray:
        return np.array([r.arrival for r in self.requests], dtype=float)

    @property
    def ends(self) -> np.ndarray:
        return np.array([r.finished_at for r in self.requests], dtype=float)

    def window(self) -> tuple[float, float]:
        """The steady window, by the metrics module's one definition."""
        return steady_window(self.sends, self.ends, self.concurrency)


def requests_for_level(
    concurrency: int,
    per_concurrency: float = WORKLOAD_DEFAULTS["requests_per_concurrency"],
    floor: int = WORKLOAD_DEFAULTS["requests_floor"],
) -> int:
    """Measured requests of a level: the config's rule (`specsweep.config.request_count`)."""
    return request_count(concurrency, per_concurrency, floor)


def run_level(
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
    stagger: bool = True,
    trace: bool = False,
    schedule: Schedule | None = None,
    fill: bool | None = None,
) -> VirtualLevel:
    """Drive one closed-loop level in virtual time (warm-up requests first, one at a time, not measured).

    With `stagger`, slot k's first request is a ramp request of `ramp_length(output_tokens, k, C)` tokens, all C
    sent at t0, then `n_requests` measured requests follow, then fillers until the last of them ends (with
    `fill`, by default as `stagger`: the pipeline's client; `loadcheck`'s sends none); without, min(C, n) slots
    send the n requests. `trace` keeps every request's chunks (for `level_records`)."""
    if max_running_requests is None:  # the scheduler's cap, and what fits in KV memory (hardware facts)
        max_running_requests = profile.running_cap(speculative, input_tokens + output_tokens)
    engine = Engine(
        profile,
        speculative,
        seed=seed,
        max_running_requests=max_running_requests,
        first_rid=first_rid,
        schedule=schedule,
    )
    now = 0.0
    for _ in range(warmup_requests):
        engine.new_request(input_tokens, output_tokens, arrival=now)
        while engine.has_work:
            now += engine.step(now).duration
        now += turnaround_s
    t0 = now
    reqs: list[SimRequest] = []
    ramp: list[bool] = []
    filler: list[bool] = []

    def send(tokens: int, at: float, slot: int, kind: str) -> SimRequest:
        r = engine.new_request(input_tokens, tokens, arrival=at)
        r.tag = slot
        reqs.append(r)
        ramp.append(kind == "ramp")
        filler.append(kind == "filler")
        return r

    left = n_requests  # measured requests not yet sent
    fills = stagger if fill is None else fill and stagger
    fillers_left = filler_count(concurrency, fills)  # as the real client's prompt set holds
    measured_open = 0  # measured requests sent (or pending) and not yet finished
    measured_rids: set[int] = set()
    if stagger:
        for k in range(concurrency):
            send(ramp_length(output_tokens, k, concurrency), now, k, "ramp")
    else:
        for k in range(min(concurrency, n_requests)):
            measured_rids.add(send(output_tokens, now, k, "measured").rid)
            left -= 1
            measured_open += 1
    pending: deque[tuple[float, int, str]] = deque()  # (arrival, slot, kind) of requests not yet in the engine
    step_ends: list[float] = []
    step_tokens: list[int] = []
    step_chunks: list[int] = []
    chunks: dict[int, list[tuple[float, int]]] = {}
    while engine.has_work or pending:
        if not engine.has_work:
            now = max(now, pending[0][0])  # an idle engine starts at the next arrival (engine.py)
        while pending and pending[0][0] <= now:
            at, slot, kind = pending.popleft()
            r = send(output_tokens, at, slot, kind)
            if kind == "measured":
                measured_rids.add(r.rid)
        res = engine.step(now)
        now += res.duration
        step_ends.append(now)
        step_tokens.append(res.tokens)
        step_chunks.append(len(res.emissions))
        if trace:
            for r, n in res.emissions:
                chunks.setdefault(r.rid, []).append((now, n))
        for r in res.finished:
            if r.rid in measured_rids:
                measured_open -= 1
            if left > 0:  # the slot sends its next request
                pending.append((now + turnaround_s, r.tag, "measured"))
                left -= 1
                measured_open += 1
            elif fills and fillers_left > 0 and measured_open > 0:  # a filler keeps the slot busy
                pending.append((now + turnaround_s, r.tag, "filler"))
                fillers_left -= 1
        if fills and left == 0 and measured_open == 0:  # the last measured request ended: fillers aborted
            for r, is_filler in zip(reqs, filler, strict=True):
                if is_filler and math.isnan(r.finished_at):
                    engine.abort(r)
                    r.finished_at = now
            pending.clear()
            break
    return VirtualLevel(
        concurrency,
        t0,
        reqs,
        ramp,
        filler,
        np.array(step_ends, dtype=float),
        np.array(step_tokens, dtype=np.int64),
        np.array(step_chunks, dtype=np.int64),
        chunks,
        engine.switches,
        engine.catchup_tokens,
    )


def summarize_level(
    level: VirtualLevel, speculative: bool, input_tokens: int, output_tokens: int, stagger: bool
) -> LevelPrediction:
    """The level's figures in the metrics module's definitions.

    Steady-window throughput counts the tokens of the steps that end inside (start, end]: in virtual time a
    step's chunks all arrive at its end, and `metrics.tokens_between`, spreading each chunk over its interval
    since the stream's previous one, counts a real client's closing step (nearly) whole and its opening one
    (nearly) not."""
    reqs = level.requests
    sends, ends = level.sends, level.ends
    start, end = level.window()
    span = end - start
    in_win = (level.step_ends > start) & (level.step_ends <= end)
    meas = ~(np.array(level.ramp, dtype=bool) | np.array(level.filler, dtype=bool))
    first = np.array([r.first_token_at for r in reqs], dtype=float)
    tokens = np.array([r.generated for r in reqs], dtype=float)
    # metrics.per_request: TTFT = first token - send, E2E = last token - send, TPOT = (E2E - TTFT) / (n - 1)
    ttft = (first - sends)[meas]
    e2e = (ends - sends)[meas]
    n_tok = tokens[meas]
    many = n_tok >= 2
    tpot = (e2e[many] - ttft[many]) / (n_tok[many] - 1)
    verify = sum(r.verify_ct for r in reqs)
    # the prefill's first token is not a verify pass, nor are tokens decoded with drafting off (a schedule's K=0)
    verify_tokens = sum(r.generated - 1 - r.plain_tokens for r in reqs)
    t0, last_end = float(np.min(sends)), float(np.max(ends))

    def mean(a: np.ndarray) -> float:
        return float(a.mean()) if a.size else math.nan

    return LevelPrediction(
        concurrency=level.concurrency,
        speculative=speculative,
        n_requests=int(meas.sum()),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        aggregate_tok_s=float(level.step_tokens[in_win].sum() / span) if span > 0 else math.nan,
        aggregate_total_tok_s=float(tokens.sum() / (last_end - t0)),
        per_request_tok_s=mean(n_tok / e2e),
        ttft_s=mean(ttft),
        tpot_s=mean(tpot),
        e2e_s=mean(e2e),
        accept_length=verify_tokens / verify if verify else 1.0,
        duration_s=last_end - t0,
        chunks=int(level.step_chunks.sum()),
        peak_chunks_per_s=float(level.step_chunks[in_win].sum() / span) if span > 0 else math.nan,
        stagger=stagger,
        ramp_requests=int(np.sum(level.ramp)),
        steady_window_s=float(span),
        switches=level.switches,
    )


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
    stagger: bool = True,
    schedule: Schedule | None = None,
    fill: bool | None = None,
) -> LevelPrediction:
    """Run one closed-loop level in virtual time: `n_requests` measured requests, after C ramp requests when
    `stagger` (as the pipeline's client); warm-up requests first, one at a time, not measured."""
    level = run_level(
        profile,
        speculative,
        concurrency,
        n_requests,
        input_tokens,
        output_tokens,
        seed=seed,
        max_running_requests=max_running_requests,
        warmup_requests=warmup_requests,
        turnaround_s=turnaround_s,
        first_rid=first_rid,
        stagger=stagger,
        schedule=schedule,
        fill=fill,
    )
    return summarize_level(level, speculative, input_tokens, output_tokens, stagger)


def level_records(level: VirtualLevel) -> Any:
    """A traced level (`run_level(..., trace=True)`) as `requests.parquet` rows (docs/ARCHITECTURE.md), times
    relative to t0, so `specsweep.measure.metrics` can be run on a prediction."""
    import pandas as pd

    if level.requests and not level.chunks:
        raise ValueError("level_records needs a level run with trace=True")
    t0 = level.t0
    rows = []
    for i, (r, is_ramp, is_filler) in enumerate(zip(level.requests, level.ramp, level.filler, strict=True)):
        cs = level.chunks.get(r.rid, [])
        rows.append(
            {
                "repeat": 0,
                "request_index": i,
                "prompt_index": i,
                "slot": int(r.tag),
                "ramp": is_ramp,
                "filler": is_filler,
                "send_s": r.arrival - t0,
                "first_token_s": r.first_token_at - t0,
                "end_s": r.finished_at - t0,
                "chunk_s": [t - t0 for t, _ in cs],
                "chunk_tokens": [n for _, n in cs],
                "server_chunk_s": [t - t0 for t, _ in cs],
                "input_tokens": r.prompt_tokens,
                "output_tokens": r.generated,
                "server_output_tokens": r.generated,
                "expected_output_tokens": r.max_new_tokens,
                "spec_verify_ct": r.verify_ct if r.rng is not None else -1,
                "cached_tokens": 0,
                "output_sha256": "",
                "output_prefix": "",
                "content": "",
                "finish_reason": "length" if r.generated >= r.max_new_tokens else "stop",
                "ok": not r.aborted,
                "error_kind": ABORTED if r.aborted else "",
                "error": "",
            }
        )
    return pd.DataFrame(rows)


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
    input_tokens: int = WORKLOAD_DEFAULTS["input_tokens"],
    output_tokens: int = WORKLOAD_DEFAULTS["output_tokens"],
    per_concurrency: float = WORKLOAD_DEFAULTS["requests_per_concurrency"],
    floor: int = WORKLOAD_DEFAULTS["requests_floor"],
    seed: int = 0,
    max_running_requests: int | None = None,
    stagger: bool = WORKLOAD_DEFAULTS["stagger"],
    schedule: Schedule | None = None,
) -> SweepPrediction:
    """Both arms at every level, with the config's request-count rule (measured requests, after the ramp); with
    a `schedule`, the speculative arm switches its draft length per step (`sim.engine.parse_schedule`)."""
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
                stagger=stagger,
                schedule=schedule if spec else None,
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
