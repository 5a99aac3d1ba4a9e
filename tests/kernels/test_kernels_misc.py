"""DAPO shaping and dynamic sampling, TIS/MIS importance correction, chunked entropy, and the registry.

Golden values: METHODS.md §2 item 3 (|y| = 18432 -> -0.5; group [1,1,1,1] dropped).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.kernel_checks import assert_sharded_matches, outcome_batches, token_batches

import jaxgrpo
from jaxgrpo.kernels import registry
from jaxgrpo.kernels.credit import importance_correction
from jaxgrpo.kernels.entropy import entropy_from_logits
from jaxgrpo.kernels.reward_shaping import overlong_penalty
from jaxgrpo.kernels.selection import dynamic_sampling_filter

PROPERTY = settings(max_examples=25, deadline=None)

# ---------------------------------------------------------------- overlong penalty


def test_overlong_penalty_golden():
    # L_max = 20480, L_cache = 4096: 0 up to 16384, linear to -1 at 20480, -1 beyond.
    lengths = jnp.array([100, 16384, 16385, 18432, 20480, 30000])
    np.testing.assert_allclose(overlong_penalty(lengths), [0, 0, -1 / 4096, -0.5, -1, -1], atol=1e-7)
    np.testing.assert_allclose(
        overlong_penalty(jnp.array([6, 7, 8, 10, 11]), max_len=10, cache_len=4), [0, -0.25, -0.5, -1, -1]
    )


def test_overlong_penalty_slope():
    # d R / d |y| = -1 / L_cache inside the window, 0 outside.
    grad = jax.grad(lambda y: overlong_penalty(y, max_len=10, cache_len=4).sum())(jnp.array([3.0, 7.5, 12.0]))
    np.testing.assert_allclose(grad, [0.0, -0.25, 0.0])


overlong_penalty_jit = jax.jit(overlong_penalty)


@PROPERTY
@given(lengths=st.lists(st.integers(0, 40000), min_size=1, max_size=8))
def test_overlong_penalty_is_bounded_and_non_increasing(lengths):
    lengths = np.sort(np.pad(lengths, (0, 8 - len(lengths)), mode="edge"))
    penalty = np.asarray(overlong_penalty_jit(lengths))
    assert np.all((penalty <= 0) & (penalty >= -1)) and np.all(np.diff(penalty) <= 0)


def test_overlong_penalty_bad_inputs():
    with pytest.raises(ValueError, match=r"lengths must have shape \[N\], got shape \(2, 2\)"):
        overlong_penalty(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="need 0 < cache_len <= max_len, got cache_len=8, max_len=4"):
        overlong_penalty(jnp.zeros(2), max_len=4, cache_len=8)


# ---------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_filter_golden():
    # Groups: [1,1,1,1] all right (dropped), [1,0,0,1] mixed (kept), [0,0,0,0] (dropped),
    # a single row (dropped), and [1, (0 invalid)] whose only other reward is invalid (dropped).
    rewards = jnp.array([1.0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0])
    group_ids = jnp.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4])
    valid = jnp.ones(15, bool).at[14].set(False)
    keep = dynamic_sampling_filter(rewards, group_ids, num_groups=5, valid=valid)
    np.testing.assert_array_equal(keep, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    assert keep.dtype == jnp.bool_


def test_dynamic_sampling_filter_atol():
    rewards, group_ids = jnp.array([0.5, 0.5001]), jnp.array([0, 0])
    assert dynamic_sampling_filter(rewards, group_ids, num_groups=1).all()
    assert not dynamic_sampling_filter(rewards, group_ids, num_groups=1, atol=1e-3).any()


@functools.partial(jax.jit, static_argnames="num_groups")
def dynamic_sampling_filter_jit(rewards, group_ids, valid, num_groups):
    return dynamic_sampling_filter(rewards, group_ids, num_groups=num_groups, valid=valid)


@PROPERTY
@given(batch=outcome_batches(max_groups=4, max_group_size=4, binary=True))
def test_dynamic_sampling_filter_keeps_exactly_the_mixed_groups(batch):
    rewards, group_ids, valid, num_groups = (np.asarray(x) for x in batch)
    n = len(rewards)
    pad = 16 - n  # invalid padding rows to a fixed shape; they must never be kept nor count
    rewards, group_ids = np.pad(rewards, (0, pad), constant_values=0.5), np.pad(group_ids, (0, pad))
    valid = np.pad(valid, (0, pad))
    keep = np.asarray(dynamic_sampling_filter_jit(rewards, group_ids, valid, 4))
    for i in range(16):
        same = valid & (group_ids == group_ids[i])
        assert keep[i] == (valid[i] and len(set(rewards[same])) > 1)


# ---------------------------------------------------------------- importance correction

# Trainer / sampler probability ratios per token; the last token of row 1 is masked (garbage).
RATIOS = jnp.array([[3.0, 0.5, 1.0], [3.0, 1.0, 1e30]])
MASK = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
SAMPLER = jnp.full((2, 3), -2.0)
TRAINER = SAMPLER + jnp.log(RATIOS)


@pytest.mark.parametrize(
    "level, mode, kw, weights, metric",
    [
        ("token", "truncate", {}, [[2, 0.5, 1], [2, 1, 0]], ("is_clipped_fraction", 2 / 5)),
        ("token", "mask", {}, [[0, 1, 1], [0, 1, 0]], ("is_masked_fraction", 2 / 5)),  # 0.5 >= 1/2 is kept
        ("token", "mask", dict(lower_threshold=0.6), [[0, 0, 1], [0, 1, 0]], ("is_masked_fraction", 3 / 5)),
        # Sequence level: w = 3 * 0.5 * 1 = 1.5 for row 0, w = 3 for row 1 (its masked token ignored).
        ("sequence", "truncate", {}, [[1.5] * 3, [2, 2, 0]], ("is_clipped_fraction", 2 / 5)),
        ("sequence", "mask", {}, [[1, 1, 1], [0, 0, 0]], ("is_masked_fraction", 2 / 5)),
    ],
)
def test_importance_correction_golden(level, mode, kw, weights, metric):
    w, metrics = importance_correction(TRAINER, SAMPLER, MASK, level=level, mode=mode, **kw)
    np.testing.assert_allclose(w, weights, rtol=1e-5)
    np.testing.assert_allclose(metrics[metric[0]], metric[1], rtol=1e-6)


def test_importance_correction_token_weight_mean():
    _, metrics = importance_correction(TRAINER, SAMPLER, MASK)
    np.testing.assert_allclose(metrics["is_weight_mean"], (3 + 0.5 + 1 + 3 + 1) / 5, rtol=1e-5)


@pytest.mark.parametrize("level", ("token", "sequence"))
@pytest.mark.parametrize("mode", ("truncate", "mask"))
def test_importance_weights_are_constants(level, mode):
    # The weights multiply the loss as constants: no gradient reaches either log-prob.
    def total(trainer, sampler):
        return importance_correction(trainer, sampler, MASK, level=level, mode=mode)[0].sum()

    for g in jax.grad(total, argnums=(0, 1))(TRAINER, SAMPLER):
        np.testing.assert_array_equal(g, 0.0)


SHAPE = (6, 8)


@functools.cache
def jitted_importance_correction(level, mode):
    return jax.jit(functools.partial(importance_correction, level=level, mode=mode))


@PROPERTY
@given(
    batch=token_batches(max_rows=SHAPE[0], max_len=SHAPE[1]),
    level=st.sampled_from(["token", "sequence"]),
    mode=st.sampled_from(["truncate", "mask"]),
)
def test_importance_weights_on_random_batches(batch, level, mode):
    """Finite, 0 where masked, in [0, 2] (TIS) or {0, 1} (MIS), one value per sequence at sequence level."""
    trainer, sampler, mask = (np.asarray(x) for x in batch)
    n, t = trainer.shape
    pad = lambda x, c: np.pad(x, [(0, SHAPE[0] - n), (0, SHAPE[1] - t)], constant_values=c)
    trainer, sampler, mask = pad(trainer, 0.0), pad(sampler, -1e4), pad(mask, 0.0)  # garbage padding
    w, metrics = jitted_importance_correction(level, mode)(trainer, sampler, mask)
    w = np.asarray(w)
    assert np.all(np.isfinite(w)) and all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_array_equal(w[mask == 0], 0.0)
    if mode == "truncate":
        assert np.all((w >= 0) & (w <= 2.0))
    else:
        assert set(np.unique(w)) <= {0.0, 1.0}
    if level == "sequence":
        for i in range(SHAPE[0]):
            assert len(set(w[i][mask[i] > 0])) <= 1


def test_importance_correction_bad_inputs():
    with pytest.raises(ValueError, match="level must be 'token' or 'sequence', got 'batch'"):
        importance_correction(TRAINER, SAMPLER, MASK, level="batch")
    with pytest.raises(ValueError, match="mode must be 'truncate' or 'mask', got 'clip'"):
        importance_correction(TRAINER, SAMPLER, MASK, mode="clip")
    with pytest.raises(ValueError, match=r"sampler_logp has shape \(2, 2\) but trainer_logp has shape \(2, 3\)"):
        importance_correction(TRAINER, SAMPLER[:, :2], MASK)


# ---------------------------------------------------------------- entropy


@jax.jit
def reference_entropy(logits):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -(jnp.exp(logp) * jnp.where(jnp.isfinite(logp), logp, 0.0)).sum(-1)


# Every entropy test uses [4, 12] logits, jitted: a few compilations instead of op-by-op dispatch.
V = 12
entropy = jax.jit(entropy_from_logits, static_argnames=("chunk_size", "temperature"))


@functools.cache
def entropy_value_and_grad(chunk_size):
    return jax.jit(jax.value_and_grad(lambda z: entropy_from_logits(z, chunk_size=chunk_size).sum()))


def random_logits(seed):
    return np.asarray(jax.random.normal(jax.random.key(seed), (4, V)) * 3.0)


def test_entropy_golden():
    logits = np.zeros((4, V), np.float32)
    logits[1] = -np.inf
    logits[1, [3, 9]] = np.log([1.0, 3.0])  # p = [1/4, 3/4]: H = -(.25 ln .25 + .75 ln .75) = 0.5623
    logits[2] = -np.inf
    logits[2, 7] = 5.0  # one token left: H = 0
    np.testing.assert_allclose(entropy(logits, chunk_size=5), [np.log(V), 0.562335, 0.0, np.log(V)], atol=1e-5)


@pytest.mark.parametrize("chunk_size", (5, V))  # V = 12 is 3 chunks of 5 (padded) or one chunk
def test_entropy_chunks_equal_the_unchunked_reference(chunk_size):
    logits = random_logits(0)
    np.testing.assert_allclose(entropy(logits, chunk_size=chunk_size), reference_entropy(logits), rtol=1e-5)


def test_entropy_bfloat16_temperature_and_masked_vocabulary():
    logits = random_logits(1)
    h = entropy(logits.astype(jnp.bfloat16), chunk_size=5)
    assert h.dtype == jnp.float32
    np.testing.assert_allclose(h, reference_entropy(logits.astype(jnp.bfloat16)), rtol=1e-5)
    np.testing.assert_allclose(entropy(logits, chunk_size=5, temperature=2.0), reference_entropy(logits / 2), rtol=1e-5)
    # A whole first chunk of -inf logits (banned tokens): the entropy of the rest, not NaN.
    masked = logits.copy()
    masked[:, :5] = -np.inf
    np.testing.assert_allclose(entropy(masked, chunk_size=5), reference_entropy(masked), rtol=1e-5)


def test_entropy_gradient():
    # dH/dz_v = -p_v (log p_v + H).
    logits = random_logits(2)
    _, grad = entropy_value_and_grad(5)(logits)
    logp = jax.nn.log_softmax(logits)
    expected = -np.exp(logp) * (logp + reference_entropy(logits)[:, None])
    np.testing.assert_allclose(grad, expected, atol=1e-6)


@PROPERTY
@given(
    logits=st.lists(st.floats(-1e4, 1e4, width=32) | st.just(-np.inf), min_size=4 * V, max_size=4 * V),
    chunk_size=st.sampled_from([5, V]),
)
def test_entropy_is_finite_and_between_zero_and_log_v(logits, chunk_size):
    logits = np.array(logits, np.float32).reshape(4, V)
    logits[:, -1] = np.where(np.isinf(logits).all(1), 0.0, logits[:, -1])  # at least one finite logit a row
    h, grad = entropy_value_and_grad(chunk_size)(logits)
    assert np.isfinite(h) and np.all(np.isfinite(grad))
    h_rows = np.asarray(entropy(logits, chunk_size=chunk_size))
    assert np.all((h_rows >= -1e-4) & (h_rows <= np.log(V) + 1e-4))


def test_entropy_bad_inputs():
    with pytest.raises(TypeError, match="logits must be floating-point, got dtype int32"):
        entropy_from_logits(jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        entropy_from_logits(jnp.zeros((2, 3)), temperature=0)


# ---------------------------------------------------------------- sharding and vmap


def misc_cases():
    rng = np.random.default_rng(0)
    n = 16
    rewards = jnp.asarray(rng.integers(0, 2, n), jnp.float32)
    group_ids = jnp.asarray(np.repeat(np.arange(4), 4), jnp.int32)
    valid = jnp.asarray(rng.random(n) > 0.2)
    sampler = jnp.asarray(rng.normal(size=(n, 8)) - 2.0, jnp.float32)
    trainer = sampler + jnp.asarray(rng.normal(size=(n, 8)) * 0.5, jnp.float32)
    mask = jnp.asarray(rng.random((n, 8)) > 0.3, jnp.float32)
    return {
        "overlong_penalty": (overlong_penalty, dict(lengths=jnp.asarray(rng.integers(0, 25000, n))), {}),
        "dynamic_sampling_filter": (
            dynamic_sampling_filter,
            dict(rewards=rewards, group_ids=group_ids, valid=valid),
            dict(num_groups=4),
        ),
        "tis_token": (importance_correction, dict(trainer_logp=trainer, sampler_logp=sampler, mask=mask), {}),
        "mis_sequence": (
            importance_correction,
            dict(trainer_logp=trainer, sampler_logp=sampler, mask=mask),
            dict(level="sequence", mode="mask"),
        ),
        "entropy_from_logits": (
            entropy_from_logits,
            dict(logits=jnp.asarray(rng.normal(size=(n, 3, V)), jnp.float32)),
            dict(chunk_size=5),
        ),
    }


@pytest.mark.parametrize("case", sorted(misc_cases()))
def test_sharded_matches_unsharded(case, mesh_2x4):
    fn, arrays, static = misc_cases()[case]
    assert_sharded_matches(fn, arrays, mesh_2x4, **static)


@pytest.mark.parametrize("case", sorted(misc_cases()))
def test_jit_and_vmap_over_a_batch_of_batches(case):
    fn, arrays, static = misc_cases()[case]
    stacked = {k: jnp.stack([v, v[::-1]]) for k, v in arrays.items()}
    batched = jax.jit(jax.vmap(lambda a: fn(**a, **static)))(stacked)
    for k in range(2):
        expected = fn(**{name: v[k] for name, v in stacked.items()}, **static)
        jax.tree.map(lambda b, e: np.testing.assert_allclose(b[k], e, rtol=1e-6, atol=1e-6), batched, expected)


# ---------------------------------------------------------------- registry


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, restored after the test: user registrations do not leak into the docs."""
    for kind in registry.KINDS:
        monkeypatch.setitem(registry._REGISTRY, kind, dict(registry._REGISTRY[kind]))


