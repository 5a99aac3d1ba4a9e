"""Tasks: a data set, the prompt that poses its examples, and the rewards that judge answers.

The trainer relies on this interface::

    task = get_task("arithmetic")             # or "gsm8k", "arithmetic/digits2_ops3", get_task("arithmetic", digits=3)
    examples = task.load("train")             # random-access Sequence[dict], read from a TFDS array_record source
    messages = task.messages(examples[0])     # [{"role": "system", ...}, {"role": "user", ...}]
    prompt = render_prompt(tokenizer, messages)  # the policy's chat template
    rewards = task.default_rewards()          # [(reward_fn, weight)] for jaxgrpo.rewards.score

Every example is a dict of strings with at least ``"question"`` and
``"answer"`` (the exact final answer). `Task.load` prepares the TFDS builder on
first use (in ``tfds_data_dir``, by default TFDS's own, ``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``) and reads it back with ``builder.as_data_source``:
no TensorFlow is involved. `example_batches` iterates a split in shuffled
batches with grain.

New tasks register with `register_task(name, factory)`; `get_task` accepts
``"name"`` or ``"name/config"``, passing the config part as ``config=``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import grain
import tensorflow_datasets as tfds

from jaxgrpo import rewards
from jaxgrpo.data import arithmetic, gsm8k

Message = dict[str, str]

SYSTEM_PROMPT = "You are a helpful assistant. Solve the problem, then state the final answer."
ANSWER_INSTRUCTION = 'Finish your reply with "The answer is N." where N is the final number.'
# Correctness dominates; the small format term gives a signal even when a whole group is wrong.
FORMAT_REWARD_WEIGHT = 0.1


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> Sequence[dict]:
        """The examples of ``split``, random access; the first ``num_examples`` if given."""

    def messages(self, example: dict) -> list[Message]:
        """The chat messages that pose ``example`` to the policy."""

    def default_rewards(self) -> list[tuple[rewards.RewardFn, float]]:
        """(reward_fn, weight) pairs for `jaxgrpo.rewards.score`."""


class ExampleSource(Sequence):
    """A TFDS data source seen as a ``Sequence[dict[str, str]]``: text features decoded from bytes."""

    def __init__(self, source: Sequence[dict], num_examples: int | None = None):
        if num_examples is not None and num_examples < 0:
            raise ValueError(f"num_examples must be >= 0 or None, got {num_examples}")
        self._source = source
        self._length = len(source) if num_examples is None else min(num_examples, len(source))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if not -self._length <= index < self._length:
            raise IndexError(f"example index {index} out of range for {self._length} examples")
        record = self._source[index % self._length]
        return {key: value.decode("utf-8") if isinstance(value, bytes) else value for key, value in record.items()}


@contextlib.contextmanager
def _preparing(data_dir: str) -> Iterator[None]:
    """Holds an exclusive lock (a file in the temporary directory, named for `data_dir`) while a dataset is
    prepared there, so two processes of this machine never prepare the same one at once."""
    name = hashlib.sha256(os.path.abspath(os.fspath(data_dir)).encode()).hexdigest()[:16]
    with open(os.path.join(tempfile.gettempdir(), f"jaxgrpo-tfds-{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _data_source(make_builder: Callable[[], tfds.core.DatasetBuilder], split: str, download_config=None,
                 before_preparing: Callable[[], None] | None = None) -> Sequence[dict]:
    """``split`` of the builder ``make_builder()`` makes as a random-access data source, preparing it on first use
    (after ``before_preparing()``, a check of what preparing reads).

    Two processes preparing one dataset at once (the workers of a study on a fresh machine) would both write
    it and the second would fail to rename its copy into place: preparing holds a lock, and a builder made
    after the wait reads what the other process prepared.
    """
    builder = make_builder()
    if split not in builder.info.splits:
        with _preparing(builder.data_dir):
            builder = make_builder()
            if split not in builder.info.splits:
                if before_preparing is not None:
                    before_preparing()
                builder.download_and_prepare(download_config=download_config)
    if split not in builder.info.splits:
        raise ValueError(f"{builder.name} has no split {split!r}; splits are {sorted(builder.info.splits)}")
    return builder.as_data_source(split)


@dataclasses.dataclass(frozen=True)
class _MathPrompting:
    """Prompts that ask for "The answer is N.", and the rewards that check it."""

    system_prompt: str | None = SYSTEM_PROMPT
    answer_instruction: str = ANSWER_INSTRUCTION

    def messages(self, example: dict) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": f"{example['question']}\n{self.answer_instruction}"}]

    def default_rewards(self) -> list[tuple[rewards.RewardFn, float]]:
        return [(rewards.correctness_reward, 1.0), (rewards.format_reward, FORMAT_REWARD_WEIGHT)]


@dataclasses.dataclass(frozen=True)
class Gsm8kTask(_MathPrompting):
    """GSM8K word problems (splits "train", "test"); see `jaxgrpo.data.gsm8k`."""

    tfds_data_dir: str | None = None
    name: ClassVar[str] = "gsm8k"

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> Sequence[dict]:
        """GSM8K's ``split``.

        The prepared data is keyed by its source (`gsm8k.source_config`: the published files, or a
        content hash of the local ones), so another data_dir prepares its own files and the same files
        reuse their preparation.

        Args:
          split: "train" or "test".
          data_dir: a directory with GSM8K's train.jsonl and test.jsonl, read
            offline; None downloads them from the public source.
          num_examples: keep only the first examples.

        Raises:
          MissingDataError: the directory or one of its files does not exist.
          DataError: a line of a file to prepare is not a GSM8K example, or a file is empty.
        """
        config = gsm8k.source_config(data_dir)
        make_builder = functools.partial(gsm8k.Gsm8k, data_dir=self.tfds_data_dir, config=config,
                                         file_format="array_record")
        # Before TFDS reads the files: one error naming the file and line.
        check = None if data_dir is None else lambda: gsm8k.check_files(gsm8k.local_files(data_dir))
        download_config = tfds.download.DownloadConfig(manual_dir=data_dir)
        return ExampleSource(_data_source(make_builder, split, download_config, check), num_examples)


@dataclasses.dataclass(frozen=True)
class ArithmeticTask(_MathPrompting):
    """Procedural integer arithmetic (splits "train", "test"); see `jaxgrpo.data.arithmetic`.

    The defaults (one-digit addition) are chosen so that SmolLM2-135M-Instruct
    solves them often enough for groups of samples to disagree (docs/tasks.md
    has the measurement); the main job (experiments/quickstart.py) sums three
    one-digit numbers with half of the questions held out.
    """

    digits: int = 1
    operands: int = 2
    operators: str = "+"
    seed: int = 0
    train_size: int = arithmetic.DEFAULT_TRAIN_SIZE
    test_size: int = arithmetic.DEFAULT_TEST_SIZE
    test_share: int = arithmetic.DEFAULT_TEST_SHARE
    tfds_data_dir: str | None = None

    @property
    def config(self) -> arithmetic.ArithmeticConfig:
        return arithmetic.arithmetic_config(
            self.digits, self.operands, self.operators, self.seed, self.train_size, self.test_size, self.test_share
        )

    @property
    def name(self) -> str:
        return f"arithmetic/{self.config.name}"

    def hints(self, example: dict) -> list[str]:
        """Tiers of hints for an example, most abstract first (`arithmetic.hints`; `Config.guidance` reads them)."""
        return arithmetic.hints(example["expression"])

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> Sequence[dict]:
        """The ``split`` generated from this task's seed and difficulty.

        Args:
          split: "train" or "test".
          data_dir: must be None: the data is generated, not read (where the
            prepared records go is the task's ``tfds_data_dir``).
          num_examples: keep only the first examples.
        """
        if data_dir is not None:
            raise ValueError(
                f"arithmetic is generated, it reads no data_dir (got {data_dir!r}); pass data_dir=None, "
                "and set tfds_data_dir on the task to choose where the prepared records are written"
            )
        make_builder = functools.partial(arithmetic.Arithmetic, data_dir=self.tfds_data_dir, config=self.config,
                                         file_format="array_record")
        return ExampleSource(_data_source(make_builder, split), num_examples)


def _arithmetic_task(config: str | None = None, **kwargs: Any) -> ArithmeticTask:
    """An `ArithmeticTask`; a config name such as "digits2_ops3_add_mul" sets its difficulty."""
    if config is not None:
        kwargs = {**arithmetic.parse_config_name(config), **kwargs}
    return ArithmeticTask(**kwargs)


def _gsm8k_task(config: str | None = None, **kwargs: Any) -> Gsm8kTask:
    if config is not None:
        raise ValueError(f"gsm8k has no configs, got 'gsm8k/{config}'; use 'gsm8k'")
    return Gsm8kTask(**kwargs)


def _guess_number_task(config: str | None = None, **kwargs: Any) -> Task:
    from jaxgrpo.data.games import GuessNumberTask

    if config is not None:
        raise ValueError(f"guess_number has no configs, got 'guess_number/{config}'; use 'guess_number'")
    return GuessNumberTask(**kwargs)


_TASKS: dict[str, Callable[..., Task]] = {"arithmetic": _arithmetic_task, "gsm8k": _gsm8k_task,
                                          "guess_number": _guess_number_task}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Makes ``get_task(name, **kwargs)`` return ``factory(config=None | str, **kwargs)``."""
    if name in _TASKS:
        raise ValueError(f"a task named {name!r} is already registered")
    _TASKS[name] = factory


def task_names() -> list[str]:
    """The registered task names."""
    return sorted(_TASKS)


def get_task(name: str, **kwargs: Any) -> Task:
    """The task registered as ``name`` (``"name"`` or ``"name/config"``), built with ``kwargs``."""
    base, _, config = name.partition("/")
    if base not in _TASKS:
        raise ValueError(f"unknown task {name!r}; valid names are {', '.join(task_names())}")
    return _TASKS[base](config=config or None, **kwargs)


def render_prompt(tokenizer, messages: list[Message]) -> str:
    """``messages`` rendered by a Hugging Face tokenizer's chat template, ready for the assistant's turn."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def example_batches(
    examples: Sequence[dict], batch_size: int, *, seed: int, num_epochs: int | None = None
) -> Iterator[list[dict]]:
    """Shuffled batches of examples with grain: a fresh permutation each epoch, full batches only.

    Args:
      examples: a random-access source, e.g. from `Task.load`.
      batch_size: examples per batch.
      seed: the shuffle seed; the same seed gives the same batches.
      num_epochs: passes over the data; None repeats forever.
    """
    if not 0 < batch_size <= len(examples):
        raise ValueError(f"batch_size must be in [1, {len(examples)}] (the number of examples), got {batch_size}")
    dataset = grain.MapDataset.source(examples).shuffle(seed=seed).repeat(num_epochs)
    return iter(dataset.batch(batch_size, drop_remainder=True, batch_fn=list))
