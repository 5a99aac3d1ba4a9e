"""One-step-off rollouts (`max_staleness=1`) on the offline toy task: each step learns from the rollout the policy
one update back sampled while the previous step learned; the PPO ratio is anchored at the learner's own log-probs,
the behaviour's feed the importance correction; the behaviour policy is in the loop state, so a resumed run is the
uninterrupted one. `max_staleness=0` is the synchronous loop (its recorded metrics: test_experiments_reproduce_metrics)."""

import os

import jax
import numpy as np
import pytest

from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.errors import ConfigError
from jaxgrpo.train import Trainer
from tests.support.experiment_metrics import first_char_parity
from tests.support.paths import REPO_ROOT

TOY = os.path.join(REPO_ROOT, "experiments", "toy_sum.py")
TIMING = ("time_", "tokens_per_s")


def toy(tmp_path, *overrides):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path / 'run'}", "warmup_sft_steps=5", "task.num_eval_examples=0",
                          "prompts_per_step=4", "group_size=4", "max_staleness=1", *overrides])
    return cfg


#: A reward nearly every group of the toy's samples splits on (`first_char_parity`), so every step has a gradient
#: and the policy moves each update whatever the run draws; the toy's own sums are right 1 time in 45 at first.
SIGNAL = ["correctness_reward=first_char_parity"]


def with_signal(cfg):
    """A trainer of `cfg` (made with `SIGNAL` among its overrides) rewarded by `first_char_parity`."""
    return Trainer(cfg, reward_fns=[(first_char_parity, 1.0)])


def comparable(records):
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


def test_each_step_learns_from_the_policy_one_update_back_while_the_next_is_sampled(tmp_path):
    trainer = with_signal(toy(tmp_path, "steps=4", "checkpoint_every=0", *SIGNAL))
    first = trainer.loop_state
    assert first.behaviour is not None and first.behaviour is not first.train.params  # its own copy
    history = trainer.run(progress=False)
    # The first step's rollout was sampled by the learner's own policy; every later one by the policy before it.
    assert [r["staleness_max"] for r in history] == [0, 1, 1, 1]
    assert all(np.isfinite(r["behaviour_logp_gap"]) for r in history)
    assert history[0]["behaviour_logp_gap"] < 1e-4 < history[-1]["behaviour_logp_gap"]
    assert all(r["logp_gap"] < 1e-4 for r in history)  # the ratio's anchor is the learner's log-probs
    # Overlap: step t + 1's sampling started before step t's learning ended, and ended after it started.
    for now, after in zip(history[:-1], history[1:]):
        assert after["time_at_sample_start"] < now["time_at_learn_end"], (now, after)
        assert after["time_at_sample_end"] > now["time_at_learn_start"]
    state = trainer.loop_state
    assert state.step == 4 and state.behaviour is not None
    # The state's behaviour policy is the learner's one update back: different weights, the same structure.
    moved = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b)), state.behaviour,
                         state.train.params)
    assert any(jax.tree.leaves(moved))


def test_the_importance_correction_weighs_by_the_learner_over_the_behaviour_policy(tmp_path, monkeypatch):
    """TIS on one-step-off data: each token's advantage times min(pi_learner / pi_behaviour, 2), by hand."""
    trainer = Trainer(toy(tmp_path, "steps=4", "checkpoint_every=0", "prompts_per_step=8", "token_credit=importance_correction",
                          "token_credit_kwargs={'level': 'token', 'mode': 'truncate', 'threshold': 2.0}"))
    trainer.run(progress=False)
    state = trainer.loop_state  # step 4: the learner four steps in, the behaviour policy three
    rollout, _, _ = trainer.rollout(state)
    assert (rollout.policy_version == 3).all()
    batch = trainer.advantages(state, rollout)
    mask = np.asarray(batch.completion_mask) > 0
    learner = trainer.logprobs(state.train.params, batch.tokens, batch.attention_mask, batch.positions, mask.shape[1])
    np.testing.assert_allclose(np.asarray(batch.old_logp)[mask], np.asarray(learner)[mask], atol=1e-6)
    monkeypatch.setattr(trainer.cfg, "token_credit", None)
    plain = np.asarray(trainer.advantages(state, rollout).advantages)
    weights = np.minimum(np.exp(np.asarray(learner) - rollout.sampler_logp), 2.0)
    np.testing.assert_allclose(np.asarray(batch.advantages)[mask], (plain * weights)[mask], rtol=1e-5, atol=1e-6)
    assert not np.allclose(weights[mask], 1.0)  # the behaviour policy is really another one
    metrics = {}  # the correction's own statistics, logged with the step's metrics
    trainer.cfg.token_credit = "importance_correction"
    trainer.advantages(state, rollout, metrics=metrics)
    assert metrics["is_weight_mean"] == pytest.approx(np.exp(np.asarray(learner) - rollout.sampler_logp)[mask].mean(),
                                                     rel=1e-4)
    assert 0.0 <= metrics["is_clipped_fraction"] <= 1.0


