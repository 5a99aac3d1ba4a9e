"""The trainer on environment episodes (`Config.environment`): multi-turn rows train on the policy's tokens only,
with the behaviour log-probs the trainer recomputes, and held-out episodes are evaluated."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import kernels
from jaxgrpo.config import Config, apply_overrides, load_experiment, validate
from jaxgrpo.envs.games import GuessNumber
from jaxgrpo.errors import ConfigError
from jaxgrpo.models import Decoder, DecoderConfig, registry
from jaxgrpo.models.tokenizer import load_tokenizer
from jaxgrpo.run.metrics import read_jsonl
from jaxgrpo.train import Trainer, inputs, register_model_builder, stages
from jaxgrpo.train.batch import packed_trees
from tests.support.tiny_models import register_two_turn_episodes

from tests.support import kill_resume
from tests.support.paths import REPO_ROOT
from tests.support.updates import host_params, packed_and_padded

TOY = os.path.join(REPO_ROOT, "experiments", "toy_sum.py")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    register_two_turn_episodes()
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path_factory.mktemp('episodes') / 'run'}", "model=random-smollm2-vocab",
                          "environment.name=two_turns", "environment.max_turns=3", "environment.max_context=256",
                          "prompts_per_step=2", "group_size=4", "sampling.max_new_tokens=8",
                          "sampling.max_prompt_len=64", "steps=2", "warmup_sft_steps=0", "checkpoint_every=0",
                          "task.num_eval_examples=3", "eval_every=2", "optimizer.lr=1e-3"])
    return Trainer(cfg)


def test_episode_rows_train_on_the_policys_tokens_with_the_behaviour_log_probs(trainer):
    rollout, _, timings = trainer.rollout(trainer.loop_state, jax.random.key(5))
    assert rollout.completion_valid is not None and timings["episode_turns"] == 2.0
    assert (rollout.policy_version == trainer.loop_state.step).all()
    turns = rollout.token_turns  # each token's turn (a policy turn's, or the observation answering it); padding -1
    np.testing.assert_array_equal(turns >= 0, rollout.completion_valid)
    assert set(np.unique(turns[rollout.completion_mask > 0])) == {0, 1}
    batch = trainer.advantages(trainer.loop_state, rollout)
    prompt_width = rollout.prompt_tokens.shape[1]
    mask = np.asarray(batch.completion_mask) > 0
    attended = np.asarray(batch.attention_mask)[:, prompt_width:]
    observations = attended & ~mask
    assert observations.any(axis=1).all()  # every episode heard "Say it again." after its first turn
    assert (mask <= attended).all() and set(np.unique(rollout.rewards)) <= {0.0, 1.0}
    # The trainer's log-probs of the policy's tokens over whole episodes are the ones the engine sampled with.
    new = trainer.logprobs(trainer.state.params, batch.tokens, batch.attention_mask, batch.positions, mask.shape[1])
    np.testing.assert_allclose(np.asarray(new)[mask], np.asarray(batch.old_logp)[mask], atol=1e-5, rtol=0)
    assert np.abs(np.asarray(batch.old_logp)[~mask]).max() == 0


def test_episode_groups_pack_as_prompt_groups_and_update_as_the_padded_rows(trainer):
    """A group's episodes open with the same messages (the environment's opening of one example), so the batch
    packs as prompt groups, each completion's observation tokens packed inside it (attended, not trained); the
    update equals the padded rows' (the default packs on a CPU, episodes too)."""
    cfg = trainer.cfg
    assert cfg.packing
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(7))
    batch = trainer.advantages(trainer.loop_state, rollout)
    trees = packed_trees(cfg, batch)
    assert trees.size == cfg.group_size and len(trees.lengths) == cfg.prompts_per_step
    assert (np.asarray(batch.advantages) != 0).any()
    start = jax.tree.map(np.array, trainer.loop_state.train)
    (packed, packed_metrics), (padded, padded_metrics) = packed_and_padded(trainer, start, batch)
    # Adam moves a weight by ~lr (1e-3 here) whatever its gradient's scale, so float rounding in a near-zero
    # gradient can move one by a fraction of that (5e-5 seen); a wrong gradient would move it by ~1e-3.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4), *host_params(packed, padded))
    for key in ("loss", "entropy", "logp_gap", "grad_norm"):
        np.testing.assert_allclose(packed_metrics[key], padded_metrics[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert not np.allclose(jax.tree.leaves(host_params(packed)[0])[0], jax.tree.leaves(start.params)[0])


def test_a_run_on_episodes_records_steps_and_held_out_episodes(trainer):
    trainer.run(progress=False)
    records = read_jsonl(os.path.join(trainer.cfg.run_dir, "metrics.jsonl"))
    assert len(records) == 2 and all(np.isfinite(r["loss"]) for r in records)
    assert all(r["episode_turns"] == 2.0 and "reward/environment" in r for r in records)
    evaluations = read_jsonl(os.path.join(trainer.cfg.run_dir, "eval.jsonl"))
    assert [e["step"] for e in evaluations] == [0, 2]
    assert all(0 <= e["greedy_accuracy"] <= 1 and e["greedy_turns"] == 2.0 and "pass@4" in e for e in evaluations)


@pytest.mark.parametrize("overrides, message", [
    (["environment.name=chess"], "environment.name='chess' is not a registered environment"),
    (["environment.name=calculator", "group_filter=dynamic_sampling_filter"], "does not resample environment episodes"),
    (["environment.name=calculator", "environment.max_context=64"], "cannot hold a prompt"),
    (["environment.name=calculator", "environment.max_turns=0"], "max_turns must be >= 1"),
])
def test_bad_environment_settings_are_one_line_errors(overrides, message):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, overrides)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_steps_number_turns_and_anchor_states_and_discount_returns():
    steps = inputs.Steps.of_episodes([[0.0, 1.0], [0.0, 0.0, 1.0], [2.0]], [["a", "b"], ["a", "c", "b"], ["a"]],
                                     np.array([[0, 0, 1, 1, -1], [0, 1, 1, 2, 2], [0, -1, -1, -1, -1]]), discount=0.5)
    assert steps.rows.tolist() == [0, 0, 1, 1, 1, 2] and steps.turns.tolist() == [0, 1, 0, 1, 2, 0]
    np.testing.assert_allclose(steps.step_returns, [0.5, 1.0, 0.25, 0.5, 1.0, 2.0])
    assert steps.anchor_ids.tolist() == [0, 1, 0, 2, 1, 0]  # equal states, equal ids
    tokens = steps.to_tokens(np.arange(1.0, 7.0))
    np.testing.assert_array_equal(tokens, [[1, 1, 2, 2, 0], [3, 4, 4, 5, 5], [6, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="2 turn rewards but 1 anchor states"):
        inputs.Steps.of_episodes([[0.0, 1.0]], [["a"]], np.zeros((1, 2)), discount=0.5)


def test_gigpo_gives_each_turns_tokens_its_hand_computed_advantage():
    """One group of three episodes: turn rewards [0, 1], [0, 0, 0], [0, 1]; states (s0, s1), (s0, s1, s2), (s0, s3);
    discount 0.5. Episode level, its statistics over the group's turns as verl-agent's (mean (2 + 2) / 7 = 4/7):
    3/7, -4/7, 3/7. Step level, by state: s0 returns (0.5, 0, 0.5) -> (1/6, -1/3, 1/6); s1 returns (1, 0) ->
    (1/2, -1/2); s2 and s3 hold one turn each -> 0."""
    steps = inputs.Steps.of_episodes([[0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0]],
                                     [["s0", "s1"], ["s0", "s1", "s2"], ["s0", "s3"]],
                                     np.array([[0, 0, 1, -1], [0, 1, 2, 2], [0, 1, 1, 1]]), discount=0.5)
    rewards = np.array([1.0, 0.0, 1.0], np.float32)
    batch = inputs.BatchInputs(rewards=rewards, reward_columns=rewards[:, None], reward_weights=np.ones(1, np.float32),
                               correct=rewards, group_ids=np.zeros(3, np.int32), num_groups=1, valid=np.ones(3, bool),
                               lengths=np.full(3, 4.0, np.float32), seq_logp=np.zeros(3, np.float32), mask=None,
                               sampler_logp=None, trainer_logp=None, values=None, task_ids={}, steps=steps)
    cfg = Config()
    cfg.advantage, cfg.advantage_kwargs = "gigpo", {}
    got = stages.token_advantages(cfg, batch, num_tokens=4)
    a, b = 3 / 7, -4 / 7
    want = [[a + 1 / 6, a + 1 / 6, a + 1 / 2, 0], [b - 1 / 3, b - 1 / 2, b, b], [a + 1 / 6, a, a, a]]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_the_guess_number_game_states_what_its_feedback_revealed():
    game = GuessNumber(max_guesses=4)
    game.reset({"secret": 7, "low": 1, "high": 20})
    assert game.state() == (1, 20, 4)
    game.step("5"), game.step("12")
    assert game.state() == (6, 11, 2)
    game.step("no idea")
    assert game.state() == (6, 11, 1)


@pytest.mark.parametrize("kernel", [k for k in kernels.list_kernels("advantage") if stages.reads_steps(k.fn, {})],
                         ids=lambda k: k.name)
def test_a_step_level_advantage_trains_each_turn_with_its_credit(trainer, kernel, monkeypatch):
    """Every advantage kernel reading an episode's steps (GiGPO) runs in the loop on environment episodes. In
    TwoTurns the reward r comes at the second turn and every episode of a group passes the same states, so with
    GiGPO's defaults the first turn's tokens get (1 + discount)(r - mean r) and the second's 2 (r - mean r)."""
    cfg = trainer.cfg
    monkeypatch.setattr(cfg, "advantage", kernel.name)
    monkeypatch.setattr(cfg, "advantage_kwargs", {})
    stages.check_config(cfg)
    stages.check_fields(cfg, trainer.train_examples)
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(11))
    batch = trainer.advantages(trainer.loop_state, rollout)
    assert rollout.steps is not None and len(rollout.steps.rows) == 2 * len(rollout.rewards)
    if kernel.name == "gigpo":
        centred = rollout.rewards - np.repeat(rollout.rewards.reshape(-1, 4).mean(-1), 4)
        advantages = np.asarray(batch.advantages).reshape(len(centred), -1)
        mask = np.asarray(batch.completion_mask).reshape(len(centred), -1) > 0
        token_turns = rollout.steps.token_turns
        for turn, scale in ((0, 1 + cfg.environment.discount), (1, 2.0)):
            on = mask & (token_turns == turn)
            expected = np.broadcast_to((scale * centred)[:, None], on.shape)
            np.testing.assert_allclose(advantages[on], expected[on], atol=1e-5)
    trainer.loop_state, metrics = trainer.learn(trainer.loop_state, batch, rollout)  # the fixture's next tests go on
    assert np.isfinite(metrics["loss"])


def test_the_gigpo_experiment_validates_with_its_fields():
    cfg = load_experiment(os.path.join(os.path.dirname(TOY), "guess_number_gigpo.py"))
    validate(cfg)
    examples = [{"secret": 3, "low": 1, "high": 20, "question": "", "answer": "3"}]
    stages.check_fields(cfg, examples)
    cfg.environment = None  # without episodes there are no turns to credit
    with pytest.raises(ConfigError, match="needs step_returns .*which cfg.environment"):
        stages.check_fields(cfg, examples)


NO_TOOL_ROLE = ("{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('Only system, user and assistant roles are supported') }}{% endif %}"
                "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_chat_template_that_cannot_render_the_tools_messages_is_refused_before_compiling(tmp_path, monkeypatch):
    from jaxgrpo.train import state as state_lib

    tokenizer = load_tokenizer(registry.smollm2_135m_instruct())
    tokenizer.chat_template = NO_TOOL_ROLE

    def build(dtype=jnp.float32, remat=True):
        config = DecoderConfig(family="llama", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                               num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
        return Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)), tokenizer

    if "no-tool-role" not in state_lib.MODEL_BUILDERS:
        register_model_builder("no-tool-role", build)
    monkeypatch.setattr(state_lib, "init_state", lambda *a: pytest.fail("the trainer went on past the check"))
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path / 'run'}", "model=no-tool-role", "environment.name=calculator",
                          "environment.max_context=256", "sampling.max_prompt_len=64", "task.num_eval_examples=0"])
    with pytest.raises(ConfigError, match=r"environment 'calculator' with model 'no-tool-role': the chat "
                                          r"template cannot render a 'tool' message \(TemplateError: Only system, user "
                                          r"and assistant roles are supported\); pick a model"):
        Trainer(cfg)


