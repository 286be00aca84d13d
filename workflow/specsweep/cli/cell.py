"""`specsweep cell`: measure one cell (`specsweep.measure.cell.run_cell`) and print its headline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specsweep.config import defaults
from specsweep.measure.cell import CellError, run_cell
from specsweep.measure.summary import judged
from specsweep.redact import MissingAPIKey
from specsweep.serving import servers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="the cell as JSON text (specsweep.config.cell_spec) or a file")
    parser.add_argument("--env", required=True, type=Path, help="the variant's fingerprint JSON (env rule)")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path, help="the experiment's server state folder")
    parser.add_argument("--server-log-dir", required=True, type=Path)
    parser.add_argument(
        "--startup-timeout-s", type=float, help="seconds to wait for the server (default: the variant's)"
    )


def run(args: argparse.Namespace) -> int:
    text = args.spec if args.spec.lstrip().startswith("{") else Path(args.spec).read_text()
    spec = json.loads(text)
    try:
        records, summary = run_cell(
            spec, args.env, args.out_dir, args.state_dir, args.server_log_dir, args.startup_timeout_s
        )
    except (CellError, MissingAPIKey, servers.ServerError) as e:
        print(f"cell failed: {e}", file=sys.stderr)
        return 1
    m, v = summary["metrics"], judged(summary, records, defaults("gates"))["validity"]
    print(
        json.dumps(
            {
                "cell": summary["cell"]["key"],
                "source": summary["source"],
                "output_tok_s_steady": m.get("output_tok_s_steady"),
                "valid_under_default_gates": v["valid"],  # the analysis judges by the experiment's gates
                "reasons": v["reasons"],
                "flags": v["flags"],
            },
            indent=2,
        )
    )
    return 0
