"""Build a tiny random-weight Llama and its tokenizer, locally and deterministically (no downloads).

Real engines (vLLM's CPU build) need a model directory in Hugging Face format. None can be downloaded on the
machines this project runs on, so this script makes one: a BPE tokenizer trained on generated text and a
2-layer Llama with random weights. Its outputs are nonsense, but a server running it does real continuous
batching and real speculative decoding (vLLM's `ngram` method accepts drafts when the greedy output repeats
itself, which a random model at temperature 0 soon does).

Runs with the variant environment's python, which has torch, transformers and tokenizers but not specsweep's
own dependencies:

    python -m specsweep tiny-model --out DIR [--seed 0] [--hidden-size 128] [--layers 2] [--vocab-size 2000]

(`specsweep build-model` runs that with the variant's interpreter and specsweep's folder on PYTHONPATH; the
command's package imports only the standard library). It imports nothing else from specsweep.
The model is written to a temporary sibling folder and renamed into place, so DIR is complete or absent;
DIR/specsweep_tiny_model.json records the parameters used.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import string
import tempfile
from pathlib import Path

MARKER = "specsweep_tiny_model.json"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


# A plain chat template (role, colon, content per line; the BOS the post-processor would add to a completion
# prompt, since chat prompts are tokenized without special tokens): vLLM's /v1/chat/completions and a client
# applying it for SGLang's /generate need one, and transformers has no default any more.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _words(rng: random.Random, n: int) -> list[str]:
    """n distinct pronounceable pseudo-words."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        syll = rng.randint(1, 3)
        w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syll))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated training text for the tokenizer: pseudo-words, digits and punctuation."""
    rng = random.Random(seed)
    vocab = _words(rng, 600) + [str(i) for i in range(100)]
    text = []
    for _ in range(lines):
        n = rng.randint(5, 20)
        sent = " ".join(rng.choice(vocab) for _ in range(n))
        text.append(sent.capitalize() + rng.choice([".", "!", "?", ","]))
    text.append(string.printable.strip())
    return text


def build_tokenizer(seed: int, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        # the alphabet is the corpus's characters (all printable ASCII): no lone-byte tokens, so every token
        # decodes to text on its own and streamed chunks never hold back partial UTF-8 sequences
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE  # saved in tokenizer_config.json: engines apply it to chat requests
    return fast


def build(
    out: Path,
    seed: int = 0,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate_size: int = 256,
    vocab_size: int = 2000,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.02,
) -> Path:
    """Write the model and tokenizer to `out` (atomically) and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    params = {
        "seed": seed,
        "hidden_size": hidden_size,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate_size": intermediate_size,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": initializer_range,
    }
    tokenizer = build_tokenizer(seed, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"builder": "tiny-llama", "params": params}, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
