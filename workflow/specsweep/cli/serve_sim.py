"""`specsweep serve-sim`: run the simulated engine server (`specsweep.sim.server`)."""

from __future__ import annotations

import argparse
import asyncio

from specsweep.sim.engine import parse_schedule
from specsweep.sim.faults import FaultConfig
from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer, serve


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("fault injection")
    g.add_argument(
        "--fault-crash-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="exit the whole process abruptly after N tokens emitted in total",
    )
    g.add_argument(
        "--fault-http-error-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="answer this fraction of generation requests with HTTP 500 (seeded)",
    )
    g.add_argument(
        "--fault-stall-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, stop all streams once for --fault-stall-s seconds",
    )
    g.add_argument("--fault-stall-s", type=float, default=0.0, metavar="S")
    g.add_argument(
        "--fault-malformed-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, write one garbage non-JSON data: line on one stream",
    )
    g.add_argument(
        "--fault-truncate-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, close one stream without finishing or [DONE]",
    )
    g.add_argument(
        "--fault-slow-start-s",
        type=float,
        default=0.0,
        metavar="S",
        help="health endpoints answer 503 for S seconds after start",
    )
    g.add_argument(
        "--fault-corrupt-output-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="replace one output word for this share of prompts (a broken draft path: faster, different text)",
    )
    g.add_argument(
        "--fault-near-tie-output-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="take the second word at the first near-tie for this share of prompts (other batch numerics)",
    )


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    if not 0.0 <= args.fault_http_error_fraction <= 1.0:
        raise SystemExit("--fault-http-error-fraction must be in [0, 1]")
    if not 0.0 <= args.fault_corrupt_output_fraction <= 1.0:
        raise SystemExit("--fault-corrupt-output-fraction must be in [0, 1]")
    if not 0.0 <= args.fault_near_tie_output_fraction <= 1.0:
        raise SystemExit("--fault-near-tie-output-fraction must be in [0, 1]")
    return FaultConfig(
        crash_after_tokens=args.fault_crash_after_tokens,
        http_error_fraction=args.fault_http_error_fraction,
        stall_after_tokens=args.fault_stall_after_tokens,
        stall_s=args.fault_stall_s,
        malformed_after_tokens=args.fault_malformed_after_tokens,
        truncate_after_tokens=args.fault_truncate_after_tokens,
        slow_start_s=args.fault_slow_start_s,
        corrupt_output_fraction=args.fault_corrupt_output_fraction,
        near_tie_output_fraction=args.fault_near_tie_output_fraction,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on start)")
    parser.add_argument("--profile", default="demo", help="packaged profile name or YAML path")
    parser.add_argument("--speculative", action="store_true", help="run the EAGLE-3-like speculative arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument(
        "--debug-timestamps",
        action="store_true",
        help="add sim_sent_at (time.monotonic() just before the write) to every streamed chunk",
    )
    parser.add_argument("--api-key", default=None, help="require this key as 'Authorization: Bearer' (like SGLang)")
    parser.add_argument(
        "--draft-tokens",
        type=int,
        default=None,
        metavar="K",
        help="with --speculative: draft tokens per step (default: the profile's speculative.draft_tokens)",
    )
    parser.add_argument(
        "--spec-schedule",
        default=None,
        metavar="JSON",
        help="with --speculative: draft tokens per number of running requests, vLLM's "
        "num_speculative_tokens_per_batch_size, e.g. '[[1, 15, 3], [16, 1024, 0]]' (0: drafting off)",
    )
    parser.add_argument(
        "--draws-by-request",
        action="store_true",
        help="key every request's acceptance draws by its request id, as the virtual-time model replays them "
        "(default: a greedy request's by its prompt, so servers sent the same prompts accept the same drafts)",
    )
    add_fault_arguments(parser)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.draft_tokens is not None:
        if not args.speculative or args.draft_tokens < 1:
            raise SystemExit("--draft-tokens needs --speculative and K >= 1")
        profile = profile.with_params({"speculative.draft_tokens": args.draft_tokens})
    schedule = None
    if args.spec_schedule is not None:
        if not args.speculative:
            raise SystemExit("--spec-schedule needs --speculative")
        try:
            schedule = parse_schedule(args.spec_schedule)
        except ValueError as e:
            raise SystemExit(f"--spec-schedule: {e}") from None
    server = SimServer(
        profile,
        speculative=args.speculative,
        seed=args.seed,
        max_running_requests=args.max_running_requests,
        debug_timestamps=args.debug_timestamps,
        faults=faults_from_args(args),
        api_key=args.api_key,
        schedule=schedule,
        draws_by_prompt=not args.draws_by_request,
    )
    asyncio.run(serve(server, args.host, args.port))
    return 0
