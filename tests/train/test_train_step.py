"""The pure update on synthetic batches: its loss and gradient equal a hand-written reference loop over
rows and tokens, for two policy losses x two aggregation modes x 1, 2 and 4 micro-batches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxgrpo.config import Config, apply_overrides
from jaxgrpo.data import toy
from jaxgrpo.train import state as state_lib, step as step_lib

N, PROMPT, COMPLETION = 8, 4, 5


@pytest.fixture(scope="module")
def setup():
    model, tokenizer = toy.tiny_model(0)
    policy = state_lib.Policy(model)
    graphdef, params, rest = nnx.split(policy, nnx.Param, ...)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, tokenizer.vocab_size, (N, PROMPT + COMPLETION)).astype(np.int32)
    lengths = rng.integers(1, COMPLETION + 1, N)  # every row has a token: no empty sequence to special-case
    mask = (np.arange(COMPLETION)[None] < lengths[:, None]).astype(np.float32)
    attention = np.concatenate([np.ones((N, PROMPT), bool), mask > 0], axis=1)
    positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
    logp, _, _ = step_lib.completion_outputs(policy, tokens, attention, positions, COMPLETION, 1.0, with_values=False)
    # Old log-probs off by up to +-0.5: ratios leave PPO's clip range on both sides.
    old_logp = (np.asarray(logp) + rng.uniform(-0.5, 0.5, (N, COMPLETION))).astype(np.float32) * mask
    advantages = np.repeat(rng.normal(size=(N, 1)), COMPLETION, 1).astype(np.float32)
    zeros = np.zeros_like(mask)
    batch = step_lib.TrainBatch(tokens, attention, positions, mask, old_logp, advantages, zeros, zeros, zeros)
    return graphdef, params, rest, batch


def reference_loss(graphdef, rest, batch, loss: str, aggregation: str):
    """The loss written out row by row, token by token, from its paper's formula."""

    def fn(params):
        policy = nnx.merge(graphdef, params, rest)
        logp, _, _ = step_lib.completion_outputs(policy, batch.tokens, batch.attention_mask, batch.positions,
                                                 COMPLETION, 1.0, with_values=False)
        rows, total_tokens = [], 0.0
        for i in range(N):
            terms = []
            for t in range(COMPLETION):
                if batch.completion_mask[i, t] == 0:
                    continue
                a = batch.advantages[i, t]
                if loss == "ppo_clip":  # -min(r A, clip(r, 0.8, 1.2) A)
                    r = jnp.exp(logp[i, t] - batch.old_logp[i, t])
                    terms.append(-jnp.minimum(r * a, jnp.clip(r, 0.8, 1.2) * a))
                else:  # REINFORCE: -A log pi
                    terms.append(-a * logp[i, t])
            rows.append(sum(terms) / len(terms) if aggregation == "seq_mean_token_mean" else sum(terms))
            total_tokens += len(terms)
        return sum(rows) / (N if aggregation == "seq_mean_token_mean" else total_tokens)

    return fn


REFERENCE = {}


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("loss", ["ppo_clip", "reinforce"])
def test_update_equals_a_hand_written_loop(setup, loss, aggregation, micro_batches):
    graphdef, params, rest, batch = setup
    cfg = apply_overrides(Config(), [f"loss={loss}", f"aggregation={aggregation}", "packing=false",
                                     f"sampling.max_new_tokens={COMPLETION}", "group_size=1", f"prompts_per_step={N}"])
    mesh = state_lib.make_mesh(cfg, jax.devices()[:1])
    optimizer = optax.sgd(1.0)  # new params = params - gradient
    state = state_lib.init_state(jax.tree.map(jnp.copy, params), optimizer, mesh)
    update = step_lib.make_update_fn(cfg, graphdef, rest, optimizer, mesh, jax.tree.map(lambda x: x.sharding, state))
    micro = step_lib.TrainBatch(*(x.reshape(micro_batches, N // micro_batches, *x.shape[1:]) for x in batch[:9]))
    with jax.set_mesh(mesh):
        new_state, metrics = update(state, micro)
    if (loss, aggregation) not in REFERENCE:  # the same for every micro-batch count: computed once
        REFERENCE[loss, aggregation] = jax.jit(jax.value_and_grad(reference_loss(graphdef, rest, batch, loss, aggregation)))(params)
    want_loss, want_grad = REFERENCE[loss, aggregation]
    np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5, atol=1e-7)
    got_grad = jax.tree.map(lambda old, new: np.asarray(old) - np.asarray(new), params, new_state.params)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6), got_grad, want_grad)
    assert max(float(jnp.abs(w).max()) for w in jax.tree.leaves(want_grad)) > 1e-4  # the check compares something
