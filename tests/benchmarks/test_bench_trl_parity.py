"""The GRPO loss of jaxgrpo equals TRL's `GRPOTrainer.compute_loss` on the same batch (benchmarks/grpo_step_vs_trl.py).

Runs the benchmark's own `loss_parity` on a tiny random Llama saved with transformers and loaded by
both sides, with a character-level Hugging Face tokenizer, so no weights are needed. Skipped only
when TRL (the `bench` extra) is not installed.
"""

import importlib.util
import os

import numpy as np
import pytest

from tests.support.paths import REPO_ROOT

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxgrpo.models import load  # noqa: E402
from jaxgrpo.rewards import correctness_reward  # noqa: E402
from jaxgrpo.train import Trajectories, Trainer  # noqa: E402

BENCHMARK = os.path.join(REPO_ROOT, "benchmarks", "grpo_step_vs_trl.py")
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
PROMPTS, GROUP, COMPLETION = 2, 4, 6


def load_benchmark():
    spec = importlib.util.spec_from_file_location("grpo_step_vs_trl", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def char_tokenizer():
    """A character-level fast tokenizer with a chat template (what both trainers need from a tokenizer)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                                     unk_token="<unk>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tiny_llama"))
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model, _ = load(directory)
    bench = load_benchmark()
    args = bench.parse_args(["--prompts", str(PROMPTS), "--group-size", str(GROUP), "--max-new-tokens", str(COMPLETION)])
    cfg = bench.jaxgrpo_config(PROMPTS, GROUP, COMPLETION, seed=0)
    ours = Trainer(cfg, model=model, tokenizer=tokenizer, reward_fns=[(correctness_reward, 1.0)])
    examples = [ours.prompts._dataset[i] for i in range(PROMPTS)]
    theirs = bench.trl_trainer(torch_model, tokenizer, examples, ours.task, args, str(tmp_path_factory.mktemp("trl")))
    return bench, ours, theirs, examples


def synthetic_rollout(trainer, examples) -> Trajectories:
    """Left-padded prompts, completions of different lengths, mixed 0/1 rewards, old log-probs = the policy's."""
    rng = np.random.default_rng(0)
    prompts = [trainer.prompt_ids(e) for e in examples for _ in range(GROUP)]
    width = max(map(len, prompts))
    n = len(prompts)
    prompt_tokens = np.zeros((n, width), np.int32)
    prompt_mask = np.zeros((n, width), bool)
    for i, p in enumerate(prompts):
        prompt_tokens[i, width - len(p):], prompt_mask[i, width - len(p):] = p, True
    lengths = rng.integers(2, COMPLETION + 1, n)
    mask = (np.arange(COMPLETION)[None] < lengths[:, None]).astype(np.float32)
    completion = (rng.integers(3, 3 + len(CHARS), (n, COMPLETION)) * mask).astype(np.int32)
    rewards = np.array([1, 0, 0, 1, 0, 0, 0, 1], np.float32)[:n]
    tokens = np.concatenate([prompt_tokens, completion], 1)
    attention = np.concatenate([prompt_mask, mask > 0], 1)
    positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
    logp = np.asarray(trainer._forward(trainer.state.params, tokens, attention, positions, COMPLETION)[0]) * mask
    return Trajectories(prompt_tokens, prompt_mask, completion, mask, logp.astype(np.float32), np.ones(n, bool), rewards,
                   {"correctness_reward": rewards}, rewards, np.ones(n, bool), np.ones(n, bool), np.repeat(np.arange(PROMPTS), GROUP).astype(np.int32),
                   [""] * n, [e for e in examples for _ in range(GROUP)])


def test_grpo_loss_equals_trl_compute_loss(setup):
    bench, ours, theirs, examples = setup
    result = bench.loss_parity(ours, ours.state.params, theirs, synthetic_rollout(ours, examples))
    assert result["trl_loss_type"] == "dapo" and result["jaxgrpo_aggregation"] == "token_mean"
    assert result["clip_fraction"] > 0.05, "the perturbed old log-probs must exercise the clipped branch"
    assert abs(result["jaxgrpo_loss"]) > 1e-3, "a zero loss would make the comparison vacuous"
    assert result["advantage_max_abs_diff"] <= 1e-5
    assert result["abs_diff"] <= 1e-4, result
    assert result["passed"]


def test_cross_check_detects_a_different_aggregation(setup):
    """Sequence-mean aggregation is not TRL's `dapo` normalization: the check must see the difference."""
    bench, ours, theirs, examples = setup
    ours.cfg.aggregation = "seq_mean_token_mean"
    try:
        result = bench.loss_parity(ours, ours.state.params, theirs, synthetic_rollout(ours, examples))
    finally:
        ours.cfg.aggregation = "token_mean"
    assert result["abs_diff"] > 1e-4 and not result["passed"]
