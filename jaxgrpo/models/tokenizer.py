"""Tokenizers and chat templates, without torch.

A Hugging Face model directory is read by transformers' fast (Rust `tokenizers`) classes. A GGUF file
has no `tokenizer.json`: its vocabulary, merges, token types, special token ids and chat template are
metadata under llama.cpp's key names, which `jaxgrpo.models.gguf_file` reads. `tokenizer_from_gguf_metadata`
builds the `tokenizers.Tokenizer` they describe and wraps it in a `PreTrainedTokenizerFast`, so `encode`,
`batch_decode` and `apply_chat_template` work as for any Hugging Face tokenizer. The token ids equal
those of transformers' own GGUF conversion (tests/models/test_models_tokenizer.py), which imports torch.

Supported `tokenizer.ggml.model` values:

* `gpt2`: byte-level BPE (SmolLM2, Llama 3, Qwen2/3), split by the regex that `tokenizer.ggml.pre` names;
* `llama`: SentencePiece-style BPE with byte fallback (Llama 2 style; Gemma 3 by its architecture).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# llama.cpp's token types (gguf `TokenType`).
_CONTROL, _USER_DEFINED = 3, 4

# The pre-tokenizer splits of byte-level vocabularies, by `tokenizer.ggml.pre`: each is the regex
# the model's own tokenizer.json splits text with. Other names use GPT-2's split.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def load_tokenizer(source: str):
    """The tokenizer of a Hugging Face model directory or a `.gguf` file, or None if the directory has none."""
    if source.endswith(".gguf"):
        from jaxgrpo.models import gguf_file

        metadata, _ = gguf_file.read(source)
        return tokenizer_from_gguf_metadata(metadata, source)
    if not any(os.path.exists(os.path.join(source, name)) for name in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any], source: str = "the GGUF file"):
    """A `PreTrainedTokenizerFast` from a GGUF file's metadata (`gguf_file.read`'s, or gguf-py's field contents):
    its `tokenizer.*` keys and `general.architecture`."""
    from transformers import PreTrainedTokenizerFast

    kind = metadata.get("tokenizer.ggml.model")
    tokens = list(metadata.get("tokenizer.ggml.tokens") or ())
    if not tokens:
        raise ValueError(f"{source} has no tokenizer vocabulary (tokenizer.ggml.tokens); load a model directory instead")
    token_types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    architecture = metadata.get("general.architecture", "")
    if kind == "gpt2":
        tokenizer, tokens = _byte_level_bpe(tokens, metadata)
    elif kind == "llama":
        tokenizer, tokens = _sentencepiece_bpe(tokens, metadata, gemma=str(architecture).startswith("gemma"))
    else:
        raise ValueError(
            f"{source}: tokenizer.ggml.model={kind!r} is not supported (supported: gpt2, llama); "
            "load the model from a Hugging Face directory with tokenizer.json instead"
        )
    _add_special_tokens(tokenizer, tokens, token_types, byte_level=kind == "gpt2")

    def token(key):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(index)] if index is not None else None

    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
        add_bos_token=bool(add_bos) if add_bos is not None else kind == "llama",
        add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=metadata.get("tokenizer.chat_template"),
    )


def _byte_level_bpe(tokens: list[str], metadata: Mapping[str, Any]):
    """GPT-2's byte-level BPE; tokens written outside the byte alphabet are respelled in it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or ()]
    tokenizer = Tokenizer(models.BPE(_vocabulary(tokens), merges, fuse_unk=False, byte_fallback=False))
    split = BYTE_LEVEL_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, tokens


def _sentencepiece_bpe(tokens: list[str], metadata: Mapping[str, Any], *, gemma: bool):
    """SentencePiece-style BPE over "▁"-joined pieces with byte fallback.

    The file lists no merges; they are recovered from the vocabulary: every split of a token into two
    tokens, ranked by the token's score. Gemma's scores do not follow its merge order but the file's
    order does, and Gemma files store whitespace-only tokens with real spaces, which are respelled
    with "▁" so that the normalized text finds them.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    if gemma:
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        ranks = [-index for index in range(len(tokens))]
    else:
        ranks = list(metadata.get("tokenizer.ggml.scores") or [-index for index in range(len(tokens))])
    vocab = _vocabulary(tokens)
    merges = metadata.get("tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges] if merges else _merges_from_vocabulary(vocab, tokens, ranks)
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=tokens[int(unk)] if unk is not None else None,
                                     fuse_unk=True, byte_fallback=True))
    pieces = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # spaces become "▁" and nothing is prepended
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    else:  # "▁" is prepended to the text, and stripped again when decoding
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        pieces.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(pieces)
    return tokenizer, tokens


def _merges_from_vocabulary(vocab: dict[str, int], tokens: list[str], ranks: list[float]) -> list[tuple[str, str]]:
    """The merges a BPE vocabulary implies: (left, right) for each token split into two tokens, best rank first,
    then longest left part, then longest right part, then vocabulary order."""
    best = {}
    for token, rank in zip(tokens, ranks):
        best[token] = rank  # a respelled duplicate keeps its last rank, as the vocabulary keeps its last id
    candidates = []
    for token, rank in best.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                candidates.append((-rank, -len(left), -len(right), left, right))
    candidates.sort(key=lambda c: c[:3])  # stable: ties keep vocabulary order
    return [(left, right) for *_, left, right in candidates]


def _add_special_tokens(tokenizer, tokens: list[str], token_types: list[int], *, byte_level: bool) -> None:
    """Control tokens (e.g. `<|im_end|>`) become special added tokens and user-defined ones (e.g. `<think>`)
    plain added tokens, so the text never splits them. In a byte-level vocabulary a "control" token spelled
    outside the byte alphabet is a converter's mislabel, and is left alone."""
    from tokenizers import AddedToken

    alphabet = set(_bytes_to_unicode().values()) if byte_level else None
    control = [t for t, kind in zip(tokens, token_types) if kind == _CONTROL and (alphabet is None or set(t) <= alphabet)]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    vocab = tokenizer.get_vocab()
    user = [t for t, kind in zip(tokens, token_types) if kind == _USER_DEFINED and t in vocab]
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _vocabulary(tokens: list[str]) -> dict[str, int]:
    return {token: index for index, token in enumerate(tokens)}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values: printable Latin-1 bytes stand for themselves,
    the others for the code points from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling
