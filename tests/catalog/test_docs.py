"""docs/kernels.md is generated from the registry and up to date; docstrings give formula and paper; the demo runs."""

import inspect
import os
import re

import pytest

import jaxgrpo
from jaxgrpo.catalog import demo, docs
from jaxgrpo.kernels import registry

# The kernels of issue 2 (the baselines), by kind.
BASELINE_KERNELS = {
    "advantage": ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"),
    "loss": ("ppo_clip", "gspo", "gspo_token", "cispo", "reinforce"),
    "kl": jaxgrpo.KL_KINDS,
    "token_advantage": ("gae", "discounted_returns", "reinforce_pp_returns"),
    "reward": ("overlong_penalty",),
    "selection": ("dynamic_sampling_filter",),
    "credit": ("importance_correction",),
}


def test_committed_kernel_docs_are_up_to_date():
    path = os.path.abspath(docs.DOC_PATH)
    committed = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    assert committed == docs.render(), f"docs/kernels.md is stale: run `{docs.COMMAND}` and commit the result"


def test_render_is_deterministic_and_lists_every_library_kernel(monkeypatch):
    text = docs.render()
    sections = dict(re.findall(r"\n## (\w+)\n(.*?)(?=\n## |\Z)", text, flags=re.S))
    for kind in registry.KINDS:
        names = re.findall(r"^\| `([^`]+)`", sections[kind], flags=re.M)
        assert names == sorted(i.name for i in docs.library_kernels(kind)), kind
    for kind, names in BASELINE_KERNELS.items():
        assert set(names) <= {i.name for i in docs.library_kernels(kind)}
    # A kernel registered from outside the package (a notebook, a test) does not change the docs.
    monkeypatch.setitem(registry._REGISTRY, "advantage", dict(registry._REGISTRY["advantage"]))
    jaxgrpo.register_advantage("notebook_estimator")(lambda rewards, group_ids, *, num_groups, valid=None: rewards)
    assert docs.render() == text


def test_docs_show_signatures_modes_and_kl_kinds():
    text = docs.render()
    assert "`grpo(rewards, group_ids, *, num_groups, valid=None, std_ddof=1, eps=1e-06)`" in text
    assert "`kl_k1_straight_through(logp, ref_logp, *, clamp=None, old_logp=None, mask=None)`" in text
    for mode in jaxgrpo.AGGREGATION_MODES:
        assert f"| `{mode}` | `sum" in text
    assert "| `seq_mean_token_sum_norm` | `sum_{i,t} l m / (N_seq * max_len)` | Dr. GRPO |" in text
    for kind in jaxgrpo.KL_KINDS:
        assert f"| `{kind}` | " in text
    for name in docs.FUNCTIONS:
        assert f".{name}` | " in text


def test_signature_rendering():
    def f(a, b=2, *args, c, d=None, **kw):
        pass

    def g(a, *, b=0.5, fn=print):
        pass

    assert docs.signature(f) == "f(a, b=2, *args, c, d=None, **kw)"
    assert docs.signature(g, "h") == "h(a, *, b=0.5, fn=print)"


def test_main_writes_and_checks(tmp_path, capsys):
    path = str(tmp_path / "kernels.md")
    assert docs.main(["--check", path]) == 1
    assert f"run `{docs.COMMAND}`" in capsys.readouterr().out
    assert docs.main([path]) == 0
    assert docs.main(["--check", path]) == 0
    assert open(path, encoding="utf-8").read() == docs.render()


@pytest.mark.parametrize("kind", sorted(BASELINE_KERNELS))
def test_baseline_docstrings_give_formula_and_paper(kind):
    for name in BASELINE_KERNELS[kind]:
        info = registry.info(kind, name)
        doc = " ".join((inspect.getdoc(info.fn) or "").split())
        title = re.split(r":|,| \(", info.paper)[0]  # the paper's title up to its subtitle
        assert title in doc, f"{kind} {name}: docstring does not name its paper {info.paper!r}"
        for year in re.findall(r"\((\d{4})\)", info.paper):
            assert year in doc, f"{kind} {name}: docstring does not give the paper's year {year}"
        assert "=" in doc, f"{kind} {name}: docstring gives no formula"


def test_demo_runs(capsys):
    assert demo.main(["--seed", "1"]) == 0
    out = capsys.readouterr().out
    for name in demo.ESTIMATORS + jaxgrpo.AGGREGATION_MODES:
        assert name in out
    assert "dropped by dynamic sampling" in out  # the always-solved prompt
    # Accumulating two micro-batches with the full denominator prints the same loss.
    for mode in jaxgrpo.AGGREGATION_MODES:
        loss, total, denominator, accumulated = re.search(rf"^  {mode} +(\S+) +(\S+) +(\S+) +(\S+)$", out, re.M).groups()
        assert loss == accumulated
