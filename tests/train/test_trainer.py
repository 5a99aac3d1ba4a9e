"""The GRPO loop end to end on the offline toy task: learning, exact resume (every experiment file:
tests/test_experiments_reproduce_metrics.py)."""

import glob
import json
import logging
import os

import jax
import numpy as np
import pytest

from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.errors import ConfigError
from jaxgrpo.models import packing
from jaxgrpo.run.metrics import read_jsonl
from jaxgrpo.train import Trainer
from jaxgrpo.train.batch import packed_trees
from jaxgrpo.train.warmup import supervised_warmup

from tests.support import kill_resume
from tests.support.paths import REPO_ROOT
from tests.support.references import greedy_without_cache
from tests.support.updates import host_params, on_device, packed_and_padded

ROOT = REPO_ROOT
EXPERIMENTS = os.path.join(ROOT, "experiments")
TOY = os.path.join(EXPERIMENTS, "toy_sum.py")

# Method-defining overrides on top of the toy experiment.
METHODS = {
    "grpo": [],
    "dr_grpo": ["advantage=dr_grpo", "aggregation=seq_mean_token_sum_norm"],
    "dapo": ["loss_kwargs={'eps_low': 0.2, 'eps_high': 0.28}", "aggregation=token_mean",
             "group_filter=dynamic_sampling_filter"],
}


def toy_config(tmp_path, *overrides):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path / 'run'}", *overrides])
    return cfg


def params_of(trainer):
    return jax.tree.map(np.asarray, trainer.state.params)


def collapse_warnings(caplog) -> list[str]:
    """The loop's collapse warnings (`jaxgrpo.train.health`) among the captured log records."""
    signs = ("may have collapsed", "without a stop token")
    return [r.getMessage() for r in caplog.records
            if r.name == "jaxgrpo.train.health" and any(s in r.getMessage() for s in signs)]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_mean_reward_rises_on_the_toy_task(method, tmp_path, caplog):
    """After a short supervised warm-up, 40 GRPO steps clearly raise the accuracy (same seed: deterministic),
    and the run gives no collapse warning. (The toy's 60 steps raise it by 0.28-0.35 from the first 15 steps'
    mean to the last 15's; 40 by 0.25-0.30 from the first 10's to the last 10's.)"""
    cfg = toy_config(tmp_path, "task.num_eval_examples=0", "checkpoint_every=0", "steps=40", *METHODS[method])
    trainer = Trainer(cfg)
    with caplog.at_level(logging.WARNING, logger="jaxgrpo.train.health"):
        history = trainer.run(progress=False)
    assert collapse_warnings(caplog) == []
    accuracy = np.array([h["accuracy"] for h in history])
    first, last = accuracy[:10].mean(), accuracy[-10:].mean()
    assert last > first + 0.15, f"{method}: accuracy {first:.3f} -> {last:.3f}"
    assert all(np.isfinite(h["loss"]) for h in history)
    if method == "dapo":
        assert max(h["sampling_rounds"] for h in history) > 1  # zero-signal groups were resampled
    # The rollout engine sampled every step: one policy version per update after the first step's, every block
    # back in the pool; sampling again swaps the last update's weights in (the trainer's own arrays, no copy).
    engine = trainer._engine
    assert engine.version == 39 and engine.blocks_in_use == 0
    examples = trainer.train_examples[:24]
    by_engine = trainer.generate(examples, 1, jax.random.key(0), greedy=True)
    params = {id(x) for x in jax.tree.leaves(trainer.state.params)}
    assert engine.version == 40 and all(id(x) in params for x in jax.tree.leaves(engine._state))
    # The trained policy's greedy completions are the argmax of its full forwards, up to the first stop token.
    expected = greedy_without_cache(trainer.policy.decoder, [trainer.prompt_ids(e) for e in examples],
                                    cfg.sampling.max_new_tokens)
    for tokens, mask, reference in zip(np.asarray(by_engine.completion_tokens), np.asarray(by_engine.completion_mask),
                                       expected):
        stops = np.flatnonzero(np.isin(reference, trainer.stop_tokens))
        np.testing.assert_array_equal(tokens[mask], reference[:stops[0] + 1 if stops.size else len(reference)])


