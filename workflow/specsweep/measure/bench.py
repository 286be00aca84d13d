"""Measure a running server at several concurrency levels, without Snakemake (`specsweep bench`).

Writes `OUT/c<C>/requests.parquet` (one row per request) and `OUT/c<C>/summary.json` per level, atomically,
through the same measuring path (`loadgen.measure_level`) and summary writer (`specsweep.measure.summary`) as the
pipeline, judged by the config schema's default gates.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specsweep.aio import cancel_and_wait
from specsweep.client.backends import RequestRecord, RequestSpec
from specsweep.client.cpu import pin_self, plan_cpus
from specsweep.client.datasets import Dataset, DatasetError
from specsweep.client.loadgen import filler_count, measure_level, warmup_count
from specsweep.client.prompts import ChatTemplateUnavailable, hf_chat_template, level_prompts, templated
from specsweep.config import read_dataset, request_count
from specsweep.engines import get_engine
from specsweep.measure.summary import judged, level_summary, write_cell
from specsweep.records import MeasuredLevel
from specsweep.redact import MissingAPIKey, api_key_from_env


class Progress:
    """A tqdm bar (requests done of total, current output tok/s) on a terminal; silent otherwise.

    The request path only bumps counters; a 0.5 s timer task moves the bar, so drawing costs the
    measurement nothing.
    """

    def __init__(self, total: int, label: str = "", enabled: bool | None = None, stream: Any = None) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = (sys.stdout.isatty() and self.stream.isatty()) if enabled is None else enabled
        self.done = 0
        self.failed = 0
        self.tokens = 0
        self._task: asyncio.Task[None] | None = None
        self._bar: tqdm | None = None

    def on_done(self, rec: RequestRecord) -> None:
        self.done += 1
        self.tokens += rec.output_tokens
        if not rec.ok:
            self.failed += 1

    async def _draw(self, interval: float = 0.5) -> None:
        last_t, last_tok, shown = time.monotonic(), self.tokens, 0
        while True:
            await asyncio.sleep(interval)
            now, tok = time.monotonic(), self.tokens
            rate = (tok - last_tok) / (now - last_t) if now > last_t else 0.0
            last_t, last_tok = now, tok
            self._update(rate, shown)
            shown = self.done

    def _update(self, rate: float, shown: int) -> None:
        assert self._bar is not None
        self._bar.update(self.done - shown)
        fail = f", failed {self.failed}" if self.failed else ""
        self._bar.set_postfix_str(f"{rate:.1f} tok/s{fail}")

    def start(self) -> Progress:
        if self.enabled:
            self._bar = tqdm(total=self.total, desc=self.label, unit="req", file=self.stream, leave=True)
            self._task = asyncio.get_running_loop().create_task(self._draw())
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
            self._bar.close()
            self._bar = None


@dataclass
class BenchOptions:
    """What `specsweep bench` measures and how: its options, by their names there (`--slo-ttft-ms`: slo_ttft_ms),
    with no defaults here: the command's are the config schema's (specsweep.cli.bench)."""

    url: str
    out: str
    engine: str | None
    backend: str
    endpoint: str
    transport: str
    model: str | None
    concurrency: list[int]
    requests_per_concurrency: float
    requests_floor: int
    requests_max: int | None
    duration_s: float | None
    no_stagger: bool
    input_tokens: int
    output_tokens: int
    warmup: int
    repeats: int
    seed: int
    temperature: float
    dataset: str | None
    dataset_format: str
    dataset_chat: str | None
    tokenizer: str | None
    api_key_env: str | None
    request_timeout_s: float
    no_reset: bool
    client_cpus: str
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_e2e_ms: float | None
    server_max_running: int | None
    gates: dict[str, float]  # validity gate -> threshold (the schema's `gates` keys)


def _dataset(args: BenchOptions) -> Dataset | None:
    """The --dataset file, checked as the pipeline checks `workload.dataset` (config.read_dataset)."""
    ds = {"path": args.dataset, "format": args.dataset_format, "chat": args.dataset_chat} if args.dataset else None
    return read_dataset({"dataset": ds, "output_tokens": args.output_tokens, "endpoint": args.endpoint})


async def bench(args: BenchOptions) -> int:
    """Measure every level: 0 when every level is valid, 1 when
    some level is invalid, 2 on bad input. This process's CPUs are given back after (it pins itself to the
    client's CPUs): a caller running it in-process, as the tests do, must not be left on one core."""
    affinity = os.sched_getaffinity(0)
    try:
        return await _bench_pinned(args)
    finally:
        os.sched_setaffinity(0, affinity)


