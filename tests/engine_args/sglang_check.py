"""Check SGLang command lines with SGLang's own argument parser. Runs inside the parser environment
(tests/engine_args/sglang-args.txt), not the project's: `<env python> sglang_check.py < commands.json`.

Input (stdin): {"commands": {name: {"argv": [flags after `-m sglang.launch_server`]}}}. Output (stdout, one JSON
object): {"version": sglang's, "results": {name: {"errors": [...], "deprecated": [...], "fields": {...}}}}.

What counts, all read from SGLang itself:
- errors: what SGLang's parser refuses (unknown or misspelled flag, bad value, missing required flag), what
  `ServerArgs.from_cli_args` refuses, and for `--speculative-adaptive`: SGLang's own reason to turn adaptive
  speculation off (`adaptive_unsupported_reason`), its reading of the adaptive config file
  (`resolve_candidate_steps_from_config`), and its rule that `--speculative-num-steps` is a candidate step.
- deprecated: a flag whose argparse action is one of SGLang's Deprecated* actions, whose help text starts by
  saying it is deprecated or removed, or that makes SGLang log a deprecation (while parsing, and in its
  `handle_deprecated_args`, which rewrites such fields, e.g. --enable-flashinfer-allreduce-fusion).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import importlib.machinery
import json
import logging
import re
import sys
import types
from typing import Any

# Imported by sglang.srt.utils.common at import time, used by kernels and image decoding only: no wheel of
# torchvision imports beside torch 2.13.0+cpu, and triton is ~1 GB. Stood in by inert modules whose every
# attribute is a placeholder (a decorator returns the function it decorates); the parser never calls them.
STOOD_IN = ("torchvision", "triton")


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Placeholder(self._name + "()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __getitem__(self, key: Any) -> Any:
        return _Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return sys.modules.get(f"{self.__name__}.{name}") or _Placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in STOOD_IN:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Refused(Exception):
    """argparse's error(), raised instead of exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # type: ignore[override]
        raise _Refused(message)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))


DEPRECATED_HELP = re.compile(r"^\W*(deprecated|removed)\b", re.IGNORECASE)
DEPRECATED_LOG = re.compile(r"deprecated|removed", re.IGNORECASE)


def used_actions(parser: argparse.ArgumentParser, argv: list[str]) -> list[tuple[str, argparse.Action]]:
    out = []
    for a in argv:
        flag = a.split("=", 1)[0]
        action = parser._option_string_actions.get(flag)
        if action is not None:
            out.append((flag, action))
    return out


def check(argv: list[str], ServerArgs: Any, handle_deprecated_args: Any, adaptive: Any) -> dict[str, Any]:
    errors: list[str] = []
    deprecated: list[str] = []
    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        parser = _Parser(prog="sglang.launch_server", add_help=False)
        ServerArgs.add_cli_args(parser)
        for a in argv:
            flag = a.split("=", 1)[0]
            if flag.startswith("--") and flag not in parser._option_string_actions:
                # argparse takes an unambiguous prefix: today's abbreviation, tomorrow's error
                errors.append(f"{flag} is not an SGLang flag (an abbreviation or a typo): spell the flag out")
        for flag, action in used_actions(parser, argv):
            if type(action).__name__.startswith("Deprecated"):
                deprecated.append(f"{flag}: SGLang's {type(action).__name__} (help: {action.help})")
            elif action.help and DEPRECATED_HELP.search(str(action.help)):
                deprecated.append(f"{flag}: its help says {action.help!r}")
        try:
            ns = parser.parse_args(argv)
        except _Refused as e:
            return {"errors": [*errors, f"SGLang's parser refuses it: {e}"], "deprecated": deprecated, "fields": {}}
        try:
            sa = ServerArgs.from_cli_args(ns)
        except Exception as e:  # SGLang's own check of the values
            errors.append(f"ServerArgs.from_cli_args: {type(e).__name__}: {e}")
            return {"errors": errors, "deprecated": deprecated, "fields": {}}
        handle_deprecated_args(sa)  # SGLang's rewriting of deprecated fields, logging each
        rewritten = {k: v for _, d in getattr(sa, "_resolved_overrides", []) for k, v in d.items()}
        if sa.speculative_adaptive:
            unsupported, candidate_steps = adaptive
            reason = unsupported(sa)
            if reason is not None:
                errors.append(f"SGLang would turn --speculative-adaptive off: {reason}")
            try:
                steps = candidate_steps(cfg_path=sa.speculative_adaptive_config)
            except Exception as e:
                errors.append(f"adaptive config {sa.speculative_adaptive_config}: {type(e).__name__}: {e}")
            else:
                if sa.speculative_num_steps is not None and sa.speculative_num_steps not in steps:
                    errors.append(
                        f"--speculative-num-steps={sa.speculative_num_steps} is not in the adaptive config's "
                        f"candidate_steps {steps} (SGLang refuses to start)"
                    )
        fields = {
            k: getattr(sa, k, None)
            for k in (
                "speculative_algorithm",
                "speculative_num_steps",
                "speculative_eagle_topk",
                "speculative_num_draft_tokens",
                "speculative_adaptive",
                "speculative_adaptive_config",
                "flashinfer_allreduce_fusion_backend",
                "enable_flashinfer_allreduce_fusion",
                "max_running_requests",
                "tp_size",
                "cuda_graph_max_bs_decode",
            )
        }
        fields.update({f"resolved.{k}": v for k, v in rewritten.items() if k in fields})
    finally:
        root.removeHandler(records)
    for m in records.messages:
        if DEPRECATED_LOG.search(m):
            deprecated.append(f"SGLang logged: {m}")
    return {"errors": errors, "deprecated": list(dict.fromkeys(deprecated)), "fields": fields}


def main() -> int:
    sys.meta_path.insert(0, _Finder())
    logging.disable(logging.NOTSET)
    import sglang
    from sglang.srt.arg_groups.serving_hook import handle_deprecated_args
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.adaptive_spec_params import (
        adaptive_unsupported_reason,
        resolve_candidate_steps_from_config,
    )

    request = json.load(sys.stdin)
    adaptive = (adaptive_unsupported_reason, resolve_candidate_steps_from_config)
    results = {
        name: check(list(cmd["argv"]), ServerArgs, handle_deprecated_args, adaptive)
        for name, cmd in request["commands"].items()
    }
    if dataclasses.is_dataclass(ServerArgs):  # 0.5.19
        fields = sorted(f.name for f in dataclasses.fields(ServerArgs))
    else:  # a msgspec Struct since 0.5.2x
        fields = sorted(getattr(ServerArgs, "__struct_fields__", ()))
    out = {"version": sglang.__version__, "results": results, "server_args_fields": fields}
    json.dump(out, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
