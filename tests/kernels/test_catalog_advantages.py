"""Tests of the catalog advantage estimators (METHODS.md §2 items 8-19) and the REC / OPMD losses.

Each kernel: the METHODS.md golden value, one more hand-computed case (the
arithmetic is in the comments), finiteness for random batches with degenerate
groups, sharded == unsharded on the 8-device mesh, and composition
advantage -> ppo_clip -> every aggregation mode under jit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxgrpo.kernels import advantages as ca
from jaxgrpo.kernels.advantages import dr_grpo, grpo
from jaxgrpo.kernels.aggregation import AGGREGATION_MODES, aggregate
from jaxgrpo.kernels.losses import opmd_loss, ppo_clip, rec
from jaxgrpo.kernels.masks import mc_grpo_pivot_mask
from jaxgrpo.kernels.registry import info
from jaxgrpo.kernels.selection import dgpo_question_weights
from tests.support.kernel_checks import assert_sharded_matches


def f32(*values):
    return jnp.asarray(values, jnp.float32)


def i32(*values):
    return jnp.asarray(values, jnp.int32)


def run(fn, *args, **kwargs):
    """fn(*args, **kwargs) as one jitted program (inputs closed over): one compile instead of op-by-op dispatch."""
    return jax.jit(lambda: fn(*args, **kwargs))()


def close(got, expected, atol=1e-4):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected, np.float32), atol=atol, rtol=1e-5)


# --------------------------------------------------------------------------- #
# Fixed-shape batches, shared by the property, sharding and composition tests
# --------------------------------------------------------------------------- #

N, NUM_GROUPS, K = 16, 4, 2


def _kernel_table():
    """name -> fn(batch dict) for every advantage-like kernel of the module."""
    g = NUM_GROUPS

    def base(b):
        return dict(num_groups=g, valid=b["valid"])

    return {
        "mc_grpo": lambda b: ca.mc_grpo(b["rewards"], b["group_ids"], **base(b)),
        "mc_grpo_pivot_mask": lambda b: mc_grpo_pivot_mask(b["rewards"], b["group_ids"], **base(b)),
        "bnpo": lambda b: ca.bnpo(b["rewards"], b["group_ids"], **base(b)),
        "gdpo": lambda b: ca.gdpo(b["rewards_k"], b["group_ids"], **base(b)),
        "ngrpo": lambda b: ca.ngrpo(b["rewards"], b["group_ids"], **base(b)),
        "krpo": lambda b: ca.krpo(b["rewards"], b["group_ids"], **base(b)),
        "dgpo": lambda b: ca.dgpo(b["rewards"], b["group_ids"], **base(b)),
        "dgpo_question_weights": lambda b: dgpo_question_weights(b["rewards"], b["group_ids"], **base(b)),
        "gigpo": lambda b: ca.gigpo(
            b["rewards"], b["group_ids"], **base(b), step_returns=b["step_returns"], anchor_ids=b["anchor_ids"], num_anchors=3
        ),
        "gigpo_std": lambda b: ca.gigpo(
            b["rewards"], b["group_ids"], **base(b), step_returns=b["step_returns"], anchor_ids=b["anchor_ids"],
            num_anchors=3, normalization="std",
        ),
        "stratified_grpo": lambda b: ca.stratified_grpo(
            b["rewards"], b["group_ids"], **base(b), strata_ids=b["strata_ids"], num_strata=2, blend=0.7
        ),
        "seed_grpo": lambda b: ca.seed_grpo(b["rewards"], b["group_ids"], **base(b), cluster_ids=b["cluster_ids"]),
        "seed_grpo_focal": lambda b: ca.seed_grpo(
            b["rewards"], b["group_ids"], **base(b), cluster_ids=b["cluster_ids"], scaling="focal", std_normalize=True
        ),
        "riskpo": lambda b: ca.riskpo(b["rewards"], b["group_ids"], **base(b), bundle_ids=b["group_ids"] // 2),
        "xrpo": lambda b: ca.xrpo(b["rewards"], b["group_ids"], **base(b), seq_logp=b["seq_logp"]),
        "asymre": lambda b: ca.asymre(b["rewards"], b["group_ids"], **base(b)),
        "opmd": lambda b: ca.opmd(b["rewards"], b["group_ids"], **base(b)),
        "opmd_logmeanexp": lambda b: ca.opmd(b["rewards"], b["group_ids"], **base(b), baseline="logmeanexp", tau=0.5),
    }


KERNELS = _kernel_table()
ADVANTAGE_KERNELS = [k for k in KERNELS if k not in ("mc_grpo_pivot_mask", "dgpo_question_weights")]
_JITTED = {name: jax.jit(fn) for name, fn in KERNELS.items()}


@st.composite
def fixed_batches(draw):
    """A batch of N=16 rows in 4 groups, any order; groups may be empty, of size 1, constant or all invalid."""
    group_ids = np.array(draw(st.lists(st.integers(0, NUM_GROUPS - 1), min_size=N, max_size=N)), np.int32)
    valid = np.array(draw(st.lists(st.booleans(), min_size=N, max_size=N)), bool)
    if draw(st.booleans()):
        valid[group_ids == draw(st.integers(0, NUM_GROUPS - 1))] = False  # a fully invalid group
    value = st.sampled_from([0.0, 1.0]) if draw(st.booleans()) else st.floats(-100, 100, width=32)
    rewards = np.array(draw(st.lists(value, min_size=N, max_size=N)), np.float32)
    if draw(st.booleans()):
        rewards[group_ids == 0] = rewards[0]  # an all-equal group
    rewards_k = np.array(draw(st.lists(value, min_size=N * K, max_size=N * K)), np.float32).reshape(N, K)

    def ints(hi):
        return np.array(draw(st.lists(st.integers(0, hi - 1), min_size=N, max_size=N)), np.int32)

    return {
        "rewards": jnp.asarray(rewards),
        "group_ids": jnp.asarray(group_ids),
        "valid": jnp.asarray(valid),
        "rewards_k": jnp.asarray(rewards_k),
        "step_returns": jnp.asarray(np.array(draw(st.lists(value, min_size=N, max_size=N)), np.float32)),
        "anchor_ids": jnp.asarray(ints(3)),
        "strata_ids": jnp.asarray(ints(2)),
        "cluster_ids": jnp.asarray(ints(3)),
        "seq_logp": jnp.asarray(np.array(draw(st.lists(st.floats(-30, 0, width=32), min_size=N, max_size=N)), np.float32)),
    }


def example_batch(seed: int = 0):
    """A deterministic batch with two binary groups, one continuous group, and one size-1 group."""
    rng = np.random.default_rng(seed)
    group_ids = np.array([0] * 5 + [1] * 5 + [2] * 5 + [3], np.int32)
    rewards = np.concatenate([[1, 0, 0, 1, 1], [0, 0, 0, 1, 0], rng.normal(size=5), [1.0]]).astype(np.float32)
    perm = rng.permutation(N)
    valid = np.ones(N, bool)
    valid[perm[0]] = False
    return {
        "rewards": jnp.asarray(rewards[perm]),
        "group_ids": jnp.asarray(group_ids[perm]),
        "valid": jnp.asarray(valid),
        "rewards_k": jnp.asarray(rng.integers(0, 2, size=(N, K)).astype(np.float32)),
        "step_returns": jnp.asarray(rng.normal(size=N).astype(np.float32)),
        "anchor_ids": jnp.asarray(rng.integers(0, 3, size=N).astype(np.int32)),
        "strata_ids": jnp.asarray(rng.integers(0, 2, size=N).astype(np.int32)),
        "cluster_ids": jnp.asarray(rng.integers(0, 3, size=N).astype(np.int32)),
        "seq_logp": jnp.asarray(-rng.uniform(0.1, 3.0, size=N).astype(np.float32)),
    }


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "kind, name",
    [("advantage", n) for n in ("mc_grpo", "bnpo", "gdpo", "ngrpo", "krpo", "dgpo", "gigpo", "stratified_grpo",
                                "seed_grpo", "riskpo", "xrpo", "asymre", "opmd")]
    + [("mask", "mc_grpo_pivot_mask"), ("selection", "dgpo_question_weights"), ("loss", "rec"), ("loss", "opmd")],
)
def test_registered_with_paper_and_docstring(kind, name):
    entry = info(kind, name)
    assert entry.paper and "(20" in entry.paper, entry.paper  # title and year
    assert entry.summary, f"{name} needs a docstring"
    # Reconstructed formulas are flagged; verified ones are not.
    assert entry.experimental == (name in ("seed_grpo", "xrpo"))


# --------------------------------------------------------------------------- #
# 8. MC-GRPO
# --------------------------------------------------------------------------- #


def test_mc_grpo_golden():
    # METHODS.md: r=[0.1,0.5,0.9] -> median .5, MAD .4 -> A=+-0.4/0.401=+-0.9975, pivot (median) dropped.
    r, g = f32(0.1, 0.5, 0.9), i32(0, 0, 0)
    close(run(ca.mc_grpo, r, g, num_groups=1), [-0.9975, 0.0, 0.9975])
    np.testing.assert_array_equal(run(mc_grpo_pivot_mask, r, g, num_groups=1), [True, False, True])
    # Binary [1,0,0,1,1]: median 1, MAD 0 -> A=(r-1)/1e-3; one "1" (the first in batch order) is the pivot.
    r, g = f32(1, 0, 0, 1, 1), i32(0, 0, 0, 0, 0)
    close(run(ca.mc_grpo, r, g, num_groups=1), [0, -1000, -1000, 0, 0], atol=1e-3)
    np.testing.assert_array_equal(run(mc_grpo_pivot_mask, r, g, num_groups=1), [False, True, True, True, True])


def test_mc_grpo_hand_case_ties_even_groups_and_invalid_rows():
    # Group 0: r=[3,1,2,10,2]; sorted [1,2,2,3,10] -> median 2, held by rows 2 and 4; stable order puts
    # row 2 first, and position (5-1)//2=2 is row 4, the pivot. |r-2|=[1,1,0,8,0] -> sorted [0,0,1,1,8]
    # -> MAD 1 -> A=(r-2)/1.001=[0.999,-0.999,0,7.992,0].
    # Group 1 (even, one invalid row 9.0): r=[4,1,3,2] -> lower median 2 (torch.median), |r-2|=[2,1,1,0]
    # -> lower median 1 -> A=(r-2)/1.001=[1.998,-0.999,0.999,0]; pivot is the row holding 2.
    r = f32(3, 1, 2, 10, 2, 4, 1, 9, 3, 2)
    g = i32(0, 0, 0, 0, 0, 1, 1, 1, 1, 1)
    valid = jnp.asarray([True] * 7 + [False, True, True])
    close(run(ca.mc_grpo, r, g, num_groups=2, valid=valid), [0.999, -0.999, 0, 7.992, 0, 1.998, -0.999, 0, 0.999, 0], atol=1e-3)
    np.testing.assert_array_equal(
        run(mc_grpo_pivot_mask, r, g, num_groups=2, valid=valid), [True, True, True, True, False, True, True, False, True, False]
    )


def test_mc_grpo_pivot_mask_drops_exactly_one_row_per_nonempty_group():
    b = example_batch()
    mask = run(mc_grpo_pivot_mask, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"])
    dropped = np.asarray(b["valid"] & ~mask)
    for group in range(NUM_GROUPS):
        rows = np.asarray(b["group_ids"]) == group
        assert dropped[rows].sum() == int(np.asarray(b["valid"])[rows].any())


# --------------------------------------------------------------------------- #
# 9. BNPO
# --------------------------------------------------------------------------- #


def test_bnpo_golden():
    # METHODS.md: p=[.25,.75] -> alpha=beta=7/6, pdf(.25)=1.0466 -> A(r=1)=0.7166, A(r=0)=-0.2389.
    r = f32(1, 0, 0, 0, 1, 1, 1, 0)
    g = i32(0, 0, 0, 0, 1, 1, 1, 1)
    close(run(ca.bnpo, r, g, num_groups=2), [0.7166, -0.2389, -0.2389, -0.2389, 0.2389, 0.2389, 0.2389, -0.7166])
    # The same outcomes as rewards in {-1, 1}, rescaled by min_value=-1: identical advantages (in [0,1] units).
    close(run(ca.bnpo, 2 * r - 1, g, num_groups=2, min_value=-1.0), run(ca.bnpo, r, g, num_groups=2), atol=1e-6)


def test_bnpo_hand_case_three_prompts():
    # p=[.25,.5,.75]: mu=.5, v=(.0625+0+.0625)/2=.0625, c=.25/.0625-1=3 -> alpha=beta=1+3*.5/3=1.5.
    # B(1.5,1.5)=pi/8; pdf(.5)=sqrt(.25)/(pi/8)=4/pi=1.27324; pdf(.25)=sqrt(.1875)/(pi/8)=1.10266.
    # g0 [1,0,0,0]: .75/1.10266=.68018, -.25/1.10266=-.22673; g1 [1,0]: +-.5/1.27324=+-.39270;
    # g2 [1,1,1,0]: .22673, -.68018.
    r = f32(1, 0, 0, 0, 1, 0, 1, 1, 1, 0)
    g = i32(0, 0, 0, 0, 1, 1, 2, 2, 2, 2)
    close(run(ca.bnpo, r, g, num_groups=3), [0.68018, -0.22673, -0.22673, -0.22673, 0.39270, -0.39270,
                                        0.22673, 0.22673, 0.22673, -0.68018])


def test_bnpo_reduces_to_dr_grpo_when_alpha_beta_are_one():
    # p=[0,1,.5]: mu=.5, v=(.25+.25+0)/2=.25 = mu(1-mu) -> c=0 -> alpha=beta=1 -> pdf=1 -> A=r-p (Dr. GRPO).
    r = f32(0, 0, 1, 1, 1, 0, 1, 0)
    g = i32(0, 0, 1, 1, 2, 2, 2, 2)
    close(run(ca.bnpo, r, g, num_groups=3), run(dr_grpo, r, g, num_groups=3), atol=1e-6)
    # One prompt: no moment fit, alpha=beta=1 as well.
    r1, g1 = f32(1, 0, 0), i32(0, 0, 0)
    close(run(ca.bnpo, r1, g1, num_groups=1), run(dr_grpo, r1, g1, num_groups=1), atol=1e-6)


# --------------------------------------------------------------------------- #
# 10. GDPO
# --------------------------------------------------------------------------- #


def test_gdpo_golden():
    # METHODS.md: prompt A rewards (0,0),(0,1); prompt B (0,0),(1,1): S=[-.707,.707,-1.414,1.414],
    # batch std (ddof=1)=sqrt(5/3)=1.291 -> [-0.548,0.548,-1.095,1.095].
    r = jnp.asarray([[0, 0], [0, 1], [0, 0], [1, 1]], jnp.float32)
    close(run(ca.gdpo, r, i32(0, 0, 1, 1), num_groups=2), [-0.5477, 0.5477, -1.0954, 1.0954], atol=2e-4)


def test_gdpo_hand_case_reward_weights():
    # Weights [2, 0] keep only reward 0: prompt A [0,0] -> 0,0; prompt B [0,1] -> +-0.707*2=+-1.414.
    # S=[0,0,-1.414,1.414], mean 0, var (2+2)/3 -> std 1.1547 -> [0,0,-1.2247,1.2247].
    r = jnp.asarray([[0, 0], [0, 1], [0, 0], [1, 1]], jnp.float32)
    got = run(ca.gdpo, r, i32(0, 0, 1, 1), num_groups=2, reward_weights=f32(2.0, 0.0))
    close(got, [0, 0, -1.2247, 1.2247], atol=2e-4)


def test_gdpo_with_one_reward_is_grpo_then_batch_normalization():
    b = example_batch(3)
    r, g, v = b["rewards"], b["group_ids"], b["valid"]
    a = run(grpo, r, g, num_groups=NUM_GROUPS, valid=v, eps=1e-4)
    mean = np.asarray(a)[np.asarray(v)].mean()
    std = np.asarray(a)[np.asarray(v)].std(ddof=1)
    expected = np.where(np.asarray(v), (np.asarray(a) - mean) / (std + 1e-4), 0.0)
    close(run(ca.gdpo, r[:, None], g, num_groups=NUM_GROUPS, valid=v), expected, atol=1e-5)


def test_gdpo_token_whitening_weights_rows_by_their_length():
    # One reward, groups [1, 0] and [0, 1]: group step S = s [1, -1, -1, 1], s = .5 / (std + eps).
    # Rows (TRL): mean 0, unbiased std s sqrt(4/3) -> +-0.86603. Tokens (verl), lengths [1, 3, 1, 1]:
    # mean -s/3, deviations s [4/3, -2/3, -2/3, 4/3], variance s^2 (16/9 + 3 * 4/9 + 4/9 + 16/9) / 5
    # = 16 s^2 / 15 -> A = [sqrt(15)/3, -sqrt(15)/6, -sqrt(15)/6, sqrt(15)/3] (s cancels).
    rewards = jnp.array([[1.0], [0.0], [0.0], [1.0]])
    group_ids = jnp.array([0, 0, 1, 1], jnp.int32)
    rows = ca.gdpo(rewards, group_ids, num_groups=2)
    s = 0.5 / (np.sqrt(0.5) + 1e-4)
    a = s / (s * np.sqrt(4 / 3) + 1e-4)  # 0.86592: the eps 1e-4 of both steps shows in the 4th digit
    np.testing.assert_allclose(rows, [a, -a, -a, a], atol=1e-6)
    tokens = ca.gdpo(rewards, group_ids, num_groups=2, whiten="tokens", lengths=jnp.array([1.0, 3.0, 1.0, 1.0]))
    r15 = np.sqrt(15.0)
    np.testing.assert_allclose(tokens, [r15 / 3, -r15 / 6, -r15 / 6, r15 / 3], atol=1e-5)


def test_gdpo_rejects_bad_weights():
    with pytest.raises(ValueError, match=r"reward_weights must have shape \[K\]=\[2\]"):
        run(ca.gdpo, jnp.zeros((4, 2)), i32(0, 0, 1, 1), num_groups=2, reward_weights=f32(1, 1, 1))


# --------------------------------------------------------------------------- #
# 11. NGRPO
# --------------------------------------------------------------------------- #


def test_ngrpo_golden():
    # METHODS.md: [0,0,0,0]+[1] -> mu=.2, var=(4*.04+.64)/4=.2 -> A=-.2/.4472=-.4472;
    # [1,0,0,1]+[1] -> mu=.6, var=(3*.16+2*.36)/4=.3 -> A=[.730,-1.095,-1.095,.730].
    r = f32(0, 0, 0, 0, 1, 0, 0, 1)
    g = i32(0, 0, 0, 0, 1, 1, 1, 1)
    close(run(ca.ngrpo, r, g, num_groups=2), [-0.4472, -0.4472, -0.4472, -0.4472, 0.7303, -1.0954, -1.0954, 0.7303])


def test_ngrpo_hand_case_single_rollout_and_invalid_row():
    # A single valid rollout r=0 is compared with r_max: {0,1} -> mu=.5, var (ddof=1)=.5 -> A=-.5/.7071=-.7071.
    # The invalid row (r=1) is ignored and gets 0.
    close(run(ca.ngrpo, f32(0, 1), i32(0, 0), num_groups=1, valid=jnp.asarray([True, False])), [-0.7071, 0.0])


# --------------------------------------------------------------------------- #
# 12. KRPO
# --------------------------------------------------------------------------- #


def test_krpo_golden():
    # METHODS.md: r=[1,0] -> [0.0995,-7.048]; r=[0,1] -> [0,7.119] (order-dependent).
    close(run(ca.krpo, f32(1, 0), i32(0, 0), num_groups=1), [0.0995, -7.048], atol=2e-3)
    close(run(ca.krpo, f32(0, 1), i32(0, 0), num_groups=1), [0.0, 7.119], atol=2e-3)


def test_krpo_hand_case_interleaved_groups_and_repeat():
    # r=[1,1]: step 1 as in the golden (x=.990099, P=.0099011, A=.0995); step 2: P-=.0099111,
    # K=.0099111/.0199111=.49777, x=.990099+.49777*.009901=.995027, P=.50223*.0099111=.0049777,
    # A=(1-.995027)/sqrt(.0049777)=.004973/.070553=.0705.
    close(run(ca.krpo, f32(1, 1), i32(0, 0), num_groups=1), [0.0995, 0.0705], atol=2e-3)
    # Groups interleaved in the batch (and an invalid row skipped) filter each group independently, in order.
    r = f32(1, 0, 5, 0, 1)
    g = i32(0, 1, 0, 0, 1)
    valid = jnp.asarray([True, True, False, True, True])
    close(run(ca.krpo, r, g, num_groups=2, valid=valid), [0.0995, 0.0, 0.0, -7.048, 7.119], atol=2e-3)


# --------------------------------------------------------------------------- #
# 13. DGPO
# --------------------------------------------------------------------------- #


def test_dgpo_golden():
    # METHODS.md: r=[1,0,0,0] -> mu=.25, sum|r-mu|=1.5 -> A=4*[.75,-.25..]/1.5=[2,-.667,-.667,-.667].
    close(run(ca.dgpo, f32(1, 0, 0, 0), i32(0, 0, 0, 0), num_groups=1), [2, -0.6667, -0.6667, -0.6667], atol=5e-4)
    # acc=[.25,.75], T=2 -> w=2 softmax([-.125,-.375])=[1.124,0.876].
    r = f32(1, 0, 0, 0, 1, 1, 1, 0)
    g = i32(0, 0, 0, 0, 1, 1, 1, 1)
    close(run(dgpo_question_weights, r, g, num_groups=2), [1.1244] * 4 + [0.8756] * 4)


def test_dgpo_hand_case():
    # r=[1,1,0]: mu=2/3, sum|r-mu|=1/3+1/3+2/3=4/3 -> A=3*(1/3)/(4/3)=.75, 3*(-2/3)/(4/3)=-1.5.
    close(run(ca.dgpo, f32(1, 1, 0), i32(0, 0, 0), num_groups=1), [0.75, 0.75, -1.5], atol=5e-4)
    # Property: sum |A| = G for each non-constant group.
    b = example_batch(1)
    a = np.asarray(run(ca.dgpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"]))
    for group in range(3):
        rows = (np.asarray(b["group_ids"]) == group) & np.asarray(b["valid"])
        np.testing.assert_allclose(np.abs(a[rows]).sum(), rows.sum(), rtol=1e-3)


def test_dgpo_question_weights_constant_groups_and_invalid_rows():
    # Groups: [1,0] (acc .5), [1,1] constant -> weight 1, [0,0] constant -> 1; only one varying group
    # -> its weight is 1*softmax([x])=1. The invalid row gets 0.
    r = f32(1, 0, 1, 1, 0, 0)
    g = i32(0, 0, 1, 1, 2, 2)
    valid = jnp.asarray([True, True, True, True, True, False])
    close(run(dgpo_question_weights, r, g, num_groups=3, valid=valid), [1, 1, 1, 1, 1, 0])
    # Varying groups acc=[1/3, 2/3] and a constant group: weights 2 softmax([-1/6,-1/3]) = [1.0832, 0.9168], 1.
    # (softmax: 1/(1+e^{-1/6})=.54159)
    r = f32(1, 0, 0, 1, 1, 0, 1, 1)
    g = i32(0, 0, 0, 1, 1, 1, 2, 2)
    close(run(dgpo_question_weights, r, g, num_groups=3), [1.0832] * 3 + [0.9168] * 3 + [1, 1])


# --------------------------------------------------------------------------- #
# 14. GiGPO
# --------------------------------------------------------------------------- #


def test_gigpo_golden():
    # METHODS.md: two steps from the same state, returns 1 and 0, episodes 1 and 0 -> [.5+.5, -.5-.5].
    got = run(ca.gigpo, f32(1, 0), i32(0, 0), num_groups=1, step_returns=f32(1, 0), anchor_ids=i32(2, 2), num_anchors=3)
    close(got, [1.0, -1.0])


def test_gigpo_hand_case():
    # Trajectory A (return 1) has steps at anchors 0 and 1; trajectory B (return 0) one step at anchor 0.
    # Episode rows R=[1,1,0], mean 2/3 -> A^E=[1/3,1/3,-2/3]. Step returns [.9,1,0]: anchor 0 holds rows
    # 0 and 2 (mean .45) -> [.45,-.45]; anchor 1 is a single step -> 0. A=[.7833,.3333,-1.1167].
    r, g, s, anc = f32(1, 1, 0), i32(0, 0, 0), f32(0.9, 1.0, 0.0), i32(0, 1, 0)
    close(run(ca.gigpo, r, g, num_groups=1, step_returns=s, anchor_ids=anc, num_anchors=2), [0.78333, 0.33333, -1.11667])
    # F = std (ddof=1): episode std of [1,1,0] = sqrt(1/3) -> [.57735,.57735,-1.1547]; anchor 0 std of
    # [.9,0]=.63640 -> +-.70711. A=[1.28446,.57735,-1.86181].
    got = run(ca.gigpo, r, g, num_groups=1, step_returns=s, anchor_ids=anc, num_anchors=2, normalization="std")
    close(got, [1.28446, 0.57735, -1.86181])


def test_gigpo_same_anchor_id_in_different_prompts_does_not_merge():
    # Anchor id 0 in prompt 0 and prompt 1: step groups are per prompt, so each is a single step (A^S=0).
    got = run(ca.gigpo, f32(1, 0, 1, 0), i32(0, 0, 1, 1), num_groups=2, step_returns=f32(5, 0, 0, 0),
                   anchor_ids=i32(0, 1, 0, 1), num_anchors=2)
    close(got, [0.5, -0.5, 0.5, -0.5])


# --------------------------------------------------------------------------- #
# 15. Stratified GRPO
# --------------------------------------------------------------------------- #


def test_stratified_grpo_golden_and_blend():
    # METHODS.md: r=[1,0|1,1], strata [0,0|1,1] -> A^SAN=[.707,-.707,0,0].
    r, g, s = f32(1, 0, 1, 1), i32(0, 0, 0, 0), i32(0, 0, 1, 1)
    close(run(ca.stratified_grpo, r, g, num_groups=1, strata_ids=s, num_strata=2), [0.7071, -0.7071, 0, 0])
    # Own: alpha=.5. Global GRPO: mu=.75, std (ddof=1)=sqrt(.75/3)=.5 -> [.5,-1.5,.5,.5];
    # blend .5*[.7071,-.7071,0,0]+.5*[.5,-1.5,.5,.5]=[.6036,-1.1036,.25,.25].
    got = run(ca.stratified_grpo, r, g, num_groups=1, strata_ids=s, num_strata=2, blend=0.5)
    close(got, [0.6036, -1.1036, 0.25, 0.25])


@pytest.mark.parametrize("blend", [1.0, 0.3])
def test_stratified_grpo_with_one_stratum_is_grpo(blend):
    b = example_batch(2)
    one = jnp.zeros((N,), jnp.int32)
    got = run(ca.stratified_grpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"],
                             strata_ids=one, num_strata=1, blend=blend)
    close(got, run(grpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"]), atol=1e-5)


# --------------------------------------------------------------------------- #
# 16. SEED-GRPO
# --------------------------------------------------------------------------- #


def test_seed_grpo_golden_zero_entropy_leaves_advantage_unchanged():
    # METHODS.md: all answers in one cluster -> SE=0 -> A = r - mean (Dr. GRPO), for every f.
    b = example_batch(4)
    expected = run(dr_grpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"])
    for scaling in ca.SEED_SCALINGS:
        got = run(ca.seed_grpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"],
                           cluster_ids=jnp.zeros((N,), jnp.int32), scaling=scaling)
        close(got, expected, atol=1e-6)


def test_seed_grpo_hand_case():
    # Clusters of sizes [3,1] in a group of 4: SE=-(log .75 + log .25)/2=(.28768+1.38629)/2=.83698,
    # SE_max=log 4=1.38629, x=.60376 -> linear f=.39624; r=[1,1,1,0] -> centered [.25,.25,.25,-.75]
    # -> A=[.09906,.09906,.09906,-.29718]. exp: f=e^-.60376=.54675 -> [.13669,...,-.41006].
    r, g, c = f32(1, 1, 1, 0), i32(0, 0, 0, 0), i32(7, 7, 7, 2)
    close(run(ca.seed_grpo, r, g, num_groups=1, cluster_ids=c), [0.09906] * 3 + [-0.29718])
    close(run(ca.seed_grpo, r, g, num_groups=1, cluster_ids=c, scaling="exp"), [0.13669] * 3 + [-0.41006])
    # Four singleton clusters: SE = log 4 = SE_max -> linear f = 0.
    close(run(ca.seed_grpo, r, g, num_groups=1, cluster_ids=i32(0, 1, 2, 3)), [0, 0, 0, 0])
    # The entropy from clusters equals the entropy passed directly.
    se = run(ca.semantic_entropy_from_clusters, g, c, 1, jnp.ones(4, bool))
    close(se, [0.83698])
    close(run(ca.seed_grpo, r, g, num_groups=1, semantic_entropy=se), run(ca.seed_grpo, r, g, num_groups=1, cluster_ids=c))


def test_seed_grpo_needs_exactly_one_entropy_source():
    with pytest.raises(ValueError, match="exactly one of semantic_entropy"):
        run(ca.seed_grpo, f32(1, 0), i32(0, 0), num_groups=1)


# --------------------------------------------------------------------------- #
# 17. RiskPO
# --------------------------------------------------------------------------- #


def test_riskpo_golden():
    # METHODS.md: paper scores S=[0..4] (one question per bundle) -> q=(.8,3.6) -> [-2.530,-0.940,-0.578,-0.217,0].
    got = run(ca.riskpo, f32(0, 1, 2, 3, 4), i32(0, 0, 0, 0, 0), num_groups=1, bundle_ids=i32(0, 0, 0, 0, 0))
    close(got, [-2.530, -0.940, -0.578, -0.217, 0.0], atol=1e-3)


def test_riskpo_hand_case_two_question_bundle():
    # Bundle of q0=[1,0,1] and q1=[1,1,0] (rows interleaved): papers j take the j-th rollout of each
    # question -> S=[2,1,1]. Quantiles of [1,1,2]: q.2 = 1 (pos .4), q.9 = 1+.8*1 = 1.8.
    # S=2: RVaR=(1-.2+1-1.8)/.7=0, CVaR=0 -> 0. S=1: RVaR=(0-0-.8)/.7=-1.142857, CVaR=-(1-1)+/.2=0
    # -> mix -1.142857/2.5=-.457143; std([2,1,1], ddof=1)=sqrt(1/3) -> -.79179.
    r = f32(1, 1, 0, 1, 1, 0)
    g = i32(0, 1, 0, 1, 0, 1)
    got = run(ca.riskpo, r, g, num_groups=2, bundle_ids=i32(0, 0, 0, 0, 0, 0), num_bundles=1)
    close(got, [0, 0, -0.79179, -0.79179, -0.79179, -0.79179], atol=1e-4)
    # Uneven: q1 has two rollouts -> two papers S=[2,1]; q0's third rollout is in no paper -> 0.
    # Quantiles of [1,2]: q.2=1.2, q.9=1.9. S=1: RVaR=-.7/.7=-1, CVaR=-.2/.2=-1 -> mix -1; std=.70711 -> -1.41421.
    got = run(ca.riskpo, f32(1, 1, 0, 1, 1), i32(0, 1, 0, 1, 0), num_groups=2, bundle_ids=i32(0, 0, 0, 0, 0), num_bundles=1)
    close(got, [0, 0, -1.41421, -1.41421, 0], atol=1e-4)


def test_riskpo_tracked_quantiles_are_averaged_with_the_batch():
    # S=[0..4], batch q=(.8,3.6), tracked (.8,3.6) -> unchanged; tracked (0,4) -> q=(.4,3.8).
    r, g, bid = f32(0, 1, 2, 3, 4), i32(0, 0, 0, 0, 0), i32(0, 0, 0, 0, 0)
    with_tracked = jax.jit(lambda tracked: ca.riskpo(r, g, num_groups=1, bundle_ids=bid, tracked_quantiles=tracked))
    close(with_tracked(f32(0.8, 3.6)), [-2.530, -0.940, -0.578, -0.217, 0.0], atol=1e-3)
    # S=4 with q=(.4,3.8): RVaR=(3.6-.2+.4-3.8)/.7=0 -> 0; S=0: RVaR=(0-0-3.4)/.7=-4.857, CVaR=-.4/.2=-2
    # -> (1.5*-2-4.857)/2.5=-3.1429 -> /1.58114 = -1.9877.
    got = with_tracked(f32(0.0, 4.0))
    close(got[jnp.array([0, 4])], [-1.9877, 0.0], atol=1e-3)


# --------------------------------------------------------------------------- #
# 18. XRPO
# --------------------------------------------------------------------------- #


def test_xrpo_golden():
    # METHODS.md: r=[1,1,0,0], s=[-.2,-1,-.5,-.5] -> A+=[0.866,1.228,-0.866,-0.866].
    got = run(ca.xrpo, f32(1, 1, 0, 0), i32(0, 0, 0, 0), num_groups=1, seq_logp=f32(-0.2, -1, -0.5, -0.5))
    close(got, [0.866, 1.228, -0.866, -0.866], atol=1e-3)


def test_xrpo_hand_case_positive_only():
    # r=[1,0] -> GRPO +-.7071; s=[-1,-2], mean -1.5 -> eta=[e^.5, e^-.5]=[1.6487,.60653]
    # -> lambda(1-eta)=[-.6487,.39347] -> bonus [0,.39347] (<= |A|). The bonus lands on the wrong
    # answer: kept only with positive_only=False -> [.7071,-.31364].
    r, g, s = f32(1, 0), i32(0, 0), f32(-1, -2)
    close(run(ca.xrpo, r, g, num_groups=1, seq_logp=s), [0.7071, -0.7071])
    close(run(ca.xrpo, r, g, num_groups=1, seq_logp=s, positive_only=False), [0.7071, -0.31364])
    # The sequence log-likelihood is a constant for the policy gradient.
    grad = jax.jit(jax.grad(lambda sl: ca.xrpo(f32(1, 1, 0, 0), i32(0, 0, 0, 0), num_groups=1, seq_logp=sl).sum()))(
        f32(-0.2, -1, -0.5, -0.5)
    )
    np.testing.assert_array_equal(grad, np.zeros(4))


# --------------------------------------------------------------------------- #
# 19. AsymRE, OPMD, REC
# --------------------------------------------------------------------------- #


def test_asymre_golden_and_hand_case():
    # METHODS.md: r=[1,0] -> baseline .5-.1=.4 -> [.6,-.4].
    close(run(ca.asymre, f32(1, 0), i32(0, 0), num_groups=1), [0.6, -0.4])
    # Own: r=[1,1,0] -> baseline 2/3-.1=.56667 -> [.43333,.43333,-.56667].
    close(run(ca.asymre, f32(1, 1, 0), i32(0, 0, 0), num_groups=1), [0.43333, 0.43333, -0.56667])


def test_opmd_advantage():
    b = example_batch(5)
    # The mean baseline is Dr. GRPO's advantage.
    close(run(ca.opmd, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"]),
          run(dr_grpo, b["rewards"], b["group_ids"], num_groups=NUM_GROUPS, valid=b["valid"]), atol=1e-6)
    # logmeanexp, tau=1, r=[1,0]: b=log((e+1)/2)=.62011 -> [.37989,-.62011];
    # tau=.5: b=.5 log((e^2+1)/2)=.5*1.43378=.71689 -> [.28311,-.71689].
    close(run(ca.opmd, f32(1, 0), i32(0, 0), num_groups=1, baseline="logmeanexp"), [0.37989, -0.62011])
    close(run(ca.opmd, f32(1, 0), i32(0, 0), num_groups=1, baseline="logmeanexp", tau=0.5), [0.28311, -0.71689])
    # Large rewards do not overflow (max-shifted logsumexp).
    assert np.isfinite(np.asarray(run(ca.opmd, f32(1e4, 0), i32(0, 0), num_groups=1, baseline="logmeanexp", tau=0.1))).all()


def test_rec_loss_masks_and_detaches_the_ratio():
    # logp=log .5, old=log .25 -> ratio 2. A=+1 with ratio 2 > 1.2 leaves the one-sided range (masked);
    # A=-1 with ratio 2 >= .8 stays: l=-(-1) log .5=-.69315. Two-sided masks both; "none" keeps both.
    logp = jnp.full((2, 1), math.log(0.5), jnp.float32)
    old = jnp.full((2, 1), math.log(0.25), jnp.float32)
    adv, mask = f32(1.0, -1.0), jnp.ones((2, 1), jnp.float32)
    loss, metrics = run(rec, logp, old, adv, mask)
    close(loss[:, 0], [0.0, -0.69315])
    close(metrics["clip_fraction"], 0.5)
    close(run(rec, logp, old, adv, mask, clip_mode="two_sided")[0][:, 0], [0.0, 0.0])
    close(run(rec, logp, old, adv, mask, clip_mode="none")[0][:, 0], [0.69315, -0.69315])
    # The gradient is -A on kept tokens (no importance weight, ratio detached) and 0 on masked ones.
    grad = jax.jit(jax.grad(lambda lp: rec(lp, old, adv, mask)[0].sum()))(logp)
    close(grad[:, 0], [0.0, 1.0])


def test_opmd_loss():
    # l = -A log pi / (1 + tau): A=1, pi=.5, tau=1 -> .34657; gradient -A/(1+tau) = -.5.
    logp = jnp.full((1, 2), math.log(0.5), jnp.float32)
    mask = f32(1, 0)[None]
    loss, _ = run(opmd_loss, logp, logp, f32(1.0), mask)
    close(loss, [[0.34657, 0.0]])
    close(jax.jit(jax.grad(lambda lp: opmd_loss(lp, logp, f32(1.0), mask)[0].sum()))(logp), [[-0.5, 0.0]])


# --------------------------------------------------------------------------- #
# Properties shared by every kernel
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", list(KERNELS))
@settings(max_examples=25, deadline=None)
@given(batch=fixed_batches())
def test_finite_for_random_batches_with_degenerate_groups(name, batch):
    out = np.asarray(_JITTED[name](batch))
    valid = np.asarray(batch["valid"])
    assert out.shape == (N,)
    if name == "mc_grpo_pivot_mask":
        assert not (out & ~valid).any(), "the loss mask keeps an invalid row"
        return
    assert np.isfinite(out).all(), f"{name} gave {out}"
    assert (out[~valid] == 0).all(), "invalid rows must get 0"


@pytest.mark.parametrize("name", ["mc_grpo", "bnpo", "dgpo", "stratified_grpo", "seed_grpo", "opmd", "opmd_logmeanexp"])
def test_single_row_and_constant_groups_get_zero(name):
    # Group 0 has one valid row, group 1 is constant, group 2 is fully invalid.
    batch = example_batch()
    batch["group_ids"] = i32(0, 1, 1, 1, 2, 2, *([3] * 10))
    batch["valid"] = jnp.asarray([True, True, True, True, False, False] + [True] * 10)
    batch["rewards"] = f32(0.3, 1, 1, 1, 5, 6, *np.linspace(0, 1, 10))
    out = np.asarray(run(KERNELS[name], batch))
    np.testing.assert_array_equal(out[:6], np.zeros(6))


@pytest.mark.parametrize("name", list(KERNELS))
def test_sharded_matches_unsharded(name, mesh_2x4):
    # Both sides jitted (the unsharded one on default placement) so the test compiles instead of dispatching op by op.
    assert_sharded_matches(lambda **b: _JITTED[name](b), example_batch(6), mesh_2x4, atol=1e-5)


@st.composite
def fixed_token_batches(draw, n=6, t=5):
    """(logp, old_logp, mask) f32[6, 5] with fully masked rows possible, and advantages f32[6] (zeros included)."""
    logps = st.floats(-30.0, 0.0, width=32)
    logp = np.array(draw(st.lists(logps, min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    old = np.array(draw(st.lists(logps, min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    mask = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    adv = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, -1.0]) | st.floats(-1e3, 1e3, width=32),
                                 min_size=n, max_size=n)), np.float32)
    return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)


_LOSSES = {
    "rec_one_sided": jax.jit(lambda *a: rec(*a)),
    "rec_two_sided": jax.jit(lambda *a: rec(*a, clip_mode="two_sided")),
    "rec_none": jax.jit(lambda *a: rec(*a, clip_mode="none")),
    "opmd": jax.jit(lambda *a: opmd_loss(*a)),
}


@pytest.mark.parametrize("name", list(_LOSSES))
@settings(max_examples=25, deadline=None)
@given(batch=fixed_token_batches())
def test_losses_finite_and_zero_where_masked(name, batch):
    logp, old, adv, mask = batch
    loss, metrics = _LOSSES[name](logp, old, adv, mask)
    loss = np.asarray(loss)
    assert np.isfinite(loss).all() and all(np.isfinite(np.asarray(v)) for v in metrics.values())
    assert (loss[np.asarray(mask) == 0] == 0).all()


def _token_batch(seed=0, t=6):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(-rng.uniform(0.05, 3.0, size=(N, t)).astype(np.float32))
    old = logp + jnp.asarray(rng.normal(scale=0.2, size=(N, t)).astype(np.float32))
    lengths = rng.integers(0, t + 1, size=N)
    mask = jnp.asarray((np.arange(t)[None] < lengths[:, None]).astype(np.float32))
    return logp, old, mask


def _losses_for_every_mode(per_token_loss_fn, logp, old, adv, mask):
    def total(lp):
        per_token, _ = per_token_loss_fn(lp, old, adv, mask)
        return jnp.stack([aggregate(per_token, mask, mode)[0] for mode in AGGREGATION_MODES])

    losses = total(logp)
    grad = jax.grad(lambda lp: total(lp).sum())(logp)
    return losses, grad


@pytest.mark.parametrize("name", ADVANTAGE_KERNELS)
def test_advantage_composes_with_ppo_clip_and_every_aggregation_mode(name):
    batch = example_batch(7)
    logp, old, mask = _token_batch(7)

    @jax.jit
    def compose(batch, logp, old, mask):
        adv = KERNELS[name](batch)
        token_mask = mask * batch["valid"][:, None]
        if name == "mc_grpo":
            token_mask = token_mask * KERNELS["mc_grpo_pivot_mask"](batch)[:, None]
        if name == "dgpo":
            adv = adv * KERNELS["dgpo_question_weights"](batch)
        return _losses_for_every_mode(ppo_clip, logp, old, adv, token_mask)

    losses, grad = compose(batch, logp, old, mask)
    assert losses.shape == (len(AGGREGATION_MODES),)
    assert np.isfinite(np.asarray(losses)).all() and np.isfinite(np.asarray(grad)).all()
    assert np.abs(np.asarray(grad)).sum() > 0, "some token must receive a gradient"


@pytest.mark.parametrize("loss_name", ["rec", "opmd"])
def test_losses_compose_with_every_aggregation_mode(loss_name):
    batch = example_batch(8)
    logp, old, mask = _token_batch(8)
    loss_fn = info("loss", loss_name).fn

    @jax.jit
    def compose(batch, logp, old, mask):
        adv = KERNELS["asymre"](batch)
        return _losses_for_every_mode(loss_fn, logp, old, adv, mask * batch["valid"][:, None])

    losses, grad = compose(batch, logp, old, mask)
    assert np.isfinite(np.asarray(losses)).all() and np.isfinite(np.asarray(grad)).all()
    # token_mean equals the hand-computed masked mean of the per-token losses.
    per_token, _ = run(lambda: loss_fn(logp, old, KERNELS["asymre"](batch), mask * batch["valid"][:, None]))
    m = np.asarray(mask * batch["valid"][:, None])
    close(losses[0], (np.asarray(per_token) * m).sum() / m.sum(), atol=1e-5)
