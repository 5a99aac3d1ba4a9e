"""A trained toy run read back: `jaxgrpo-eval` of its final checkpoint reproduces the trainer's own last
evaluation (eval.jsonl), and `jaxgrpo-export` of it gives transformers the same greedy completions."""

import json
import os

import numpy as np
import pytest

from jaxgrpo.config import load_experiment
from jaxgrpo.run.metrics import read_jsonl
from jaxgrpo.tools import cli
from jaxgrpo.train.loop import Trainer
from tests.support.paths import REPO_ROOT

EXPERIMENT = os.path.join(REPO_ROOT, "experiments", "toy_sum.py")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    cfg = load_experiment(EXPERIMENT)
    cfg.run_dir = str(tmp_path_factory.mktemp("toy") / "run")
    cfg.steps, cfg.eval_every, cfg.checkpoint_every = 4, 4, 4
    cfg.task.num_eval_examples, cfg.eval_pass_k = 16, 4
    Trainer(cfg).run(progress=False)
    return cfg.run_dir


def test_eval_of_final_checkpoint_equals_the_trainers_last_evaluation(toy_run, tmp_path, capsys):
    out = str(tmp_path / "completions.jsonl")
    assert cli.eval_main([toy_run, "--k", "1", "4", "--out", out]) == 0
    with open(str(tmp_path / "completions.summary.json")) as f:
        summary = json.load(f)
    last = read_jsonl(os.path.join(toy_run, "eval.jsonl"))[-1]
    assert last["step"] == summary["step"] == 4
    for name in ("greedy_accuracy", "pass@1", "pass@4"):
        assert summary[name] == pytest.approx(last[name], abs=1e-9), name
        low, high = summary[f"{name}_ci95"]
        assert low <= summary[name] <= high and high - low > 0
    records = read_jsonl(out)
    assert len(records) == 16 and all(len(r["samples"]) == 4 for r in records)
    assert np.mean([r["greedy_correct"] for r in records]) == pytest.approx(last["greedy_accuracy"])
    assert "Wilson" in capsys.readouterr().out


def test_eval_refuses_a_missing_split_and_a_run_without_checkpoints(toy_run, tmp_path, capsys):
    assert cli.eval_main([toy_run, "--split", "validation"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no split 'validation'" in err
    (tmp_path / "config.json").write_text(json.dumps({"model": "toy-tiny"}))
    assert cli.eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no checkpoints" in err


def test_exported_toy_run_gives_transformers_the_same_greedy_completions(toy_run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = str(tmp_path / "eval.jsonl")
    assert cli.eval_main([toy_run, "--k", "1", "--out", out]) == 0
    jax_greedy = [(r["question"], r["greedy"]) for r in read_jsonl(out)]
    assert cli.export_main([toy_run, "--out", str(tmp_path / "hf")]) == 0

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    with open(os.path.join(toy_run, "config.json")) as f:
        max_new_tokens = json.load(f)["sampling"]["max_new_tokens"]
    for question, expected in jax_greedy:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        assert tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True) == expected, question