def test_a_resumed_one_step_off_run_is_the_uninterrupted_run(tmp_path):
    """The behaviour policy is checkpointed with the learner: the rollout in flight at a checkpoint is sampled
    again, identically, after a restart."""
    uninterrupted = Trainer(toy(tmp_path / "a", "steps=4", "checkpoint_every=2")).run(progress=False)
    Trainer(toy(tmp_path / "b", "steps=2", "checkpoint_every=2")).run(progress=False)  # stops after a checkpoint
    resumed = Trainer(toy(tmp_path / "b", "steps=4", "checkpoint_every=2"))
    rest = resumed.run(resume=True, progress=False)
    assert [r["step"] for r in rest] == [3, 4]
    got, want = comparable(rest), comparable(uninterrupted[2:])
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key in w:
            np.testing.assert_allclose(g[key], w[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_on_a_split_mesh_the_sampler_has_devices_and_weights_of_its_own(tmp_path):
    """8 devices split 4 + 4 (`mesh.rollout_devices=4`): the learner's state on the first four, the behaviour
    policy's weights moved after each update to the last four, where the sampler runs."""
    trainer = with_signal(toy(tmp_path, "steps=3", "checkpoint_every=0", "mesh.rollout_devices=4", *SIGNAL))
    devices = jax.devices()
    assert len(devices) == 8
    learner, sampler = set(devices[:4]), set(devices[4:])
    assert set(trainer.mesh.devices.flat) == learner and set(trainer.rollout_mesh.devices.flat) == sampler

    def on(tree):
        return set().union(*(leaf.devices() for leaf in jax.tree.leaves(tree)))

    assert on(trainer.loop_state.behaviour) == sampler and on(trainer.loop_state.train) == learner
    history = trainer.run(progress=False)
    assert [r["staleness_max"] for r in history] == [0, 1, 1]
    assert all(np.isfinite(r["loss"]) for r in history)
    state = trainer.loop_state
    assert on(state.behaviour) == sampler and on(state.train) == learner
    # The behaviour policy is the learner one update back, moved: not the learner's weights, on other devices.
    moved = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b)), state.behaviour,
                         state.train.params)
    assert any(jax.tree.leaves(moved))
    out = trainer.generate(trainer.train_examples[:2], 2, jax.random.key(0), greedy=True)  # evaluation's path
    assert on(out.completion_tokens) <= sampler


@pytest.mark.parametrize("overrides, message", [
    (["mesh.rollout_devices=8"], "mesh.rollout_devices=8 leaves the learner none of the 8 device"),
    (["mesh.rollout_devices=2", "max_staleness=0"], "mesh.rollout_devices=2 gives the sampler devices of its own"),
    (["mesh.rollout_devices=-1"], "mesh.rollout_devices must be >= 0"),
])
def test_a_split_that_leaves_a_side_without_devices_is_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as raised:
        Trainer(toy(tmp_path, *overrides))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("value, message", [(-1, "max_staleness must be an integer >= 0"),
                                            (0.5, "max_staleness must be int, got float 0.5")])
def test_a_bad_staleness_is_one_line_before_anything_is_built(tmp_path, value, message):
    cfg = toy(tmp_path)
    cfg.max_staleness = value
    with pytest.raises(ConfigError, match=message) as raised:
        Trainer(cfg)
    assert "\n" not in str(raised.value)


def partial_toy(tmp_path, *overrides):
    """Completions of up to 8 tokens, at most 4 a step: a group with a row still going after 4 waits for the next
    step, where the policy one update later continues it (toy rows rarely stop early, so most groups wait)."""
    return toy(tmp_path, "sampling.max_new_tokens=8", "partial_rollout_tokens=4", "max_staleness=2", *overrides)


