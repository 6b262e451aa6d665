"""The loader: bundled names, paths, extends chains and --set overrides."""

from __future__ import annotations

import pytest

import scenarios
from scenarios import ScenarioError
from scenarios.loader import apply_set, deep_merge


def test_extends_merges_sections_key_by_key():
    base, child = scenarios.load("gem-h200-1gpu"), scenarios.load("gem-h200-2gpu")
    assert child.hardware.num_gpus == 2 and child.parallelism.dense_shard == 2
    assert child.model == base.model  # inherited whole
    assert child.parallelism.activation_checkpointing == "selective"


def test_extends_chain_from_user_file(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "extends: gem-b200-8k\nname: mine\nmodel: {sequence: {num_layers: 2}}\n"
    )
    s = scenarios.load(str(tmp_path / "mine.yaml"))
    assert s.name == "mine"
    assert s.model.sequence.num_layers == 2
    assert s.model.sequence.heads == 8  # from gem-b200-8k
    assert s.model.embeddings == scenarios.load("gem-h100-4k").model.embeddings  # from its base


def test_extends_relative_to_the_extending_file(tmp_path):
    (tmp_path / "base.yaml").write_text(
        (scenarios.loader.LIBRARY / "debug-cpu.yaml").read_text()
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "child.yaml").write_text("extends: ../base.yaml\nname: child\n")
    assert scenarios.load(str(sub / "child.yaml")).name == "child"


def test_extends_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ScenarioError, match="extends: cycle through"):
        scenarios.load(str(tmp_path / "a.yaml"))


def test_set_is_type_checked():
    s = scenarios.load("debug-cpu", ["training.steps=7", "model.sequence.causal=false"])
    assert s.training.steps == 7 and s.model.sequence.causal is False
    with pytest.raises(ScenarioError, match=r"^training.steps: input should be a valid integer"):
        scenarios.load("debug-cpu", ["training.steps=many"])


def test_set_list_items_and_new_sections():
    s = scenarios.load("debug-cpu", ["model.embeddings.pooled.1.rows=77"])
    assert s.model.embeddings.pooled[1].rows == 77
    assert apply_set({}, "a.b.c=1") == {"a": {"b": {"c": 1}}}


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("training.steps", "--set 'training.steps' must look like path.to.field=value"),
        ("model.embeddings.pooled.x.rows=1",
         "--set: model.embeddings.pooled.x needs a list index in 0..1, got 'x'"),
        ("name.x=1", "--set: name is not a section (it is 'debug-cpu')"),
    ],
)
def test_set_errors(assignment, message):
    with pytest.raises(ScenarioError) as e:
        scenarios.load("debug-cpu", [assignment])
    assert str(e.value) == message


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1, "c": [1]}}
    merged = deep_merge(base, {"a": {"b": 2}})
    assert merged == {"a": {"b": 2, "c": [1]}} and base == {"a": {"b": 1, "c": [1]}}


def test_unknown_scenario_names_the_bundled_ones():
    with pytest.raises(ScenarioError, match=r"^scenario 'nope' not found: .*bundled: debug-cpu"):
        scenarios.load("nope")


def test_invalid_yaml_is_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: [1,\n")
    with pytest.raises(ScenarioError) as e:
        scenarios.load(str(p))
    assert str(e.value).startswith("bad.yaml: line 3 is not valid YAML")