def sevens(completions, examples):
    """The number of 7s in a completion: the most, 2, only for "77", which fills the toy's budget of 2 tokens."""
    return np.array([c.count("7") for c in completions], np.float32)


def test_a_run_driven_to_collapse_warns_once_of_each_sign(tmp_path, caplog):
    """Rewarded for one completion, "77", that fills the token budget, and never correct, at a learning rate of
    0.1 the toy policy collapses within a few steps: entropy 0 while accuracy is no better than at the start,
    every completion cut off at the cap. Each sign is warned about once, in one line naming the step and a fix,
    and the run goes on. (The reward makes both signs the policy's goal, so the run reaches them whatever it
    samples.)"""
    cfg = toy_config(tmp_path, "task.num_eval_examples=0", "checkpoint_every=0", "steps=8", "optimizer.lr=0.1",
                     "collapse_window=3", "max_steps_without_signal=0", "correctness_reward=always_wrong")
    with caplog.at_level(logging.WARNING, logger="jaxgrpo.train.health"):
        history = Trainer(cfg, reward_fns=[(always_wrong, 1.0), (sevens, 1.0)]).run(progress=False)
    assert len(history) == 8 and max(h["entropy"] for h in history[-3:]) < 0.1
    entropy, truncation = (w for w in sorted(collapse_warnings(caplog), key=lambda m: "entropy" not in m))
    assert "mean token entropy" in entropy and "collapse_entropy=0.1" in entropy and "optimizer.lr" in entropy
    assert "sampling.max_new_tokens=2" in truncation
    assert all("\n" not in w and w.startswith("step ") for w in (entropy, truncation))


def test_metrics_plots_evaluation_and_a_profile_are_written(tmp_path):
    cfg = toy_config(tmp_path, "steps=4", "eval_every=2", "task.num_eval_examples=16", "eval_pass_k=4", "checkpoint_every=2")
    trainer = Trainer(cfg)
    trainer.run(progress=False, profile=1)
    run = tmp_path / "run"
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_std", "accuracy", "frac_all_correct", "frac_all_wrong", "entropy",
                "clip_fraction", "completion_length", "logp_gap", "sample_tokens_per_s", "train_tokens_per_s",
                "time_sample", "time_train", "grad_norm"):
        assert all(np.isfinite(r[key]) for r in records), key
    # Sampler and trainer share one graph: their log-probs agree before the first update.
    assert records[0]["logp_gap"] < 1e-4
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert {"greedy_accuracy", "pass@1", "pass@4"} <= set(evals[-1])
    assert os.listdir(run / "tensorboard")
    from jaxgrpo.tools.cli import plot_main

    assert plot_main([str(run)]) == 0
    pngs = os.listdir(run / "plots")
    assert "reward.png" in pngs and "evaluation.png" in pngs
    assert sorted(int(d) for d in os.listdir(run / "checkpoints") if d.isdigit()) == [2, 4]

    # profile=1: step 2 (step 1 compiles; step 2 also evaluates and saves) traced, with where it went.
    profile = run / "profile" / "steps_2-2"
    summary = json.loads((profile / "summary.json").read_text())
    assert summary["steps"] == [2, 2]
    # (no "score": this run takes its old log-probs from the sampler and has no reference model)
    assert {"sample", "reward", "update", "evaluate", "checkpoint"} <= set(summary["phases"])
    assert sum(summary["phases"].values()) <= summary["wall_seconds"] * 1.01  # the phases do not nest
    assert {"jit_update", "jit_engine_forward", "jit_engine_decode"} <= set(summary["programs"])  # the engine samples
    assert {"MLP (gate, up, down)", "MLP (gate, up, down) (backward)", "sampling (temperature, truncation, draw)",
            "optimizer (AdamW update)"} <= set(summary["parts"])
    assert sum(summary["parts"].values()) == pytest.approx(sum(summary["programs"].values()))
    table = (profile / "summary.md").read_text()
    assert "| update |" in table and "| jit_update |" in table and "| MLP (gate, up, down) |" in table
    assert glob.glob(str(profile / "**" / "*.xplane.pb"), recursive=True)  # the trace itself, for Perfetto/TensorBoard
    with pytest.raises(ConfigError, match="profile=1 traces steps 6-6 .* the run ends at step 4"):
        trainer.run(resume=True, progress=False, profile=1)  # nothing left to trace after the restored step 4