async def _bench_pinned(args: BenchOptions) -> int:
    try:
        api_key = api_key_from_env(args.api_key_env)
        dataset = _dataset(args)
        render = hf_chat_template(args.tokenizer) if args.endpoint == "chat" and args.backend == "sglang" else None
    except (MissingAPIKey, DatasetError, ChatTemplateUnavailable) as e:
        print(e, file=sys.stderr)
        return 2
    spec = RequestSpec(
        url=args.url,
        backend=args.backend,
        endpoint=args.endpoint,
        model=args.model,
        temperature=args.temperature,
        request_timeout_s=args.request_timeout_s,
        api_key=api_key,
        transport=args.transport,
    )
    plan = plan_cpus(None if args.client_cpus == "none" else args.client_cpus, None)
    pin_self(plan.client)
    engine = get_engine(args.engine or ("sglang" if args.backend == "sglang" else "vllm"), args.api_key_env)
    counts = {
        c: request_count(c, args.requests_per_concurrency, args.requests_floor, args.requests_max)
        for c in args.concurrency
    }
    slos = {
        k: v
        for k, v in (
            ("ttft_ms", args.slo_ttft_ms),
            ("tpot_ms", args.slo_tpot_ms),
            ("e2e_ms", args.slo_e2e_ms),
        )
        if v is not None
    }
    gates = dict(args.gates)
    all_valid = True
    for c, n in counts.items():
        prompts = await level_prompts(
            c,
            n + (0 if args.no_stagger else c) + filler_count(c, not args.no_stagger),
            args.repeats,
            warmup_count(args.warmup, c),
            args.input_tokens,
            args.seed,
            args.output_tokens,
            dataset,
            url=args.url,
            model=args.model,
            tokenizer_path=args.tokenizer,
            headers=spec.headers() if api_key else None,
        )
        if render is not None:
            prompts = templated(prompts, render)
        progress = Progress((n + c) * args.repeats, label=f"c={c}").start()
        try:
            level = await measure_level(
                spec,
                c,
                n,
                prompts,
                args.output_tokens,
                warmup=args.warmup,
                repeats=args.repeats,
                stagger=not args.no_stagger,
                duration_s=args.duration_s,
                hooks=engine,
                reset_cache=not args.no_reset,
                on_done=progress.on_done,
            )
        finally:
            await progress.stop()
        summary = level_summary(
            level,
            prompts,
            spec,
            args.output_tokens,
            args.server_max_running,
            extra={"url": args.url, "cpus": plan.as_dict()},
            cpus=plan,
        )
        write_cell(Path(args.out) / f"c{c}", level.records, summary, record=MeasuredLevel)
        m, v = summary["metrics"], judged(summary, level.records, gates, slos)["validity"]
        tok_s = m.get("output_tok_s_steady")
        ttft = (m.get("ttft_ms") or {}).get("p50")
        print(
            f"c={c:<4} requests={n:<5} tok/s(steady)={_fmt(tok_s)} ttft_p50_ms={_fmt(ttft)} "
            f"tpot_p50_ms={_fmt((m.get('tpot_ms') or {}).get('p50'))} "
            f"valid={v['valid']}" + ("" if v["valid"] else f" ({'; '.join(v['reasons'])})"),
            flush=True,
        )
        all_valid &= v["valid"]
    print(f"wrote {args.out}/c<C>/requests.parquet and summary.json", flush=True)
    return 0 if all_valid else 1


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"
