"""Build a tiny random-weight Llama and a locally trained tokenizer -- nothing is downloaded.

The embedded default model of ``make serve`` and of the engine tests: 4 layers, hidden 256,
4 heads (2 KV heads, head_dim 64 -- a size the CPU attention supports), vocab 2048, a byte-level
BPE tokenizer trained on text generated here, with special tokens and a chat template. Weights
are seeded, so the same directory content comes out every time (about 7 MB, ~6 s).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_WORDS = [
    "the",
    "pool",
    "maps",
    "pages",
    "on",
    "demand",
    "and",
    "releases",
    "them",
    "when",
    "the",
    "limit",
    "falls",
    "while",
    "requests",
    "keep",
    "running",
    "a",
    "block",
    "holds",
    "every",
    "layer",
    "of",
    "keys",
    "and",
    "values",
    "for",
    "sixteen",
    "tokens",
    "memory",
    "moves",
    "between",
    "models",
    "sharing",
    "one",
    "device",
    "prefix",
    "caching",
    "reuses",
    "blocks",
    "that",
    "hold",
    "the",
    "same",
    "tokens",
    "offload",
    "tier",
    "keeps",
    "evicted",
    "blocks",
    "in",
    "host",
    "memory",
    "operator",
    "balances",
    "demand",
    "with",
    "weights",
]
_MARKER = "kvpool-tiny-model.json"


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30))) for _ in range(lines)]


def _train_tokenizer(seed: int, vocab_size: int) -> Any:
    """A byte-level BPE trained on generated text, with special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out: Path, *, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Write the model to ``out`` (created) unless a complete copy is already there. Built beside
    it and renamed into place, so servers that start together (a group pod's) never read a copy
    another is still writing; the first rename wins, the others' copies are dropped."""
    out = Path(out)
    if (out / _MARKER).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_tiny_model(tmp, seed, vocab_size)
        try:
            tmp.rename(out)
        except OSError:  # another process's copy is in place (the same bytes: same seed)
            if not (out / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_tiny_model(out: Path, seed: int, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = _train_tokenizer(seed, vocab_size)
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=0.5,  # large random weights: outputs depend on the prompt, not one token
        dtype="bfloat16",
    )
    model: Any = LlamaForCausalLM(config)  # transformers' stubs mistype nn.Module.to
    model.to(torch.bfloat16).save_pretrained(out)
    (out / _MARKER).write_text(json.dumps({"seed": seed, "vocab_size": vocab_size}) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tiny local test model (no downloads).")
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weights and corpus seed (default 0)")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out, seed=args.seed))


if __name__ == "__main__":
    main()