_EPISODES_RESUME_SCRIPT = """
import os, signal, sys
import jax.numpy as jnp
from flax import nnx
from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.envs import Step, register_environment
from jaxgrpo.models import Decoder, DecoderConfig, registry
from jaxgrpo.models.tokenizer import load_tokenizer
from jaxgrpo.train import Trainer, register_model_builder

run_dir, kill, resume = sys.argv[1], sys.argv[2] == "kill", sys.argv[3] == "resume"
tokenizer = load_tokenizer(registry.smollm2_135m_instruct())


def build(dtype=jnp.float32, remat=True):
    config = DecoderConfig(family="llama", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                           num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
    return Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)), tokenizer


calls = []


class ParityTurns:
    # Three turns, each rewarded 1 when the turn's text has an even length; its state: the turns so far.
    failure_reward = 0.0

    def reset(self, example):
        self.turn = 0
        return [{{"role": "user", "content": example["question"]}}]

    def step(self, action):
        calls.append(kill and armed[0])
        if sum(calls) == 2:  # the second environment step of step 2: its episodes in flight
            os.kill(os.getpid(), signal.SIGKILL)
        self.turn += 1
        reward = float(len(action) % 2 == 0)
        if self.turn == 3:
            return Step(None, reward, True)
        return Step([{{"role": "user", "content": "Again."}}], reward, False)

    def state(self):
        return self.turn


armed = [False]
register_model_builder("tiny-smollm2-vocab", build)
register_environment("parity_turns", ParityTurns)
cfg = load_experiment({experiment!r})
apply_overrides(cfg, ["model=tiny-smollm2-vocab", "advantage=gigpo", "advantage_kwargs={{}}", "steps=2",
                      "checkpoint_every=1", "eval_every=0", "task.num_eval_examples=0", "prompts_per_step=2",
                      "group_size=4", "environment.name=parity_turns", "environment.max_turns=3",
                      "environment.max_context=256", "sampling.max_new_tokens=4", "sampling.max_prompt_len=64",
                      "warmup_sft_steps=0", "optimizer.lr=1e-3", "run_dir=" + run_dir])
Trainer(cfg).run(resume=resume, progress=False, on_step=lambda s, r: armed.__setitem__(0, s == 1))
"""


