"""The Task interface the trainer uses: registry, loading, prompts, default rewards, batches."""

import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from jaxgrpo import rewards
from jaxgrpo.data import tasks
from jaxgrpo.data import ArithmeticTask, Task, example_batches, get_task, register_task, render_prompt, task_names

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def small_arithmetic(tmp_path_factory):
    return get_task("arithmetic", train_size=64, test_size=16, tfds_data_dir=str(tmp_path_factory.mktemp("tfds")))


def test_registry_has_the_required_tasks_and_names_valid_ones_on_error():
    assert {"arithmetic", "gsm8k"} <= set(task_names())
    with pytest.raises(ValueError, match="unknown task 'gsm9k'; valid names are arithmetic, gsm8k"):
        get_task("gsm9k")


def test_a_config_in_the_name_sets_the_difficulty():
    task = get_task("arithmetic/digits2_ops3_add_mul")
    assert (task.digits, task.operands, task.operators) == (2, 3, "+*")
    assert task.name == "arithmetic/digits2_ops3_add_mul"
    with pytest.raises(ValueError, match="gsm8k has no configs"):
        get_task("gsm8k/main")


def test_tasks_satisfy_the_protocol():
    assert isinstance(get_task("arithmetic"), Task) and isinstance(get_task("gsm8k"), Task)


def test_the_default_task_is_the_measured_difficulty():
    task = get_task("arithmetic")
    assert task.name == "arithmetic/digits1_ops2"


def test_register_task_adds_a_name_once(monkeypatch):
    monkeypatch.setattr(tasks, "_TASKS", dict(tasks._TASKS))  # Leave the global registry as it was.
    register_task("arithmetic_three_digits", lambda config=None, **kw: ArithmeticTask(digits=3, **kw))
    assert get_task("arithmetic_three_digits").digits == 3
    with pytest.raises(ValueError, match="already registered"):
        register_task("arithmetic_three_digits", ArithmeticTask)


def test_load_gives_random_access_string_examples(small_arithmetic):
    train = small_arithmetic.load("train")
    assert len(train) == 64
    example = train[-1]
    assert isinstance(example["question"], str) and isinstance(example["answer"], str)
    assert train[63] == example
    with pytest.raises(IndexError, match="out of range for 64 examples"):
        train[64]
    assert len(small_arithmetic.load("test", num_examples=5)) == 5


def test_load_names_a_bad_split_and_a_stray_data_dir(small_arithmetic):
    with pytest.raises(ValueError, match=r"no split 'validation'; splits are \['test', 'train'\]"):
        small_arithmetic.load("validation")
    with pytest.raises(ValueError, match="arithmetic is generated, it reads no data_dir"):
        small_arithmetic.load("train", data_dir="/data")


_LOAD_IN_A_PROCESS = """
import sys
from jaxgrpo.data import get_task

task = get_task("arithmetic", train_size=2000, test_size=16, tfds_data_dir=sys.argv[1])
print(len(task.load("train")), task.load("train")[7]["question"])
"""


def test_processes_preparing_one_dataset_at_once_each_get_it(tmp_path):
    """A study's workers on a fresh machine: the first prepares the records, the others wait and read them (they
    used to prepare them too, and all but one failed renaming their copy into place)."""
    procs = [subprocess.Popen([sys.executable, "-c", _LOAD_IN_A_PROCESS, str(tmp_path / "tfds")], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    answers = {out.strip().splitlines()[-1] for out, _ in outputs}  # (the preparing one also says so)
    assert len(answers) == 1 and answers.pop().startswith("2000 ")


def test_messages_pose_the_question_with_the_answer_format():
    task = get_task("arithmetic")
    messages = task.messages({"question": "What is 2 + 3?", "answer": "5"})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].startswith("What is 2 + 3?\n")
    assert '"The answer is N."' in messages[1]["content"]
    no_system = get_task("arithmetic", system_prompt=None).messages({"question": "q", "answer": "1"})
    assert [m["role"] for m in no_system] == ["user"]


def test_render_prompt_uses_the_tokenizer_chat_template():
    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=CHATML)
    messages = get_task("arithmetic").messages({"question": "What is 2 + 3?", "answer": "5"})
    prompt = render_prompt(tokenizer, messages)
    assert prompt.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nWhat is 2 + 3?\n" in prompt
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_default_rewards_reward_a_correct_formatted_answer_most():
    task = get_task("arithmetic")
    example = {"question": "What is 2 + 3?", "answer": "5"}
    completions = ["2 + 3 = 5. The answer is 5.", "5", "The answer is 6.", "I am not sure."]
    result = rewards.score(task.default_rewards(), completions, [example] * 4)
    np.testing.assert_allclose(result.rewards, [1.1, 1.0, 0.1, 0.0], rtol=1e-6)


def test_example_batches_are_seeded_full_and_cover_each_epoch(small_arithmetic):
    train = small_arithmetic.load("train")
    batches = list(example_batches(train, 16, seed=0, num_epochs=1))
    assert [len(b) for b in batches] == [16] * 4
    assert sorted(e["question"] for b in batches for e in b) == sorted(e["question"] for e in train)
    again = list(example_batches(train, 16, seed=0, num_epochs=1))
    assert again == batches
    assert list(example_batches(train, 16, seed=1, num_epochs=1)) != batches
    with pytest.raises(ValueError, match="batch_size must be in"):
        example_batches(train, 65, seed=0)
