"""`specsweep bench`: measure a running server at several concurrency levels (`specsweep.measure.bench`)."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import fields

from specsweep.client.backends import BACKENDS, ENDPOINTS, TRANSPORTS
from specsweep.client.datasets import CHAT_MODES, FORMATS
from specsweep.config import defaults
from specsweep.engines import ENGINES
from specsweep.measure.bench import BenchOptions, bench


def _ints(text: str) -> list[int]:
    vals = [int(x) for x in text.split(",") if x.strip()]
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    w, r, g = defaults("workload"), defaults("workload", "requests"), defaults("gates")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--engine", choices=ENGINES, default=None, help="cache reset and counters (default: by backend)")
    p.add_argument("--backend", choices=BACKENDS, default="sglang", help="sglang: native /generate; openai: /v1")
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="completions",
        help="text or chat messages (with --backend sglang the chat template of --tokenizer's model is applied here)",
    )
    p.add_argument("--model", default=None, help="openai 'model' field (default: omitted)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 5], help="levels, comma-separated (default 1,2,5)")
    p.add_argument("--requests-per-concurrency", type=float, default=r["per_concurrency"], help="turnovers per slot")
    p.add_argument("--requests-floor", type=int, default=r["floor"])
    p.add_argument("--requests-max", type=int, default=r["max"], help="cap on measured requests per level")
    p.add_argument("--duration-s", type=float, default=r["duration_s"], help="measure by time (count = cap)")
    p.add_argument("--no-stagger", action="store_true", help="start every slot with a full-length request")
    p.add_argument("--input-tokens", type=int, default=w["input_tokens"])
    p.add_argument("--output-tokens", type=int, default=w["output_tokens"])
    p.add_argument("--warmup", type=int, default=w["warmup_requests"], help="warm-up requests per level")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=w["seed"])
    p.add_argument("--temperature", type=float, default=w["temperature"])
    p.add_argument(
        "--dataset", "--prompts-file", dest="dataset", default=None, help="a workload file (default: synthetic words)"
    )
    p.add_argument("--dataset-format", choices=FORMATS, default="prompts-jsonl", help="the file's format")
    p.add_argument("--dataset-chat", choices=CHAT_MODES, default=None, help="sharegpt: first_turn or history")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json (or its folder) when the server has no /tokenize; the model folder whose chat template "
        "--backend sglang --endpoint chat applies",
    )
    p.add_argument("--api-key-env", default=None, help="name of an environment variable holding the API key")
    p.add_argument("--request-timeout-s", type=float, default=w["request_timeout_s"])
    p.add_argument("--no-reset", action="store_true", help="do not reset the server's prefix cache per repeat")
    p.add_argument("--client-cpus", default="auto", help="CPUs of this client: auto (the last one), none, or e.g. 3")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    for key, value in g.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=float, default=value, help=f"validity gate (default {value})")
    p.add_argument("--server-max-running", type=int, default=None, help="server's running-request cap, if known")
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="fast",
        help="fast: lean raw-asyncio client (default); aiohttp",
    )
    p.add_argument("--out", default="results/bench", help="output folder (default results/bench)")


def options(args: argparse.Namespace) -> BenchOptions:
    """The parsed arguments as the library's options (the gates: one option each)."""
    names = [f.name for f in fields(BenchOptions) if f.name != "gates"]
    gates = {key: getattr(args, key) for key in defaults("gates")}
    return BenchOptions(**{n: getattr(args, n) for n in names}, gates=gates)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every level is valid, 1 when some level is invalid, 2 on usage errors."""
    return asyncio.run(bench(options(args)))
