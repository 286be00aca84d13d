"""`specsweep tiny-model` (internal): write a tiny random Llama model (`specsweep.stack.tiny_model`).

Run by `build-model` with the variant's interpreter (it needs torch and transformers, which the project's own
environment lacks); `specsweep.cli` imports only the standard library, so the command starts there.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from specsweep.stack.tiny_model import build

# build()'s defaults: the model's parameters are decided in specsweep.stack.tiny_model alone (modelbuild.builder_source)
_D = {k: p.default for k, p in inspect.signature(build).parameters.items() if p.default is not p.empty}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="model folder to write")
    p.add_argument("--seed", type=int, default=_D["seed"])
    p.add_argument("--hidden-size", type=int, default=_D["hidden_size"])
    p.add_argument("--layers", type=int, default=_D["layers"])
    p.add_argument("--heads", type=int, default=_D["heads"])
    p.add_argument("--kv-heads", type=int, default=_D["kv_heads"])
    p.add_argument("--intermediate-size", type=int, default=_D["intermediate_size"])
    p.add_argument("--vocab-size", type=int, default=_D["vocab_size"])
    p.add_argument("--max-position-embeddings", type=int, default=_D["max_position_embeddings"])
    p.add_argument(
        "--initializer-range",
        type=float,
        default=_D["initializer_range"],
        help="std of the random weights; at the default 0.02 the residual stream is dominated by the current "
        "token's embedding, so greedy decoding falls into short loops that ngram drafts hit "
        "(~30-50%% of tokens); "
        "at 0.5 the output hardly repeats",
    )


def run(a: argparse.Namespace) -> int:
    out = build(
        a.out,
        seed=a.seed,
        hidden_size=a.hidden_size,
        layers=a.layers,
        heads=a.heads,
        kv_heads=a.kv_heads,
        intermediate_size=a.intermediate_size,
        vocab_size=a.vocab_size,
        max_position_embeddings=a.max_position_embeddings,
        initializer_range=a.initializer_range,
    )
    print(out)
    return 0