# Slow tier (`-m slow`); in CI instead: SIGKILL and resume: test_trainer.py and test_fault_injection.py;
# episode runs: this file's other tests
@pytest.mark.slow
def test_a_sigkill_in_the_middle_of_a_multi_turn_step_then_resume_gives_the_uninterrupted_run(tmp_path):
    """GiGPO on three-turn episodes: 2 steps straight == killed inside step 2 (an environment answering a turn while
    the step's episodes are in flight), then --resume: the same records and parameters (the engine's draws depend on
    the step's key and request ids, the environments are made anew per episode)."""
    script = _EPISODES_RESUME_SCRIPT.format(experiment=TOY)
    straight, killed, steps_at_kill = kill_resume.straight_and_killed(tmp_path, script)
    assert steps_at_kill == 1
    assert kill_resume.comparable(straight) == kill_resume.comparable(killed)
    records = read_jsonl(straight / "metrics.jsonl")
    assert all(r["episode_turns"] == 3 and r["grad_norm"] > 0 for r in records)  # killed mid-episode; it trained
    jax.tree.map(np.testing.assert_array_equal, kill_resume.checkpoint(straight, 2)["train"]["params"],
                 kill_resume.checkpoint(killed, 2)["train"]["params"])


def test_demonstrations_are_laid_out_as_rollouts_their_observations_untrained():
    from jaxgrpo.engine import multi_turn
    from jaxgrpo.envs import make_environment, tools

    tokenizer = load_tokenizer(registry.smollm2_135m_instruct())
    turns = multi_turn.ChatTurns(tokenizer)
    example = {"question": "What is 123 * 456?", "answer": "56088"}
    prompt, tokens, mask = multi_turn.demonstration(turns, make_environment("calculator"), example)
    assert prompt == turns.opening(make_environment("calculator").reset(example))
    trained = tokenizer.decode([t for t, m in zip(tokens, mask) if m])
    untrained = tokenizer.decode([t for t, m in zip(tokens, mask) if not m])
    assert trained == tools.tool_call("calculator", expression="123 * 456") + "<|im_end|>The answer is 56088.<|im_end|>"
    assert "56088" in untrained and "tool" in untrained and "<tool_call>" not in untrained
    game = GuessNumber(max_guesses=5)
    _, _, mask = multi_turn.demonstration(turns, game, {"secret": 20, "low": 1, "high": 20})
    assert game.state()[2] == 0  # binary search from 10: 10, 15, 18, 19, 20, the last guess right
    with pytest.raises(ValueError, match="demonstration of .* earns no reward"):
        multi_turn.demonstration(turns, GuessNumber(max_guesses=2), {"secret": 20, "low": 1, "high": 20})


