"""`specsweep paired-level`: one level of every fixed arm in interleaved blocks (`specsweep.measure.interleave`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specsweep.measure import budget as run_budget
from specsweep.measure.cell import CellError
from specsweep.measure.interleave import needs_rule, out_dirs, run_level
from specsweep.redact import MissingAPIKey
from specsweep.serving import servers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--specs", required=True, help="arm -> cell spec as JSON text or a file, reference arm first")
    parser.add_argument("--env", required=True, type=Path, help="the variant's fingerprint JSON (env rule)")
    parser.add_argument("--out-root", required=True, type=Path, help="the variant's results folder")
    parser.add_argument("--level", required=True, help="the level's folder name (c<C>)")
    parser.add_argument(
        "--reference-of",
        help="a policy arm measured with the best fixed arm at this level (the first of --specs), whose cell "
        "goes into the policy cell's reference/ folder",
    )
    parser.add_argument("--state-dir", required=True, type=Path, help="the experiment's server state folder")
    parser.add_argument("--server-log-dir", required=True, type=Path)
    parser.add_argument("--startup-timeout-s", type=float, help="seconds to wait for a server (default: the variant's)")


def run(args: argparse.Namespace) -> int:
    text = args.specs if args.specs.lstrip().startswith("{") else Path(args.specs).read_text()
    specs = json.loads(text)
    first = next(iter(specs.values()), {})
    started = time.monotonic()
    budget = run_budget.RunBudget.from_env()
    share = run_budget.POLICY_LEVEL_SHARE if args.reference_of else 1.0
    allowed = run_budget.allowance(budget, share) if budget is not None else None
    # under a run budget the level's rounds get its share (`LevelRule.settings_now`); an attempt at its spoiled
    # rounds starts before this deadline (its servers' start counted) or where the run has room for it
    deadline = time.time() + allowed.seconds if allowed is not None else None
    if allowed is not None:
        print(allowed.text(), file=sys.stderr)
    rule = None
    if needs_rule(first):
        # imported here: the rule's bootstrap and t quantiles import scipy (~1 s a job on 2 cores), which a level
        # with nothing to decide (no target, or min_rounds = max_rounds) does not pay
        from specsweep.analysis.precision import LevelRule, PrecisionSettings

        instances = int(first.get("pairing", {}).get("instances") or 1)
        settings = PrecisionSettings.from_config(first["precision"], instances)
        rule = LevelRule(settings, share_s=allowed.seconds if allowed is not None else None)
    try:
        out = run_level(
            specs,
            args.env,
            out_dirs(specs, args.out_root, args.level, args.reference_of),
            args.state_dir,
            args.server_log_dir,
            args.startup_timeout_s,
            rule,
            # another attempt within the job's share, or past it where the run has room for what it costs: a
            # level keeps what it measured where neither holds
            (lambda seconds: time.time() < deadline or run_budget.room_for(budget, seconds, share))
            if deadline is not None and budget is not None
            else None,
        )
    except (CellError, MissingAPIKey, servers.ServerError) as e:
        print(f"interleaved level failed: {e}", file=sys.stderr)
        return 1
    if budget is not None:
        rounds = ((next(iter(out.values())).get("pairing") or {}).get("precision") or {}).get("rounds")
        level = f"{args.out_root.name}/{args.reference_of or 'fixed'}/{args.level}"
        run_budget.record_level(budget, level, time.monotonic() - started, rounds, share)
    print(json.dumps({arm: s["cell"]["key"] for arm, s in out.items()}, indent=2))
    return 0