def test_partial_rollouts_continue_rows_across_a_weight_swap_with_each_tokens_version(tmp_path, caplog):
    trainer = with_signal(partial_toy(tmp_path, "steps=5", "checkpoint_every=0", *SIGNAL))
    history = trainer.run(progress=False)
    # A step whose groups all go on trains no row, and is not warned about as a step without signal.
    all_carried = [r["step"] for r in history if r["rows_carried"] == 16]
    assert all_carried  # this seed has steps whose every group went on
    for step in all_carried:
        assert history[step - 1]["frac_trained_rows"] == 0 and f"step {step} trained no row" not in caplog.text
    assert all(r["rows_carried"] % 4 == 0 for r in history)  # whole groups wait
    assert any(r["rows_carried"] > 0 for r in history) and any(r["frac_trained_rows"] > 0 for r in history)
    assert max(r["staleness_max"] for r in history) == 2  # a carried row's first tokens: two updates back
    assert all(r["num_invalid_rewards"] == 0 for r in history)  # rows still going are not invalid
    state = trainer.loop_state
    carried = state.partial
    assert carried is not None and (carried.carries == 1).all()  # carried once at most (max_staleness - 1)
    rollout, after, _ = trainer.rollout(state)  # continues them: by the behaviour policy of step 3, first
    g = 4
    waiting = len(carried.positions)
    assert after.data_position == state.data_position + 4 - waiting  # only the free slots take new prompts
    versions = rollout.token_versions
    on = rollout.completion_mask > 0
    assert ((versions >= 0) == on).all()
    continued = versions[: waiting * g]
    # The carried rows' first tokens are the old policy's, the rest the new one's; each keeps its own log-probs.
    np.testing.assert_array_equal(continued[:, :4][carried.versions[:, :4] >= 0], carried.versions[:, :4][carried.versions[:, :4] >= 0])
    assert (continued[:, :4][on[: waiting * g, :4]] == state.step - 2).all()
    assert (continued[:, 4:][on[: waiting * g, 4:]] == state.step - 1).all()
    np.testing.assert_array_equal(rollout.sampler_logp[: waiting * g, :4], carried.logp[:, :4])
    np.testing.assert_array_equal(rollout.completion_tokens[: waiting * g, :4], carried.tokens[:, :4])
    assert rollout.trains[: waiting * g].all()  # a group carried once ends this step and trains
    assert (rollout.policy_version[: waiting * g] == state.step - 2).all()  # a row's version: its oldest token's


