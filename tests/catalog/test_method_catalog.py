"""docs/methods.md lists every catalog method with a status that matches the registry and METHODS.md."""

import importlib
import os
import re

import pytest

import jaxgrpo
from jaxgrpo import kernels
from jaxgrpo.catalog import methods as mc
from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT
KERNEL_MODULES = ("advantages", "losses", "credit", "reward_shaping", "selection", "masks")
REGENERATE = "python -m jaxgrpo.catalog.methods"


def _methods_md(shared_dir):
    return open(os.path.join(shared_dir, "METHODS.md"), encoding="utf-8").read()


def _catalog_entries(text):
    """(category, name, bold, title) of every `- name (*title*)` line of METHODS.md §1."""
    section1 = text.split("## 1.", 1)[1].split("\n## 2.", 1)[0]
    entries, category = [], None
    for line in section1.splitlines():
        heading = re.match(r"### ([A-H])\. ", line)
        if heading:
            category = heading.group(1)
            continue
        entry = re.match(r"- (\*\*)?(.+?)(?(1)\*\*) \(\*(.+?)\*\)", line)
        if category and entry:
            entries.append((category, entry.group(2), bool(entry.group(1)), entry.group(3).rstrip("…")))
    return entries


def test_docs_methods_md_is_up_to_date():
    path = os.path.join(REPO, "docs", "methods.md")
    assert os.path.exists(path), f"docs/methods.md is missing; run `{REGENERATE}`"
    with open(path, encoding="utf-8") as f:
        assert f.read() == mc.render(), f"docs/methods.md is stale; regenerate it with `{REGENERATE}`"


def test_every_cited_kernel_is_registered():
    missing_modules = []
    for name in KERNEL_MODULES:
        try:
            importlib.import_module(f"jaxgrpo.kernels.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"jaxgrpo.kernels.{name}":
                raise
            missing_modules.append(name)
    registered = {k.name for k in jaxgrpo.list_kernels()}
    cited = {k for m in mc.METHODS for k in m.kernels} | {k for b in mc.BASELINES for k in b.kernels}
    unknown = sorted(cited - registered)
    assert not unknown, (
        f"method_catalog cites kernels that are not registered: {unknown}"
        + (f" (kernel modules not present yet: {missing_modules})" if missing_modules else "")
    )
    for b in mc.BASELINES:
        for fn in b.functions:
            assert callable(getattr(kernels, fn, None)), f"{b.name} cites jaxgrpo.kernels.{fn}, which does not exist"


def test_every_catalog_method_is_listed_with_its_category_and_title(shared_dir):
    entries = _catalog_entries(_methods_md(shared_dir))
    bold = [e for e in entries if e[2]]
    assert len(entries) > 150 and len(bold) > 40, "METHODS.md §1 parsed to too few entries; has its format changed?"
    listed = {(m.category, m.name): m for m in mc.METHODS}
    missing_bold = [name for cat, name, is_bold, _ in bold if (cat, name) not in listed]
    assert not missing_bold, f"bold methods of METHODS.md §1 missing from method_catalog.METHODS: {missing_bold}"
    missing = [name for cat, name, _, _ in entries if (cat, name) not in listed]
    assert not missing, f"methods of METHODS.md §1 missing from method_catalog.METHODS: {missing}"
    for cat, name, is_bold, title in entries:
        m = listed[(cat, name)]
        assert m.bold == is_bold, f"{name}: bold={m.bold} in the table but {is_bold} in METHODS.md"
        assert title.startswith(m.title), f"{name}: title {m.title!r} is not a prefix of {title!r}"
    extra = sorted(set(listed) - {(c, n) for c, n, _, _ in entries})
    assert not extra, f"method_catalog lists methods that are not in METHODS.md §1: {extra}"


def test_entries_are_well_formed():
    names = [(m.category, m.name) for m in mc.METHODS]
    assert len(names) == len(set(names)), "a method is listed twice"
    for m in mc.METHODS:
        assert m.status in mc.STATUSES and m.category in mc.CATEGORIES, m
        if m.status == mc.KERNEL:
            assert m.kernels, f"{m.name} is a kernel but cites no registry name"
        else:
            assert m.note, f"{m.name} ({m.status}) needs an area or a reason"


def test_built_in_methods_name_modules_and_config_fields_that_exist():
    from jaxgrpo.config import Config

    built_in = [m for m in mc.METHODS if m.status == mc.BUILT_IN]
    assert built_in, "no method is marked built in"
    for m in built_in:
        cited = re.findall(r"`([^`]+)`", m.note)
        assert cited, f"{m.name}: a built-in method's note names where it lives"
        for name in cited:
            if name.startswith("jaxgrpo."):
                importlib.import_module(name)
            else:
                field = name.split("=")[0]
                assert hasattr(Config(), field), f"{m.name} cites `{name}`, but Config has no field {field!r}"


@pytest.mark.parametrize("baseline", ["GRPO", "Dr. GRPO", "DAPO", "GSPO", "RLOO", "REINFORCE++", "PPO + GAE", "CISPO"])
def test_section_2_baselines_are_listed(baseline):
    assert baseline in {b.name for b in mc.BASELINES}


def test_regenerating_writes_the_rendered_document(tmp_path):
    target = tmp_path / "methods.md"
    assert mc.main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == mc.render()
