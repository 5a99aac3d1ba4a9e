"""Tasks for GRPO-family training: TFDS builders, prompt formatting, and their rewards.

Interface (see `jaxgrpo.data.tasks`)::

    get_task(name: str, **kwargs) -> Task      # "arithmetic" (the embedded default), "gsm8k", "arithmetic/digits2_ops3"
    Task.name: str
    Task.load(split, *, data_dir=None, num_examples=None) -> Sequence[dict]   # dicts with "question", "answer"
    Task.messages(example) -> list[{"role", "content"}]
    Task.default_rewards() -> list[(reward_fn, weight)]
    render_prompt(tokenizer, messages) -> str  # the policy's chat template
    example_batches(examples, batch_size, *, seed, num_epochs=None) -> Iterator[list[dict]]  # grain

Builders: `Gsm8k` (downloads the public jsonl files or reads a manual dir) and
`Arithmetic` (procedural; configs like ``digits2_ops2``), both array_record.

`evaluate`: accuracy and pass@k of sampled completions against a split (`python -m jaxgrpo.data.evaluate`).
`toy`: a fully offline setup (a character tokenizer, the `toy_sum` task, a tiny random decoder), registered
when imported.
"""

from jaxgrpo.data.arithmetic import Arithmetic, ArithmeticConfig, arithmetic_config
from jaxgrpo.data.gsm8k import Gsm8k
from jaxgrpo.data.tasks import (
    ArithmeticTask,
    ExampleSource,
    Gsm8kTask,
    Task,
    example_batches,
    get_task,
    register_task,
    render_prompt,
    task_names,
)

__all__ = [
    "Arithmetic",
    "ArithmeticConfig",
    "ArithmeticTask",
    "ExampleSource",
    "Gsm8k",
    "Gsm8kTask",
    "Task",
    "arithmetic_config",
    "example_batches",
    "get_task",
    "register_task",
    "render_prompt",
    "task_names",
]
