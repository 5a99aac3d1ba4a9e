"""Collecting a step's batch: sample completions, score them, and (DAPO) resample groups without signal.

Everything here is host side (numpy and Python reward functions) around the jitted sampler. In a
multi-host run each process samples and scores its own block of the step's prompt groups
(`jaxgrpo.distributed`); group ids are global.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from jaxgrpo import profiling, sampler
from jaxgrpo.config import Config
from jaxgrpo.distributed import across_processes, local_rows, process_block, to_host
from jaxgrpo.train import inputs as inputs_lib, stages


class Trajectories(NamedTuple):
    """One step's sampled, scored batch of N = groups x group_size trajectories (numpy, host side).

    A row is its prompt (an episode's opening) then everything after it in one token stream: the policy's
    tokens (its turns), and in an environment's episode the observations and tool results between them. The
    loss sees only `completion_mask` (1 on the policy's tokens, 0 on prompt, observation and tool tokens),
    so every loss and aggregation works on multi-turn rows unchanged; `sampler_logp` are the behaviour
    log-probs of those tokens; `token_turns` says which turn each belongs to, `steps` (episodes) each turn's
    reward-to-go and state, `rewards` the final rewards, `group_ids` the groups, `policy_version` which
    policy sampled them.
    """

    prompt_tokens: np.ndarray  # i32[N, P] left padded
    prompt_mask: np.ndarray  # bool[N, P]
    completion_tokens: np.ndarray  # i32[N, C]
    completion_mask: np.ndarray  # f32[N, C]
    #: f32[N, C] the behaviour log-probs; None where the trajectories were sampled by something that recorded none
    #: (a correction stage, which reads them, then refuses them in one line).
    sampler_logp: np.ndarray | None
    finished: np.ndarray  # bool[N] stopped on a stop token (not by length)
    rewards: np.ndarray  # f32[N]
    per_reward: dict  # name -> f32[N]
    correct: np.ndarray  # f32[N]
    valid: np.ndarray  # bool[N] the reward functions scored the row
    kept: np.ndarray  # bool[N] the row trains: its group carries signal under dynamic sampling (else all True)
    group_ids: np.ndarray  # i32[N]
    texts: list  # N completion strings
    examples: list  # N examples (one per row)
    #: bool[N, C] the real tokens after the prompt, the policy's or not (an episode's observations, attended to
    #: but not trained on); None: those of `completion_mask`.
    completion_valid: np.ndarray | None = None
    #: An environment run's policy turns (step-level credit reads them); None otherwise.
    steps: inputs_lib.Steps | None = None
    #: i32[N]: how many RL steps the policy that sampled each row had taken (its `LoopState.step`; one value in a
    #: synchronous step); None until `Trainer.rollout` stamps it.
    policy_version: np.ndarray | None = None
    #: i32[N, C]: the policy version of each token after the prompt, -1 on padding, where a row's tokens come from
    #: more than one policy (partial rollouts continue a row across updates); None: every token's is its row's.
    token_versions: np.ndarray | None = None

    @property
    def token_turns(self) -> np.ndarray:
        """i32[N, C]: the turn each token after the prompt belongs to (a policy turn's own tokens, or the observation
        answering it; 0 throughout a single-turn row's completion), -1 on padding."""
        if self.steps is not None:
            return self.steps.token_turns
        return np.where(self.completion_mask > 0, 0, -1).astype(np.int32)

    @property
    def trains(self) -> np.ndarray:
        """bool[N]: scored rows of kept groups, the rows advantages and the loss see."""
        return self.valid & self.kept


class RowStats(NamedTuple):
    """The per-row numbers of a rollout that whole-batch computations need (advantages, metrics)."""

    rewards: np.ndarray  # f32[N]
    per_reward: dict  # name -> f32[N]
    correct: np.ndarray  # f32[N]
    valid: np.ndarray  # bool[N] scored rows
    kept: np.ndarray  # bool[N] rows that train (see `Trajectories.kept`)
    group_ids: np.ndarray  # i32[N]
    finished: np.ndarray  # bool[N]
    lengths: np.ndarray  # f32[N] completion tokens
    prompt_lengths: np.ndarray  # i32[N] prompt tokens
    seq_logp: np.ndarray  # f32[N] mean sampler log-prob per completion token

    @property
    def trains(self) -> np.ndarray:
        """bool[N]: scored rows of kept groups (see `Trajectories.trains`)."""
        return self.valid & self.kept


def row_stats(r: Trajectories) -> RowStats:
    """The `RowStats` of a rollout's rows."""
    lengths = r.completion_mask.sum(-1)
    seq_logp = (np.full(len(lengths), np.nan, np.float32) if r.sampler_logp is None
                else (r.sampler_logp * r.completion_mask).sum(-1) / np.maximum(lengths, 1))
    return RowStats(r.rewards, r.per_reward, r.correct, r.valid, r.kept, r.group_ids, r.finished, lengths,
                    r.prompt_mask.sum(-1).astype(np.int32), seq_logp)


def group_stats(correct: np.ndarray, group_ids: np.ndarray, valid: np.ndarray) -> dict[str, float]:
    """Fractions of groups that are all correct / all wrong, over groups with a valid row."""
    all_correct, all_wrong, groups = 0, 0, 0
    for g in np.unique(group_ids):
        rows = (group_ids == g) & valid
        if rows.any():
            groups += 1
            all_correct += bool(correct[rows].min() >= 1.0)
            all_wrong += bool(correct[rows].max() <= 0.0)
    groups = max(groups, 1)
    return {"frac_all_correct": all_correct / groups, "frac_all_wrong": all_wrong / groups}


class PromptStream:
    """Deterministic prompts by position in a shuffled, repeated grain dataset.

    The position (examples consumed so far) is all the state there is, so a
    resumed run continues exactly: grain's `MapDataset` is random access, with
    a fresh permutation each epoch derived from the seed.
    """

    def __init__(self, examples: Sequence[dict], seed: int):
        import grain

        if not len(examples):
            raise ValueError("the training split has no examples")
        self.examples = examples
        self._dataset = grain.MapDataset.source(examples).shuffle(seed=seed).repeat()
        self.position = 0

    def at(self, position: int) -> "PromptStream":
        """A stream over the same shuffled examples at `position` (this one's is left as it is)."""
        stream = copy.copy(self)
        stream.position = position
        return stream

    def example(self, position: int) -> dict:
        """The example at `position` of the stream (any position, consumed or not)."""
        return self._dataset[position]

    def take(self, count: int, block: slice = slice(None)) -> list[dict]:
        """The next `count` examples, or only those at positions `block` of them (one process's share).

        The position advances by `count` either way, so every process stays at the same position.
        """
        batch = [self._dataset[self.position + i] for i in range(count)[block]]
        self.position += count
        return batch


def resolve_rewards(cfg: Config, task) -> list:
    """[(reward_fn, weight)] from `cfg.rewards` (names of `jaxgrpo.rewards` functions), or the task's defaults."""
    from jaxgrpo import rewards as reward_lib

    if not cfg.rewards:
        return list(task.default_rewards())
    pairs = []
    for name, weight in cfg.rewards.items():
        fn = getattr(reward_lib, name, None) or getattr(reward_lib, name + "_reward", None)
        if not callable(fn):
            valid = sorted(n for n in reward_lib.__all__ if callable(getattr(reward_lib, n)) and n.endswith(("_reward", "_penalty")))
            raise KeyError(f"unknown reward {name!r} in config.rewards; valid names: {', '.join(valid)}")
        pairs.append((fn, float(weight)))
    return pairs


def score(cfg: Config, reward_fns: list, texts: list[str], examples: list[dict], lengths: np.ndarray):
    """The rewards of N completions (texts, their examples, i32[N] token lengths), on this host."""
    from jaxgrpo import rewards as reward_lib

    result = reward_lib.score(reward_fns, texts, examples, completion_lengths=lengths)
    if cfg.correctness_reward not in result.per_reward:
        raise KeyError(
            f"correctness_reward={cfg.correctness_reward!r} is not among the rewards "
            f"{sorted(result.per_reward)}; set it to the reward that decides correctness"
        )
    return result


def decode(tokenizer, out) -> list[str]:
    """The completion texts of a `sampler.Generation` (every process's rows, on every process)."""
    tokens, mask = to_host((out.completion_tokens, out.completion_mask))
    lengths = mask.sum(-1).astype(int)
    return tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True)


def scored(cfg: Config, out, examples: list[dict], tokenizer, reward_fns: list, group_ids: np.ndarray) -> Trajectories:
    """The `Trajectories` of a sampled `sampler.Generation` (numpy rows) of `examples` (one per row): decoded, rewarded
    (plus the `reward_penalty` stage's penalty, e.g. DAPO's overlong shaping), every row kept."""
    mask = out.completion_mask.astype(np.float32)
    lengths = mask.sum(-1).astype(np.int32)
    texts = tokenizer.batch_decode([t[: n] for t, n in zip(out.completion_tokens, lengths)], skip_special_tokens=True)
    result = score(cfg, reward_fns, texts, examples, lengths)
    correct = result.per_reward[cfg.correctness_reward].astype(np.float32)
    shaped = result.rewards
    stage = stages.STAGE["reward_penalty"]
    penalty = stages.kernel_of(cfg, stage)
    if penalty is not None:
        fields = dict(lengths=lengths, correct=correct, group_ids=group_ids, num_groups=int(group_ids.max()) + 1,
                      valid=result.valid)
        kwargs = stages.kwargs_of(cfg, stage, penalty)
        shaped = shaped + np.asarray(inputs_lib.call(penalty, fields, kwargs)) * result.valid
    return Trajectories(
        # The untruncated policy log-probs: what the trainer computes for the same tokens.
        out.prompt_tokens, out.prompt_mask.astype(bool), out.completion_tokens, mask,
        out.policy_logprobs.astype(np.float32), out.finish_reason == sampler.FINISH_STOP,
        shaped.astype(np.float32), result.per_reward, correct, result.valid, np.ones(len(correct), bool),
        group_ids, texts, examples,
    )


def collect(cfg: Config, key: jax.Array, prompts: PromptStream, generate: Callable, tokenizer, reward_fns: list,
            mesh, guide: Callable | None = None, local: bool = False, agree: bool | None = None
            ) -> tuple[Trajectories, dict]:
    """Samples and scores this host's share of `prompts_per_step` groups (all of them in a single process).

    `generate(examples, num_samples, key, prompt_ids=...)` samples a `sampler.Generation` of this host's examples.
    Returns this host's rows (group ids are global) and the step's timings. Under dynamic sampling,
    zero-signal groups are resampled: each round reads `need * processes` new prompts, `need` the most
    groups any host still lacks, so every host runs the same rounds with the same shapes. `guide(rollout, key)`
    -> (rollout, counts) rewrites each round's scored groups before that (`guidance.scaffold`); its counts are
    summed into the timings. `local`: the sampler runs on this process's own devices (the rollout engine, or
    one-step-off, in a multi-process run): the rows it returns are all this process's, and `sampled_tokens` counts
    this process's. `agree` (default `not local`): the processes agree on each round's `need` (a collective, so
    only from the main thread: not from one-step-off's sampling thread, which samples one round).
    """
    g = cfg.group_size
    agree = not local if agree is None else agree
    local_groups = cfg.prompts_per_step // jax.process_count()
    kept: list[Trajectories] = []
    rejected: list[Trajectories] = []
    rounds, timings, sampled_tokens = 0, {"time_sample": 0.0, "time_reward": 0.0}, 0
    # The groups to keep (DAPO's dynamic sampling): the filter reads each row's correctness as its `rewards`.
    keeps = stages.kernel_of(cfg, stages.STAGE["group_filter"])
    keeps_kwargs = stages.kwargs_of(cfg, stages.STAGE["group_filter"], keeps) if keeps is not None else {}
    while True:
        lacking = local_groups - sum(len(r.rewards) for r in kept) // g
        need = int(across_processes(lacking).max()) if agree else lacking
        if need <= 0 or rounds >= (cfg.max_sampling_rounds if keeps is not None else 1):
            break
        block = process_block(need * jax.process_count())
        examples = prompts.take(need * jax.process_count(), block)
        t0 = time.perf_counter()
        with profiling.phase("sample"):
            out = generate(examples, g, jax.random.fold_in(key, rounds),
                           prompt_ids=np.arange(block.start, block.stop, dtype=np.int32))
            out = jax.tree.map(np.asarray if local else lambda x: local_rows(x, mesh), out)
        timings["time_sample"] += time.perf_counter() - t0
        sampled_tokens += int(out.completion_mask.sum())
        t0 = time.perf_counter()
        with profiling.phase("reward"):
            rollout = scored(cfg, out, [e for e in examples for _ in range(g)], tokenizer, reward_fns,
                             np.repeat(np.arange(need), g).astype(np.int32))
        timings["time_reward"] += time.perf_counter() - t0
        if guide is not None:
            rollout, guided = guide(rollout, jax.random.fold_in(key, 1_000 + rounds))
            for name, value in guided.items():
                timings[name] = timings.get(name, 0) + value
        group_ids, correct = rollout.group_ids, rollout.correct
        if keeps is not None:
            fields = dict(rewards=correct, group_ids=group_ids, num_groups=need, valid=rollout.valid)
            keep = np.asarray(inputs_lib.call(keeps, fields, keeps_kwargs))
            keep_groups = np.unique(group_ids[keep])
            rollout = rollout._replace(kept=np.isin(group_ids, keep_groups))
            kept.append(select_groups(rollout, keep_groups))
            rejected.append(select_groups(rollout, np.setdiff1d(np.arange(need), keep_groups)))
        else:
            kept.append(rollout)
        rounds += 1
    # Rejected groups fill the batch after the kept ones (static shapes) without training: they
    # still count in the step's reward metrics, which describe what the policy sampled.
    batch = concat_rollouts(kept + rejected, local_groups, g)
    batch = batch._replace(group_ids=batch.group_ids + process_block(cfg.prompts_per_step).start)
    timings.update(sampling_rounds=rounds,
                   sampled_tokens=sampled_tokens if local else int(across_processes(sampled_tokens).sum()))
    return batch, timings


def select_groups(r: Trajectories, groups: np.ndarray) -> Trajectories:
    """The single-turn rows of `r` whose group id is among `groups`."""
    if r.steps is not None:
        raise ValueError("select_groups selects single-turn rows; episodes' steps are not selected")
    rows = np.flatnonzero(np.isin(r.group_ids, groups))

    def take(value):
        if value is None:
            return None
        if isinstance(value, dict):
            return {k: v[rows] for k, v in value.items()}
        if isinstance(value, list):
            return [value[i] for i in rows]
        return value[rows]

    return Trajectories(*(take(field) for field in r))


def concat_rollouts(parts: list[Trajectories], num_groups: int, group_size: int) -> Trajectories:
    """Concatenates rollouts of single-turn rows (padded to the widest, `padded`) and keeps the first `num_groups`
    groups, numbered from 0."""
    parts = [p for p in parts if len(p.rewards)]
    if any(p.steps is not None for p in parts):
        raise ValueError("concat_rollouts joins single-turn rows; episodes' steps are not concatenated")
    if any(p.completion_valid is not None for p in parts):
        parts = [p._replace(completion_valid=completion_valid(p)) for p in parts]
    width = max(p.prompt_tokens.shape[1] for p in parts)
    cwidth = max(p.completion_tokens.shape[1] for p in parts)
    parts = [padded(p, width, cwidth) for p in parts]
    n = num_groups * group_size

    def cat(values):
        if any(v is None for v in values):
            if not all(v is None for v in values):
                raise ValueError("concat_rollouts joins rollouts that all carry a field or none do")
            return None
        if isinstance(values[0], dict):
            return {k: cat([v[k] for v in values]) for k in values[0]}
        if isinstance(values[0], list):
            return sum(values, [])[:n]
        return np.concatenate(values)[:n]

    joined = Trajectories(*(cat(list(field)) for field in zip(*parts)))
    group_ids = np.repeat(np.arange(sum(len(p.rewards) for p in parts) // group_size), group_size)[:n]
    return joined._replace(group_ids=group_ids.astype(np.int32))


def padded(r: Trajectories, prompt_width: int, completion_width: int) -> Trajectories:
    """`r` with its prompts left-padded to `prompt_width` and what follows them right-padded to `completion_width`
    (no wider than they are: e.g. every process's rows to the widest process's, for one global batch)."""
    p, c = prompt_width - r.prompt_tokens.shape[1], completion_width - r.completion_tokens.shape[1]
    if p < 0 or c < 0:
        raise ValueError(f"rows of widths ({r.prompt_tokens.shape[1]}, {r.completion_tokens.shape[1]}) cannot be "
                         f"padded to ({prompt_width}, {completion_width})")
    if not p and not c:
        return r
    left = lambda x, value=0: np.pad(x, ((0, 0), (p, 0)), constant_values=value)  # noqa: E731
    right = lambda x, value=0: None if x is None else np.pad(x, ((0, 0), (0, c)), constant_values=value)  # noqa: E731
    steps = None if r.steps is None else r.steps._replace(token_turns=right(r.steps.token_turns, -1))
    return r._replace(prompt_tokens=left(r.prompt_tokens), prompt_mask=left(r.prompt_mask, False),
                      completion_tokens=right(r.completion_tokens), completion_mask=right(r.completion_mask),
                      sampler_logp=right(r.sampler_logp), completion_valid=right(r.completion_valid, False),
                      steps=steps, token_versions=right(r.token_versions, -1))


def completion_valid(r: Trajectories) -> np.ndarray:
    """bool[N, C]: the real tokens after each row's prompt (`Trajectories.completion_valid`)."""
    return r.completion_mask > 0 if r.completion_valid is None else r.completion_valid


def collect_episodes(cfg: Config, key: jax.Array, prompts: PromptStream, run_episodes: Callable, tokenizer,
                     pad_id: int = 0) -> tuple[Trajectories, dict]:
    """The step's `prompts_per_step` groups of environment episodes.

    `run_episodes(examples, group_size, key, first_id=...)` -> (trajectories example-major, stats):
    `multi_turn.rollout`'s.
    The rows hold each episode's opening as the prompt and everything after it as the completion, its
    observations valid (attended to) but out of the loss mask; the reward is the episode's, correct when it
    is positive. In a multi-process run each process runs its own block of the groups (on its own engine), group
    ids global."""
    g = cfg.group_size
    block = process_block(cfg.prompts_per_step)
    examples = prompts.take(cfg.prompts_per_step, block)
    t0 = time.perf_counter()
    with profiling.phase("sample"):
        trajectories, stats = run_episodes(examples, g, key, first_id=block.start * g)  # ids as one process's
    timings = {"time_sample": time.perf_counter() - t0, "time_reward": 0.0, "sampling_rounds": 1,
               "sampled_tokens": int(stats.get("policy_tokens", 0))}
    timings.update({f"episode_{k}": float(v) / max(len(trajectories), 1) for k, v in stats.items()
                    if k not in ("episodes", "policy_tokens")})
    rollout = episodes_rollout(trajectories, examples, g, tokenizer, pad_id, cfg.environment.discount)
    return rollout._replace(group_ids=rollout.group_ids + block.start), timings


def episodes_rollout(trajectories, examples: list, group_size: int, tokenizer, pad_id: int = 0,
                     discount: float = 1.0) -> Trajectories:
    """A `Trajectories` of `multi_turn.Trajectory`s (example-major, `group_size` per example), with their `Steps`
    (returns discounted by `discount` per turn)."""
    n = len(trajectories)
    width = sampler.bucket_length(max(len(t.prompt) for t in trajectories))
    cwidth = sampler.bucket_length(max(max(len(t.tokens) for t in trajectories), 1))
    prompt_tokens, prompt_mask = sampler.left_pad([t.prompt.tolist() for t in trajectories], width, pad_id)
    tokens = np.full((n, cwidth), pad_id, np.int32)
    loss, valid_tokens = np.zeros((2, n, cwidth), bool)
    logp = np.zeros((n, cwidth), np.float32)
    token_turns = np.full((n, cwidth), -1, np.int32)
    for row, t in enumerate(trajectories):
        k = len(t.tokens)
        tokens[row, :k], loss[row, :k], valid_tokens[row, :k], logp[row, :k] = t.tokens, t.loss_mask, True, t.policy_logprobs
        token_turns[row, :k] = t.turns
    rewards = np.array([t.reward for t in trajectories], np.float32)
    texts = tokenizer.batch_decode([t.tokens.tolist() for t in trajectories], skip_special_tokens=True)
    return Trajectories(
        # The untruncated policy log-probs, as the single-turn path keeps them: what the trainer recomputes.
        prompt_tokens, prompt_mask.astype(bool), tokens, loss.astype(np.float32), logp,
        np.array([t.finish == "done" for t in trajectories]), rewards, {"environment": rewards},
        (rewards > 0).astype(np.float32), np.ones(n, bool), np.ones(n, bool),
        np.array([t.example for t in trajectories], np.int32), texts,
        [examples[t.example] for t in trajectories], valid_tokens,
        inputs_lib.Steps.of_episodes([t.turn_rewards for t in trajectories], [t.anchors for t in trajectories],
                                     token_turns, discount))


def rollout_metrics(stats: RowStats, timings: dict, num_epochs: int) -> dict:
    """A step's metrics of what was sampled: rewards, accuracy, lengths, rows that trained, throughput."""
    valid = stats.valid
    trained_tokens = float(stats.prompt_lengths.sum() + stats.lengths.sum()) * num_epochs
    mean = lambda x: float(x[valid].mean()) if valid.any() else float("nan")  # noqa: E731
    return dict(
        reward_mean=mean(stats.rewards),
        reward_std=float(stats.rewards[valid].std()) if valid.any() else float("nan"),
        accuracy=mean(stats.correct),
        completion_length=float(stats.lengths.mean()),
        frac_truncated=float(1.0 - stats.finished.mean()),
        # Partial rollouts' groups still going are unscored (not trained yet), not invalid.
        num_invalid_rewards=float((~valid).sum()) - timings.get("rows_carried", 0),
        frac_trained_rows=float(stats.trains.mean()),
        sample_tokens_per_s=timings["sampled_tokens"] / max(timings["time_sample"], 1e-9),
        train_tokens_per_s=trained_tokens / max(timings["time_train"], 1e-9),
        **{f"reward/{k}": mean(v) for k, v in stats.per_reward.items()},
        **group_stats(stats.correct, stats.group_ids, valid),
    )