def test_micro_batches_give_the_full_batch_update(tmp_path):
    """Accumulating gradients over 4 micro-batches equals one full-batch update (aggregation parts)."""
    cfg = toy_config(tmp_path, "steps=1", "warmup_sft_steps=5", "task.num_eval_examples=0", "aggregation=token_mean")
    trainer = Trainer(cfg)
    cfg = trainer.cfg  # the config the trainer runs (packing settled for this platform): changed below
    state, _ = supervised_warmup(trainer, trainer.loop_state, cfg.warmup_sft_steps)
    rollout, state, _ = trainer.rollout(state, jax.random.key(3))
    assert (rollout.policy_version == 0).all() and state.data_position == cfg.prompts_per_step
    np.testing.assert_array_equal(rollout.token_turns, np.where(rollout.completion_mask > 0, 0, -1))  # one turn
    batch = trainer.advantages(state, rollout)
    start = jax.tree.map(np.array, state.train)
    full, full_metrics = trainer.update(on_device(trainer, start), batch)  # the update donates its input
    cfg.micro_batch_size = cfg.batch_size // 4
    micro, micro_metrics = trainer.update(on_device(trainer, start), batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), *host_params(full, micro))
    # The minibatch's loss, and its policy loss (the loss without a value head: a sum of the micro-batches'
    # shares, not a token-weighted mean of them, which had read a quarter of it here), whatever the split.
    for metrics in (full_metrics, micro_metrics):
        np.testing.assert_allclose(metrics["policy_loss"], full_metrics["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(full_metrics["loss"], micro_metrics["loss"], rtol=1e-5, atol=1e-7)
    assert not np.allclose(jax.tree.leaves(host_params(full)[0])[0], jax.tree.leaves(start.params)[0])


@pytest.mark.parametrize("overrides", [[], ["kl_coef=0.05", "entropy_coef=0.01", "num_minibatches=2"]],
                         ids=["grpo", "kl_entropy_minibatches"])
def test_packed_groups_give_the_padded_update(tmp_path, overrides):
    """Scoring packed prompt groups (the default) gives the update of scoring padded rows."""
    cfg = toy_config(tmp_path, "steps=1", "warmup_sft_steps=5", "task.num_eval_examples=0", "micro_batch_size=16",
                     *overrides)
    trainer = Trainer(cfg)
    cfg = trainer.cfg  # the config the trainer runs (packing settled for this platform): changed below
    assert cfg.packing  # on a CPU the default packs
    state, _ = supervised_warmup(trainer, trainer.loop_state, cfg.warmup_sft_steps)
    rollout, state, _ = trainer.rollout(state, jax.random.key(3))
    rollout = rollout._replace(kept=rollout.kept & (rollout.group_ids != 1))  # a group that does not train
    batch = trainer.advantages(state, rollout)
    # The prompt once and the completions unpadded: fewer slots than the padded rows.
    trees = packed_trees(cfg, batch)
    assert trees.size == cfg.group_size  # a group's rows hold one prompt: one tree each
    rows, plan = packing.plan_rows(np.arange(cfg.batch_size), trees.lengths, trees.size, 16)
    assert plan.rows * plan.length * (cfg.batch_size // 16) < batch.tokens.size
    start = jax.tree.map(np.array, state.train)
    (packed, packed_metrics), (padded, padded_metrics) = packed_and_padded(trainer, start, batch)
    cfg.packing = False
    assert packed_trees(cfg, batch) is None
    # Adam divides by the gradient's scale, so rounding in a near-zero gradient can move a weight by ~1e-5.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4), *host_params(packed, padded))
    for key in ("loss", "policy_loss", "entropy", "logp_gap", "grad_norm") + (("kl",) if cfg.kl_coef else ()):
        np.testing.assert_allclose(packed_metrics[key], padded_metrics[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_packing_needs_micro_batches_of_whole_groups(tmp_path):
    # Micro-batches of 8 rows split over the tests' 8 devices, and hold no whole group of 16.
    with pytest.raises(ValueError, match="do not hold whole groups of group_size=16.*packing=false"):
        Trainer(toy_config(tmp_path, "group_size=16", "micro_batch_size=8"))
    Trainer(toy_config(tmp_path, "group_size=16", "micro_batch_size=8", "packing=false"))


#: 4 steps with a checkpoint each; the killed run dies once step 2 is on disk.
_RESUME_OVERRIDES = ["steps=4", "checkpoint_every=1", "warmup_sft_steps=2", "eval_every=0", "task.num_eval_examples=0"]


def test_resume_after_sigkill_is_exact(tmp_path):
    """4 steps straight == 2 steps, SIGKILL, --resume to 4: same parameters and same metrics for steps 3-4."""
    script = kill_resume.experiment_script(TOY, _RESUME_OVERRIDES, kill_after=2)
    straight, killed, steps_at_kill = kill_resume.straight_and_killed(tmp_path, script)
    assert steps_at_kill == 2
    assert [r["step"] for r in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    assert kill_resume.comparable(straight)[2:] == kill_resume.comparable(killed)[2:]
    jax.tree.map(np.testing.assert_array_equal, kill_resume.checkpoint(straight, 4)["train"]["params"],
                 kill_resume.checkpoint(killed, 4)["train"]["params"])


def always_wrong(completions, examples):
    return np.zeros(len(completions), np.float32)


def test_a_step_without_signal_trains_nothing_and_still_reports_its_samples(tmp_path):
    """Dynamic sampling finds no group with signal in any round: no row trains (zero gradient), and the
    reward metrics describe the rows that were sampled and scored instead of going NaN."""
    cfg = toy_config(tmp_path, "steps=1", "warmup_sft_steps=0", "task.num_eval_examples=0", "checkpoint_every=0",
                     "group_filter=dynamic_sampling_filter", "max_sampling_rounds=2", "sampling.max_new_tokens=3",
                     "correctness_reward=always_wrong")
    (record,) = Trainer(cfg, reward_fns=[(always_wrong, 1.0)]).run(progress=False)
    assert record["sampling_rounds"] == 2
    assert record["frac_trained_rows"] == 0.0 and record["grad_norm"] == 0.0
    assert record["reward_mean"] == 0.0 and record["accuracy"] == 0.0 and record["frac_all_wrong"] == 1.0


def test_log_every_writes_every_nth_steps_metrics_and_the_last(tmp_path):
    """`log_every=2` over 3 steps: metrics.jsonl holds steps 2 and 3; the run still returns (and checks) each."""
    cfg = toy_config(tmp_path, "steps=3", "log_every=2", "warmup_sft_steps=0", "task.num_eval_examples=0",
                     "checkpoint_every=0", "sampling.max_new_tokens=3")
    history = Trainer(cfg).run(progress=False)
    assert [r["step"] for r in history] == [1, 2, 3]
    written = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in written] == [2, 3]
    assert written[0] == history[1] and written[1] == history[2]


def test_unbiased_kl_receives_the_sampling_log_probs(tmp_path):
    """kl_kind=k3_unbiased weights k3 by pi / pi_old: the update passes the sampler's log-probs (it used to raise
    'needs old_logp' inside the first update, after sampling)."""
    cfg = toy_config(tmp_path, "steps=1", "warmup_sft_steps=0", "task.num_eval_examples=0", "checkpoint_every=0",
                     "sampling.max_new_tokens=3", "kl_coef=0.1", "kl_kind=k3_unbiased")
    (record,) = Trainer(cfg).run(progress=False)
    assert np.isfinite(record["loss"]) and np.isfinite(record["kl"]) and record["kl"] >= 0


def test_prompts_must_split_evenly_over_the_processes(tmp_path, monkeypatch):
    """Each host reads a block of whole groups: prompts_per_step must divide by the process count."""
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    with pytest.raises(ValueError, match="prompts_per_step=8 is not divisible by the 3 processes"):
        Trainer(toy_config(tmp_path))