def test_every_issue_2_kernel_is_registered_with_a_paper():
    names = {(i.kind, i.name): i for i in jaxgrpo.list_kernels()}
    expected = (
        [("advantage", n) for n in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")]
        + [("loss", n) for n in ("ppo_clip", "gspo", "gspo_token", "cispo", "reinforce")]
        + [("kl", n) for n in jaxgrpo.KL_KINDS]
        + [("token_advantage", n) for n in ("gae", "discounted_returns", "reinforce_pp_returns")]
        + [("reward", "overlong_penalty"), ("selection", "dynamic_sampling_filter"), ("credit", "importance_correction")]
    )
    for key in expected:
        assert key in names, key
        assert names[key].paper and names[key].summary, key


def test_list_kernels_is_sorted_by_kind_then_name():
    infos = jaxgrpo.list_kernels()
    kind_order = list(registry.KINDS)
    assert [(kind_order.index(i.kind), i.name) for i in infos] == sorted((kind_order.index(i.kind), i.name) for i in infos)
    assert [i.name for i in jaxgrpo.list_kernels("loss")] == sorted(i.name for i in infos if i.kind == "loss")


def test_a_user_estimator_registers_from_a_notebook(scratch_registry):
    @jaxgrpo.register_advantage("centered_twice", paper="A notebook (2026)")
    def centered_twice(rewards, group_ids, *, num_groups, valid=None):
        """Twice the Dr. GRPO advantage: A_i = 2 (r_i - mean_g)."""
        return 2.0 * jaxgrpo.get_advantage("dr_grpo")(rewards, group_ids, num_groups=num_groups, valid=valid)

    fn = jaxgrpo.get_advantage("centered_twice")
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0]), jnp.array([0, 0]), num_groups=1), [1.0, -1.0])
    info = registry.info("advantage", "centered_twice")
    assert (info.paper, info.summary) == ("A notebook (2026)", "Twice the Dr. GRPO advantage: A_i = 2 (r_i - mean_g).")
    assert "centered_twice" in [i.name for i in jaxgrpo.list_kernels("advantage")]
    # Re-running the cell with the same function is fine; another function needs overwrite=True.
    jaxgrpo.register_advantage("centered_twice")(centered_twice)
    with pytest.raises(ValueError, match="advantage kernel named 'centered_twice' is already registered; pass overwrite=True"):
        jaxgrpo.register_advantage("centered_twice")(lambda *a, **k: None)
    jaxgrpo.register_advantage("centered_twice", overwrite=True)(jaxgrpo.get_advantage("dr_grpo"))
    assert jaxgrpo.get_advantage("centered_twice") is jaxgrpo.get_advantage("dr_grpo")

    @jaxgrpo.register_loss("experimental/half_reinforce")
    def half_reinforce(logp, old_logp, advantages, mask):
        """Half of REINFORCE."""
        loss, metrics = jaxgrpo.get_loss("reinforce")(logp, old_logp, advantages, mask)
        return 0.5 * loss, metrics

    assert registry.info("loss", "experimental/half_reinforce").experimental
    assert registry.info("loss", "experimental/half_reinforce").paper == "user-defined"


def test_registry_errors_name_the_valid_choices(scratch_registry):
    kinds = r"valid kinds: \['advantage', 'credit', "
    with pytest.raises(ValueError, match=f"unknown kernel kind 'advantages'; {kinds}"):
        jaxgrpo.get("advantages", "grpo")
    with pytest.raises(ValueError, match=f"unknown kernel kind 'x'; {kinds}"):
        jaxgrpo.register("x", "y", paper="p")
    with pytest.raises(ValueError, match=f"unknown kernel kind 'lossy'; {kinds}"):
        jaxgrpo.list_kernels("lossy")
    with pytest.raises(KeyError, match=r"no reward kernel named 'overlong'; valid names: .*overlong_penalty"):
        jaxgrpo.get("reward", "overlong")
    with pytest.raises(KeyError, match=r"no selection kernel named 'dapo'; valid names: .*dynamic_sampling_filter"):
        registry.info("selection", "dapo")
    for bad in ("GRPO", "my grpo", ""):
        with pytest.raises(ValueError, match="kernel name must be lowercase without spaces"):
            jaxgrpo.register_advantage(bad)
    with pytest.raises(ValueError, match="kernel 'nameless' needs a paper"):
        jaxgrpo.register("advantage", "nameless", paper="")
