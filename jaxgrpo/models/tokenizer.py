"""Tokenizers and chat templates without torch: transformers' fast (Rust `tokenizers`) classes."""

from __future__ import annotations

import os

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(source: str):
    """The tokenizer of a Hugging Face model directory or a `.gguf` file, or None if the directory has none.

    For a GGUF file it is rebuilt from the file's metadata (vocabulary, merges, special tokens and
    chat template) by transformers' GGUF conversion.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if source.endswith(".gguf"):
        return PreTrainedTokenizerFast.from_pretrained(os.path.dirname(source) or ".", gguf_file=os.path.basename(source))
    if not any(os.path.exists(os.path.join(source, name)) for name in _TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(source)
