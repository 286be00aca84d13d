"""A stand-in for `python -m sglang.launch_server` in cell tests: the simulated engine behind SGLang's flags and
SGLang's /server_info shape. Put `tests/support/standin_sglang` first on the server's PYTHONPATH.

It takes the flags specsweep launches SGLang with (others are ignored) and serves the simulated engine's
SGLang-native API, with /server_info answered as SGLang 0.5.19 does: every ServerArgs field
(tests/support/sglang_server_info.json, generated from the pinned release's ServerArgs dataclass by the parser
environment and checked against it in tests/engine_args) set from the command line, and `launch_command` as
SGLang 0.5.23 reports it (the launch argv as one text, an API key in clear). $SPECSWEEP_STANDIN_INFO (JSON)
overrides fields, e.g. `{"flashinfer_allreduce_fusion_backend": null}` for a server that dropped fusion;
$STANDIN_ADMIN_VALUE is reported as admin_api_key (a key specsweep never saw). $SPECSWEEP_STANDIN_LOG is written
to the server log at start, e.g. SGLang's line for a fusion workspace that failed to set up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer, serve

PAYLOAD = Path(__file__).resolve().parents[2] / "sglang_server_info.json"


def main() -> int:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--speculative-adaptive-config", default=None)
    p.add_argument("--flashinfer-allreduce-fusion-backend", default=None)
    args, _ = p.parse_known_args()
    info: dict[str, Any] = json.loads(PAYLOAD.read_text())
    info.update({k: v for k, v in vars(args).items() if k in info})
    info["launch_command"] = " ".join(sys.argv[1:])  # as 0.5.23: nothing but a watermark config is redacted
    info["admin_api_key"] = os.environ.get("STANDIN_ADMIN_VALUE")  # SGLang's --admin-api-key, set beside specsweep
    info.update(json.loads(os.environ.get("SPECSWEEP_STANDIN_INFO") or "{}"))
    if os.environ.get("SPECSWEEP_STANDIN_LOG"):
        print(os.environ["SPECSWEEP_STANDIN_LOG"], file=sys.stderr, flush=True)
    server = SimServer(
        load_profile("demo"),
        speculative=bool(args.speculative_algorithm),
        max_running_requests=args.max_running_requests,
        api_key=args.api_key,
    )
    server.info = lambda: info  # type: ignore[method-assign]
    asyncio.run(serve(server, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
