"""Remat policies (`jaxgrpo.models.remat`): every policy gives the gradients of no remat; each keeps the activations
it names (the flash kernels' output and log-sum-exp for the attention), and the config chooses one."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import config as config_lib
from jaxgrpo.models import Decoder, DecoderConfig, memory_forms, remat
from jaxgrpo.models import attention as attention_implementations
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.layers import Block, rope_inverse_frequencies, rope_tables

GEMMA = DecoderConfig(family="gemma3", vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, sliding_window=3,
                      layer_types=("sliding_attention", "full_attention"), tie_word_embeddings=True)
QWEN2 = DecoderConfig(family="qwen2", vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, tie_word_embeddings=False)


def _loss_and_gradients(config, tokens, mask=None, **decoder_kwargs):
    """(jitted params -> (loss, gradients), params) of a decoder built with `decoder_kwargs`: the log-probs and
    entropies of `tokens`' next tokens, summed over `mask` (every token by default)."""
    graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0), **decoder_kwargs))
    mask = jnp.ones(tokens.shape, bool) if mask is None else mask

    def loss(p):
        logprobs, entropy = nnx.merge(graphdef, p).token_logprobs(tokens, jnp.roll(tokens, -1, 1), attention_mask=mask)
        return jnp.sum(jnp.where(mask, logprobs + 0.1 * entropy, 0.0))

    return jax.jit(jax.value_and_grad(loss)), params


@pytest.mark.parametrize("config, attention", [(GEMMA, "pallas_gpu"), (QWEN2, "xla")],
                         ids=["gemma3-triton", "qwen2-xla"])
def test_every_policy_gives_the_gradients_of_no_remat(config, attention):
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, config.vocab_size)
    mask = jnp.arange(12)[None] < jnp.array([[12], [9]])  # a padded row

    def gradients(policy):
        step, params = _loss_and_gradients(config, tokens, mask, remat=policy, attention=attention)
        return step(params)[1]

    plain = jax.tree.leaves(gradients(False))
    for policy in (True, *(name for name in remat.POLICIES if name != "full")):  # True: "full"
        for want, got in zip(plain, jax.tree.leaves(gradients(policy))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5, err_msg=str(policy))


def _kept(attention: str, policy: str, capsys) -> list[tuple[str, str]]:
    """(shape, name) of each named activation one Qwen3 block keeps under `policy` with `attention`."""
    config = DecoderConfig(family="qwen3", vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=1,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True)
    block = Block(config, (), dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 8, 32))
    positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
    cos, sin = rope_tables(positions, rope_inverse_frequencies(config.rope, config.head_dim))
    implementation = attention_implementations.get(attention)
    masks = implementation.prepare(AttentionLayout.padded(jnp.ones((2, 8), bool)), positions, None)
    attend = functools.partial(implementation.attend, masks=masks, sliding=False, window=None,
                               scale=config.attention_scale)
    graphdef, params = nnx.split(block)

    def layer(params, x):
        return nnx.merge(graphdef, params)(x, cos, sin, attend, memory_forms.PLAIN)[0].sum()

    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(remat.checkpointed(layer, policy), params, x)
    return re.findall(r"^(\S+) named '(\w+)'", capsys.readouterr().out, re.MULTILINE)


@pytest.mark.parametrize("attention", ["xla", "pallas_gpu"])
def test_each_policy_keeps_the_activations_it_names(attention, capsys):
    assert _kept(attention, "full", capsys) == []
    for policy, names in remat.POLICIES.items():
        kept = _kept(attention, policy, capsys)
        assert {name for _, name in kept} == set(names), policy
        # q, k and v; the gate and up projections
        assert sum(name == remat.QKV for _, name in kept) == (3 if names else 0)
        assert sum(name == remat.MLP_HIDDEN for _, name in kept) == (2 if remat.MLP_HIDDEN in names else 0)
        attention_kept = [shape for shape, name in kept if name == remat.ATTENTION]
        if names and attention == "pallas_gpu":
            # the flash kernels' residuals, the output [B, slots, heads, D] (8 slots padded to a block of 64) and
            # its log-sum-exp [B, slots, heads] in float32, so the backward runs the dq and dk/dv kernels without
            # the forward's; and the output
            assert attention_kept == ["f32[2,64,4,16]", "f32[2,64,4]", "f32[2,8,2,2,16]"], attention_kept
        elif names:
            assert attention_kept == ["f32[2,8,2,2,16]"]  # the output; the probabilities are recomputed


def test_the_config_chooses_a_policy_the_decoder_knows():
    assert config_lib.REMAT_POLICIES == tuple(remat.POLICIES)
    cfg = config_lib.Config()
    assert cfg.remat and cfg.remat_policy == "full" and cfg.decoder_remat == "full"
    assert dataclasses.replace(cfg, remat=False, remat_policy="save_projections").decoder_remat is False
    with pytest.raises(config_lib.ConfigError, match="remat_policy must be one of full, save_attention, "
                                                     "save_projections, got 'dots'"):
        config_lib.validate(dataclasses.replace(cfg, remat_policy="dots"))
    with pytest.raises(ValueError, match="unknown remat policy 'dots'"):
        Decoder(GEMMA, remat="dots", rngs=nnx.Rngs(0))
    from jaxgrpo.train.state import build_model

    model, _ = build_model(dataclasses.replace(cfg, model="toy-tiny", remat_policy="save_attention", scan_layers=False))
    assert model.remat == "save_attention" and model.scan_layers is False




def test_layers_one_after_another_give_the_scans_values_and_gradients():
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, GEMMA.vocab_size)
    for remat_setting in (False, True, "save_projections"):
        results = []
        for scan_layers in (True, False):
            step, params = _loss_and_gradients(GEMMA, tokens, remat=remat_setting, scan_layers=scan_layers)
            results.append(step(params))
        (scanned, scanned_grads), (unrolled, unrolled_grads) = results
        np.testing.assert_allclose(float(unrolled), float(scanned), rtol=1e-6)
        for want, got in zip(jax.tree.leaves(scanned_grads), jax.tree.leaves(unrolled_grads)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5,
                                       err_msg=str(remat_setting))


def test_layers_one_after_another_still_recompute_what_their_policy_does_not_keep():
    """Unscanned, each layer's recomputation is the forward's own operations on the same inputs; without barriers
    XLA merges the two and the remat is gone. The compiled backward has the recomputed products."""
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, QWEN2.vocab_size)

    def products(remat_setting):
        step, params = _loss_and_gradients(QWEN2, tokens, remat=remat_setting, scan_layers=False)
        # XLA:CPU's dots, or a oneDNN matmul where a build rewrites them into one
        return len(re.findall(r'\bdot\(|custom_call_target="__onednn\$matmul', step.lower(params).compile().as_text()))

    kept = products(False)
    # Per layer (2): the products whose results the backward reads, recomputed. "full": q, k, v, o, gate and up
    # (the down projection's result only feeds the residual, which no derivative reads) and the XLA attention's
    # scores and output; "save_attention": gate, up and the scores (the probabilities are never kept);
    # "save_projections": the scores.
    assert products("full") == kept + 2 * 8
    assert products("save_attention") == kept + 2 * 3
    assert products("save_projections") == kept + 2 * 1
