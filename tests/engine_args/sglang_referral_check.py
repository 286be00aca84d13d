"""Check the referral's /generate request and its reading of the answer with SGLang's own code (the pinned
release): runs inside the parser environment, `<env python> sglang_referral_check.py < request.json`.

SGLang's io_struct and tokenizer_manager import its multimodal configs, which need torchvision at import time
(not in the parser environment), so their source is read instead of imported: `GenerateReqInput`'s fields and
`SamplingParams`' fields from their class definitions, and TokenizerManager's two detokenizing
methods compiled from their own source and called.

Input (stdin): {"payload": the replay's body specsweep sends (client/referral.py), "token_values" and
"token_ids" of the generated tokens, "values": [[logprob, ...]] and "ids": [[token id, ...]] of each position's
top candidates}. Output (stdout, one JSON object): the body's fields SGLang's `GenerateReqInput` does not have,
the sampling parameters `SamplingParams` does not take, and `output_token_logprobs` and `output_top_logprobs` as
TokenizerManager builds meta_info's entries from those values (`detokenize_logprob_tokens`,
`detokenize_top_logprobs_tokens`, each id decoded by a stand-in tokenizer to "<id>"), which specsweep parses.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any, List, Optional  # noqa: F401, UP035 - the names SGLang's methods are annotated with


class _Tokenizer:
    """Decodes each id to "<id>" (the detokenizer wraps each id in its own list)."""

    def batch_decode(self, ids: list[list[int]], **kwargs: object) -> list[str]:
        return [f"<{i[0]}>" for i in ids]

    def decode(self, ids: list[int] | int, **kwargs: object) -> str:
        return f"<{ids if isinstance(ids, int) else ids[0]}>"


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def main() -> int:
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    given = json.load(sys.stdin)
    req = _class(root / "srt" / "managers" / "io_struct.py", "GenerateReqInput")
    fields = {n.target.id for n in req.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    sp = _class(root / "srt" / "sampling" / "sampling_params.py", "SamplingParams")
    params = {n.target.id for n in sp.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for init in (n for n in sp.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):  # a plain class
        params |= {a.arg for a in init.args.args + init.args.kwonlyargs} - {"self"}
    manager = _class(root / "srt" / "managers" / "tokenizer_manager.py", "TokenizerManager")
    wanted = ("detokenize_logprob_tokens", "detokenize_top_logprobs_tokens")
    defs = [n for n in manager.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    namespace: dict[str, Any] = {"List": List, "Any": Any, "Optional": Optional}  # noqa: UP006
    exec(compile(ast.Module(body=defs, type_ignores=[]), "tokenizer_manager.py", "exec"), namespace)  # noqa: S102
    fake = types.SimpleNamespace(tokenizer=_Tokenizer())
    fake.detokenize_logprob_tokens = lambda v, i, text: namespace["detokenize_logprob_tokens"](fake, v, i, text)
    top = namespace["detokenize_top_logprobs_tokens"](fake, given["values"], given["ids"], True)
    tokens = namespace["detokenize_logprob_tokens"](fake, given["token_values"], given["token_ids"], True)
    out = {
        "unknown": sorted(set(given["payload"]) - fields),
        "unknown_sampling": sorted(set(given["payload"].get("sampling_params") or {}) - params),
        "output_token_logprobs": tokens,
        "output_top_logprobs": top,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
