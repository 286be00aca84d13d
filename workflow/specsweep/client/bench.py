"""`specsweep bench`: measure a running server at several concurrency levels, without Snakemake.

Writes `OUT/c<C>/requests.parquet` (one row per request) and `OUT/c<C>/summary.json` per level,
atomically, so a killed run never leaves a half-written cell that looks complete. The functions here
(`level_summary`, `write_cell`, `Progress`) are also what the pipeline's cell runner uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from pyarrow.parquet import write_table as pq_write
from tqdm import tqdm

from specsweep.aio import cancel_and_wait
from specsweep.client.backends import BACKENDS, ENDPOINTS, TRANSPORTS, RequestRecord, RequestSpec
from specsweep.client.loadgen import LevelResult, arrow_table, measure_level
from specsweep.client.prompts import PromptSet, load_prompts_file, make_prompts_auto
from specsweep.config import request_count
from specsweep.io import atomic_path
from specsweep.metrics import jsonable, summarize

SCHEMA_VERSION = 1


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


def level_summary(
    level: LevelResult,
    prompts: PromptSet,
    spec: RequestSpec,
    output_tokens: int,
    slos: dict[str, float] | None = None,
    gates: dict[str, float] | None = None,
    server_max_running: int | None = None,
    counters: tuple[dict[str, float], dict[str, float]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary.json body for one measured level (the cell runner adds `cell`, `server`, `source`...)."""
    s = summarize(
        level.records,
        level.concurrency,
        output_tokens,
        slos,
        gates,
        level.lag_samples,
        server_max_running,
        counters,
    )
    for rep_out, rep in zip(s["repeats"], level.repeats, strict=False):
        rep_out["t0_unix"] = rep.t0_unix
        rep_out["cache_flush"] = rep.flush
    if level.warmup_errors:
        s["validity"]["flags"].append(f"{level.warmup_errors} warm-up request(s) failed")
    out = {
        "schema_version": SCHEMA_VERSION,
        "concurrency": level.concurrency,
        "workload": {
            "backend": spec.backend,
            "endpoint": spec.endpoint if spec.backend == "openai" else "generate",
            "transport": spec.transport,
            "n_requests": level.n_requests,
            "output_tokens": output_tokens,
            "temperature": spec.temperature,
            "request_timeout_s": spec.request_timeout_s,
            "repeats": len(level.repeats),
            **prompts.describe(),
        },
        "metrics": s["metrics"],
        "repeats": s["repeats"],
        "validity": s["validity"],
        "t0_unix": level.t0_unix,
        **(extra or {}),
    }
    return jsonable(out)


def write_cell(out_dir: str | Path, records_df: pd.DataFrame, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write `requests.parquet`, then `summary.json` (last: its presence means the cell is complete)."""
    out = Path(out_dir)
    pq, sj = out / "requests.parquet", out / "summary.json"
    with atomic_path(pq) as tmp:
        pq_write(arrow_table(records_df), str(tmp))
    with atomic_path(sj) as tmp:
        tmp.write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return pq, sj


def _ints(text: str) -> list[int]:
    vals = [int(x) for x in text.split(",") if x.strip()]
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--backend", choices=BACKENDS, default="sglang", help="sglang: native /generate; openai: /v1")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions", help="openai backend: which endpoint")
    p.add_argument("--model", default=None, help="openai 'model' field (default: omitted)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 5], help="levels, comma-separated (default 1,2,5)")
    p.add_argument("--requests-per-concurrency", type=int, default=2, help="requests per level = max(floor, k*C)")
    p.add_argument("--requests-floor", type=int, default=8)
    p.add_argument("--requests-max", type=int, default=None, help="cap on requests per level")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests per level (not recorded)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prompts-file", default=None, help='JSONL: {"prompt": "...", "output_tokens": N?} per line')
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (or its folder) when the server has no /tokenize")
    p.add_argument("--api-key-env", default=None, help="name of an environment variable holding the API key")
    p.add_argument("--request-timeout-s", type=float, default=120.0)
    p.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache before each repeat")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    p.add_argument("--max-loop-lag-ms", type=float, default=5.0, help="loop-lag p99 validity gate")
    p.add_argument("--max-error-rate", type=float, default=0.0, help="error-rate validity gate")
    p.add_argument("--server-max-running", type=int, default=None, help="server's running-request cap, if known")
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="fast",
        help="fast: lean raw-asyncio client (default); aiohttp",
    )
    p.add_argument("--out", default="results/bench", help="output folder (default results/bench)")


async def _bench(args: argparse.Namespace) -> int:
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"environment variable {args.api_key_env} is not set", file=sys.stderr)
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
    counts = {
        c: request_count(c, args.requests_per_concurrency, args.requests_floor, args.requests_max)
        for c in args.concurrency
    }
    n_prompts = max(counts.values())
    if args.prompts_file:
        prompts = load_prompts_file(args.prompts_file, n_prompts)
    else:
        prompts = await make_prompts_auto(
            n_prompts,
            args.input_tokens,
            args.seed,
            url=args.url,
            model=args.model,
            tokenizer_path=args.tokenizer,
            headers=spec.headers() if api_key else None,
        )
    slos = {
        k: v
        for k, v in (
            ("ttft_ms", args.slo_ttft_ms),
            ("tpot_ms", args.slo_tpot_ms),
            ("e2e_ms", args.slo_e2e_ms),
        )
        if v is not None
    }
    gates = {"loop_lag_p99_ms": args.max_loop_lag_ms, "max_error_rate": args.max_error_rate}
    all_valid = True
    for c, n in counts.items():
        progress = Progress(n * args.repeats, label=f"c={c}").start()
        try:
            level = await measure_level(
                spec,
                c,
                n,
                prompts,
                args.output_tokens,
                warmup=args.warmup,
                repeats=args.repeats,
                flush=not args.no_flush,
                on_done=progress.on_done,
            )
        finally:
            await progress.stop()
        summary = level_summary(
            level,
            prompts,
            spec,
            args.output_tokens,
            slos,
            gates,
            args.server_max_running,
            extra={"url": args.url},
        )
        write_cell(Path(args.out) / f"c{c}", level.records, summary)
        m, v = summary["metrics"], summary["validity"]
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


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every level is valid, 1 when some level is invalid, 2 on usage errors."""
    return asyncio.run(_bench(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
