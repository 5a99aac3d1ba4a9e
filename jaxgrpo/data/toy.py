"""A tiny, fully offline setup: a character tokenizer, a toy task and a tiny random decoder.

Used by the end-to-end tests, the notebooks and anyone who wants to watch a
GRPO run learn in a couple of CPU minutes. The task ("toy_sum") asks for the
last digit of a sum of two digits; the answer is one character, so a tiny
model learns it quickly after a short supervised warm-up.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.data import register_task
from jaxgrpo.models import Decoder, DecoderConfig

_CHARS = "0123456789+=?. abcdefghijklmnopqrstuvwxyz:\n"


class CharTokenizer:
    """Character-level tokenizer with the small part of the Hugging Face API the trainer uses."""

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2

    def __init__(self):
        self._offset = 3
        self._index = {c: i + self._offset for i, c in enumerate(_CHARS)}
        self.vocab_size = self._offset + len(_CHARS)
        self.eos_token = "<eos>"

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {"<pad>": 0, "<bos>": 1, self.eos_token: 2, **self._index}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        unknown = sorted(set(text) - set(self._index))
        if unknown:
            raise ValueError(f"CharTokenizer cannot encode characters {unknown}; it knows {_CHARS!r}")
        ids = [self._index[c] for c in text]
        return [self.bos_token_id] + ids if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < self._offset:
                if not skip_special_tokens:
                    out.append(["<pad>", "<bos>", "<eos>"][i])
                continue
            out.append(_CHARS[i - self._offset])
        return "".join(out)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    #: `apply_chat_template` below, as the Jinja template of the exported Hugging Face tokenizer.
    CHAT_TEMPLATE = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}="

    def to_hf_tokenizer(self):
        """The same tokenizer as a transformers `PreTrainedTokenizerFast` (for `jaxgrpo.tools.export`): one token per
        character (a BPE vocabulary without merges), the same ids, special tokens and chat template."""
        from tokenizers import Tokenizer, decoders, models
        from transformers import PreTrainedTokenizerFast

        backend = Tokenizer(models.BPE(vocab=self.get_vocab(), merges=[]))
        backend.decoder = decoders.Fuse()  # characters join without spaces
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                       eos_token=self.eos_token, chat_template=self.CHAT_TEMPLATE)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False, **_):
        """The user turns' text followed by '=' (the toy 'chat template')."""
        text = "".join(m["content"] for m in messages if m["role"] == "user") + "="
        return self.encode(text) if tokenize else text


@dataclasses.dataclass
class ToySumTask:
    """'a+b=' -> the last digit of a+b, with a, b in [0, max_operand]. Seeded, exact, any size."""

    seed: int = 0
    max_operand: int = 9
    name: str = "toy_sum"

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> list[dict]:
        if split not in ("train", "test"):
            raise ValueError(f"toy_sum has splits 'train' and 'test', got {split!r}")
        rng = np.random.default_rng([self.seed, 0 if split == "train" else 1])
        n = num_examples or 512
        if not 0 <= self.max_operand <= 9:
            raise ValueError(f"max_operand must be a digit in [0, 9], got {self.max_operand}")
        a, b = rng.integers(0, self.max_operand + 1, n), rng.integers(0, self.max_operand + 1, n)
        return [{"question": f"{x}+{y}", "answer": str((x + y) % 10)} for x, y in zip(a, b)]

    def messages(self, example: dict) -> list[dict]:
        return [{"role": "user", "content": example["question"]}]

    def default_rewards(self) -> list:
        return [(first_char_reward, 1.0)]

    def reference_completion(self, example: dict) -> str:
        return example["answer"]


def first_char_reward(completions: list[str], examples) -> np.ndarray:
    """1 if the completion starts with the example's answer, else 0."""
    return np.array([float(c[:1] == e["answer"]) for c, e in zip(completions, examples)], np.float32)


def tiny_config(vocab_size: int, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> DecoderConfig:
    """A Llama-family config small enough to train on CPU in seconds."""
    return DecoderConfig(
        family="llama",
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        tie_word_embeddings=True,
    )


def tiny_model(seed: int = 0, *, dtype=jnp.float32, remat: bool = False, **config_kwargs) -> tuple[Decoder, CharTokenizer]:
    """A randomly initialized tiny decoder and its character tokenizer."""
    tokenizer = CharTokenizer()
    model = Decoder(tiny_config(tokenizer.vocab_size, **config_kwargs), dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(seed))
    return model, tokenizer


def _toy_sum_task(config: str | None = None, **kwargs) -> ToySumTask:
    if config is not None:
        raise ValueError(f"toy_sum has no configs, got 'toy_sum/{config}'")
    return ToySumTask(**kwargs)


register_task("toy_sum", _toy_sum_task)