class ToyWithExpressions:
    """The toy task's sums with an "expression" (the calculator's demonstration reads it)."""

    name = "toy_with_expressions"

    def __init__(self):
        from jaxgrpo.data.toy import ToySumTask

        self.toy = ToySumTask()

    def load(self, split, **kwargs):
        return [{**e, "expression": e["question"]} for e in self.toy.load(split, **kwargs)]

    def messages(self, example):
        return self.toy.messages(example)

    def default_rewards(self):
        return self.toy.default_rewards()


def test_the_warm_up_of_an_environment_run_trains_on_demonstrated_episodes(trainer, monkeypatch):
    """A calculator run's warm-up: its loss falls over demonstrated episodes (the call, then the answer; the tool's
    message untrained), and an environment without demonstrations is refused when a warm-up is asked for."""
    from jaxgrpo.train import warmup

    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={trainer.cfg.run_dir}-calculator", "model=random-smollm2-vocab",
                          "environment.name=calculator", "environment.max_context=384", "sampling.max_prompt_len=192",
                          "prompts_per_step=2", "group_size=4", "micro_batch_size=8", "task.num_eval_examples=0",
                          "warmup_sft_steps=4", "warmup_sft_lr=3e-3", "checkpoint_every=0"])
    calculator = Trainer(cfg, task=ToyWithExpressions())
    batches, supervised = [], warmup.supervised_batch
    monkeypatch.setattr(warmup, "supervised_batch", lambda *a, **k: batches.append((a, supervised(*a, **k)))
                        or batches[-1][1])
    _, losses = warmup.supervised_warmup(calculator, calculator.loop_state, 4)
    assert losses[-1] < losses[0], losses
    (prompts, answers, _, masks), batch = batches[0]
    assert all(0 < sum(m) < len(m) for m in masks)  # policy turns trained, the tool's message not
    prompt_width = batch.tokens.shape[-1] - batch.completion_mask.shape[-1]
    assert [w & (w - 1) for w in (prompt_width, batch.completion_mask.shape[-1])] == [0, 0]  # bucketed widths
    cfg = load_experiment(TOY)
    apply_overrides(cfg, ["model=random-smollm2-vocab", "environment.name=two_turns", "warmup_sft_steps=2",
                          "task.num_eval_examples=0", "environment.max_context=256", "sampling.max_prompt_len=64"])
    with pytest.raises(ConfigError, match="warmup_sft_steps=2 trains on demonstrated episodes, but environment "
                                          "'two_turns' has no demonstration"):
        Trainer(cfg)