# Slow tier (`-m slow`); in CI instead: partial rollouts:
# test_partial_rollouts_continue_rows_across_a_weight_swap_with_each_tokens_version; resume:
# test_a_resumed_one_step_off_run_is_the_uninterrupted_run
@pytest.mark.slow
def test_a_run_with_partial_rollouts_resumes_with_its_carried_groups(tmp_path):
    uninterrupted = Trainer(partial_toy(tmp_path / "a", "steps=5", "checkpoint_every=3")).run(progress=False)
    first = Trainer(partial_toy(tmp_path / "b", "steps=3", "checkpoint_every=3"))
    first.run(progress=False)
    assert first.loop_state.partial is not None  # the checkpoint holds groups in flight
    rest = Trainer(partial_toy(tmp_path / "b", "steps=5", "checkpoint_every=3")).run(resume=True, progress=False)
    assert [r["step"] for r in rest] == [4, 5] and any(r["rows_carried"] for r in uninterrupted[:3])
    got, want = comparable(rest), comparable(uninterrupted[3:])
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for key in w:
            np.testing.assert_allclose(g[key], w[key], rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("overrides, message", [
    (["partial_rollout_tokens=8"], "partial_rollout_tokens=8 is not below sampling.max_new_tokens=8"),
    (["max_staleness=1"], "set max_staleness >= 2"),
    (["partial_rollout_tokens=2"], "partial_rollout_tokens=2 x max_staleness=2 is below sampling.max_new_tokens=8"),
    (["group_filter=dynamic_sampling_filter"], "does not combine with group_filter"),
    (["partial_rollout_tokens=-1"], "partial_rollout_tokens must be >= 0"),
])
def test_a_partial_rollout_config_that_cannot_run_is_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as raised:
        Trainer(partial_toy(tmp_path, *overrides))
    assert "\n" not in str(raised.value)


def test_a_correction_stage_refuses_trajectories_without_behaviour_logprobs_in_one_line(tmp_path):
    """Trajectories sampled elsewhere, with no behaviour log-probs recorded (`sampler_logp=None`): a correction
    stage, which reads them, refuses them before any forward; without one they train anchored at the learner's."""
    trainer = Trainer(toy(tmp_path, "max_staleness=0", "token_credit=importance_correction",
                          "token_credit_kwargs={'level': 'token', 'mode': 'truncate', 'threshold': 2.0}"))
    state = trainer.loop_state
    rollout, _, _ = trainer.rollout(state)
    logged = rollout._replace(sampler_logp=None)
    with pytest.raises(ConfigError, match="token_credit 'importance_correction' reads sampler_logp, the behaviour "
                                          "policy's log-probs, but these trajectories carry none") as raised:
        trainer.advantages(state, logged)
    assert "\n" not in str(raised.value)
    trainer.cfg.token_credit, trainer.cfg.token_credit_kwargs = None, {}
    batch = trainer.advantages(state, logged)
    mask = np.asarray(batch.completion_mask) > 0
    learner = trainer.logprobs(state.train.params, batch.tokens, batch.attention_mask, batch.positions, mask.shape[1])
    np.testing.assert_array_equal(np.asarray(batch.old_logp)[mask], np.asarray(learner)[mask])
    # The learner is the policy that sampled them here, so the anchor matches the sampler's own log-probs.
    np.testing.assert_allclose(np.asarray(batch.old_logp)[mask], rollout.sampler_logp[mask], atol=1e-5)


@pytest.mark.parametrize("overrides, message", [
    ([], "max_staleness=1 in a multi-process run samples on devices of each process's own; set mesh.rollout_devices"),
    (["mesh.rollout_devices=3"], "mesh.rollout_devices=3 does not split evenly over the 2 processes"),
    (["mesh.rollout_devices=2", "group_filter=dynamic_sampling_filter"],
     "group_filter agrees its sampling rounds across processes"),
    (["mesh.rollout_devices=2", "max_staleness=2", "partial_rollout_tokens=1"], "partial_rollout_tokens runs in one process"),
])
def test_what_multi_process_one_step_off_cannot_run_is_one_line(tmp_path, monkeypatch, overrides, message):
    """A multi-process run (two processes, as `jax.process_count` says; tests/train/test_multihost.py runs real ones)."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=message) as raised:
        Trainer(toy(tmp_path, *overrides))
    assert "\n" not in str(raised.value)


def test_rows_padded_to_wider_widths_train_the_same(tmp_path):
    """Multi-process one-step-off: each process buckets its own rows' widths, and the rows are padded to the widest
    process's for one global batch (`rollout.padded`); the padding changes no advantage or log-prob."""
    from jaxgrpo.train.rollout import padded

    trainer = Trainer(toy(tmp_path, "max_staleness=0"))
    state = trainer.loop_state
    rollout, _, _ = trainer.rollout(state)
    p, c = rollout.prompt_tokens.shape[1], rollout.completion_tokens.shape[1]
    wide = padded(rollout, p + 16, c + 8)
    assert wide.prompt_tokens.shape[1] == p + 16 and wide.completion_tokens.shape[1] == c + 8
    narrow, broad = trainer.advantages(state, rollout), trainer.advantages(state, wide)
    np.testing.assert_array_equal(np.asarray(broad.completion_mask)[:, :c], np.asarray(narrow.completion_mask))
    assert not np.asarray(broad.completion_mask)[:, c:].any()
    np.testing.assert_allclose(np.asarray(broad.advantages)[:, :c], np.asarray(narrow.advantages), atol=1e-6)
    mask = np.asarray(narrow.completion_mask) > 0
    learner = lambda b, n: np.asarray(trainer.logprobs(state.train.params, b.tokens, b.attention_mask, b.positions, n))  # noqa: E731
    np.testing.assert_allclose(learner(broad, c + 8)[:, :c][mask], learner(narrow, c)[mask], atol=1e-5)
    with pytest.raises(ValueError, match="cannot be padded"):
        padded(rollout, p - 1, c)


def test_groups_selected_and_joined_again_are_the_rollout(tmp_path):
    """Dynamic sampling's bookkeeping: groups selected apart (`select_groups`) and joined again (`concat_rollouts`,
    one part padded wider) give the rollout's rows, every field carried (the stamped versions too), regrouped."""
    from jaxgrpo.train.rollout import concat_rollouts, padded, select_groups

    trainer = Trainer(toy(tmp_path, "max_staleness=0"))
    rollout, _, _ = trainer.rollout(trainer.loop_state)
    g, groups = trainer.cfg.group_size, int(rollout.group_ids.max()) + 1
    versions = np.arange(rollout.completion_tokens.size, dtype=np.int32).reshape(rollout.completion_tokens.shape)
    rollout = rollout._replace(token_versions=versions)
    p, c = rollout.prompt_tokens.shape[1], rollout.completion_tokens.shape[1]
    first, rest = select_groups(rollout, np.arange(1)), select_groups(rollout, np.arange(1, groups))
    assert len(first.rewards) == g and first.texts == rollout.texts[:g] and first.examples == rollout.examples[:g]
    joined = concat_rollouts([padded(first, p + 4, c + 2), rest], groups, g)
    again = padded(rollout, p + 4, c + 2)
    for name, want, got in zip(rollout._fields, again, joined):
        if isinstance(want, dict):
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=name)
        elif isinstance(want, list) or want is None:
            assert got == want, name
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert list(concat_rollouts([rest, first], groups - 1, g).group_ids) == list(np.repeat(np.arange(groups - 1), g))
