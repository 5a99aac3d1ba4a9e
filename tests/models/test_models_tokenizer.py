"""The torch-free GGUF tokenizer equals transformers' GGUF conversion (which imports torch) token for token."""

import os
import subprocess
import sys

import pytest

from jaxgrpo.models import registry
from jaxgrpo.models.tokenizer import _bytes_to_unicode, _merges_from_vocabulary, load_tokenizer

CORPUS = [
    "What is 7+8? The answer is 15.",
    "12345678901234567890 3.14159 -42 1,000,000 0.5e-3",
    "Hello  world   with    runs     of spaces",
    "   leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "  \n  \t  x",
    " ",
    "",
    "café naïve façade ünïcödé Ελληνικά العربية",
    "日本語のテキスト, 中文, 한국어",
    "emoji 🤖🎉👩‍👩‍👧 and symbols ∑∫√≈ ©®™",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<bos><eos><start_of_turn>model\nHi<end_of_turn>",
    "code: def f(x):\n    return x ** 2  # squared",
    "a" * 60,
    "don't won't it's we'll I'm THEY'RE",
]

MESSAGES = [
    [{"role": "user", "content": "What is 2+3? Finish your reply with 'The answer is N.'"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ünïcödé  and 42"},
     {"role": "assistant", "content": "The answer is 42."}, {"role": "user", "content": "again?"}],
]


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def tokenizer_pair(request):
    """(ours, transformers') tokenizers of one embedded GGUF."""
    pytest.importorskip("torch", reason="transformers' GGUF reader, the reference, needs torch (the test extra)")
    from transformers import PreTrainedTokenizerFast

    path = registry.resolve(request.param)
    reference = PreTrainedTokenizerFast.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return load_tokenizer(path), reference


def test_ids_equal_transformers_gguf_conversion(tokenizer_pair):
    ours, reference = tokenizer_pair
    assert len(ours) == len(reference)
    for text in CORPUS:
        for special in (True, False):
            assert ours(text, add_special_tokens=special).input_ids == reference(text, add_special_tokens=special).input_ids, text


def test_decoding_and_special_tokens_equal_transformers(tokenizer_pair):
    ours, reference = tokenizer_pair
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(reference, name), name
    assert ours.all_special_tokens == reference.all_special_tokens
    for text in CORPUS:
        ids = reference(text).input_ids
        assert ours.decode(ids) == reference.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True), text


def test_chat_template_renders_and_tokenizes_as_transformers(tokenizer_pair):
    ours, reference = tokenizer_pair
    assert ours.chat_template == reference.chat_template
    if reference.chat_template is None:  # Gemma 3 270M is a base model: its file has no template
        return
    for messages in MESSAGES:
        text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours(text, add_special_tokens=False).input_ids == reference(text, add_special_tokens=False).input_ids


def test_tokenizer_loads_without_torch():
    """The core install has no torch: loading SmolLM2's tokenizer must not import it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "from jaxgrpo.models import registry\n"
        "from jaxgrpo.models.tokenizer import load_tokenizer\n"
        "t = load_tokenizer(registry.resolve('smollm2-135m-instruct'))\n"
        "print(t('The answer is 5.').input_ids)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[504, 2988, 314, 216, 37, 30]"


def test_merges_from_vocabulary_rank_then_longest_left():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    vocab = {t: i for i, t in enumerate(tokens)}
    # "ab" and "bc" rank before "abc" (file order); "abc" splits as ab+c before a+bc.
    assert _merges_from_vocabulary(vocab, tokens, [-i for i in range(6)]) == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
    # With scores, the best score merges first.
    assert _merges_from_vocabulary(vocab, tokens, [0, 0, 0, -5, -1, -3])[0] == ("b", "c")


def test_byte_spelling_is_a_bijection_onto_printable_characters():
    spelling = _bytes_to_unicode()
    assert len(spelling) == 256 and len(set(spelling.values())) == 256
    assert spelling[ord("A")] == "A" and spelling[ord(" ")] == "\u0120"  # GPT-2's "Ġ"
    assert all(ch.isprintable() for ch in spelling.values())


def test_unsupported_gguf_tokenizer_is_named():
    from jaxgrpo.models.tokenizer import tokenizer_from_gguf_metadata

    with pytest.raises(ValueError, match="tokenizer.ggml.model='bert' is not supported"):
        tokenizer_from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}, "x.gguf")
    with pytest.raises(ValueError, match="has no tokenizer vocabulary"):
        tokenizer_from_gguf_metadata({"tokenizer.ggml.model": "gpt2"}, "x.gguf")
