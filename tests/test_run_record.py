"""The run's record (simcse_hn.run_record.RunRecord): built once from the parsed arguments, every argument in it or
allowlisted, every field compared on resume unless allowlisted (shown by changing each field in turn), written and
read back as the same typed record, and records of earlier versions still read."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from conftest import ROOT
from test_hub import train_args

from simcse_hn.configuration.arguments import DataArguments, ModelArguments
from simcse_hn.configuration.data_format import ResolvedData
from simcse_hn.configuration.parser import parse_args
from simcse_hn.configuration.record import CLAIMED, RunFacts, build_record
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.losses.registry import BUILTIN
from simcse_hn.record_compare import ALLOWLIST, allowlisted, json_differences, record_paths
from simcse_hn.run_record import RECORD_VERSION, RunRecord, Source

# every optional section on: a queue, topic batches, the guide, LoRA, an evaluation file
EVERYTHING = ["--queue_size", "16", "--momentum", "0.5", "--topic_batches", "true", "--topic_clusters", "4"]
EVERYTHING += ["--guide_model", "self", "--guide_margin", "0.1", "--lora_r", "4", "--loss", "hcl"]


def facts(**changes) -> RunFacts:
    made = RunFacts(
        base_model="builtin:tiny-bert",
        data=ResolvedData("sentences", "tiny_corpus.txt"),
        examples=400,
        negatives_per_example=None,
        train_sha256="a" * 64,
        weights="sha256:" + "b" * 64,
        architecture="bert",
        eval_max_seq_length=128,
        inference_max_seq_length=128,
        run_id="run-a",
        license="apache-2.0",
        topic_encoder=None,
        code={"source_sha256": "c" * 64},
    )
    return dataclasses.replace(made, **changes)


def record_of(tmp_path: Path, *argv: str, **changes) -> RunRecord:
    model_args, data_args, training_args = parse_args(train_args(tmp_path / "out", *argv))
    return build_record(model_args, data_args, training_args, facts(**changes))


def leaves(value, path: str = ""):
    """(path, value) of every leaf of a record's JSON, mappings opened."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else key)
    else:
        yield path, value


def changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, list):
        return [*value, "changed"]
    if isinstance(value, dict):
        return {"changed": 1}
    return "changed"  # None


def with_leaf(record: dict, path: str, value) -> dict:
    out = copy.deepcopy(record)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


def test_the_record_reads_back_as_the_same_typed_record(tmp_path):
    record = record_of(tmp_path, *EVERYTHING)
    text = json.dumps(record.to_json())
    assert RunRecord.from_json(json.loads(text)) == record
    assert record.is_whole and record.record_version == RECORD_VERSION
    assert (record.method.queue.size, record.method.topic_batches.clusters, record.model.lora.r) == (16, 4, 4)
    assert record.method.options == BUILTIN["hcl"].Options().as_dict() and record.method.temperature == 0.05
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.model.pooler = "avg"  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.optimisation.arguments["weight_decay"] = 1.0  # type: ignore[index]


def test_every_field_is_compared_on_resume_unless_the_allowlist_names_it(tmp_path):
    """Each leaf of a record with every section on, changed alone: a difference naming that field and a flag, or,
    for an allowlisted one, none. A field added to a record class is compared by default, and needs a flag."""
    record = record_of(tmp_path, *EVERYTHING).to_json()
    compared = 0
    for path, value in leaves(record):
        found = json_differences(record, with_leaf(record, path, changed(value)))
        if allowlisted(path):
            assert found == [], path
            continue
        # one difference: of the field (a source: its name and place together; an empty mapping: the key added)
        assert len(found) == 1 and (path.startswith(found[0].path) or found[0].path.startswith(path)), path
        assert found[0].flag, f"{path}: no flag to name in a refusal"
        compared += 1
    assert compared > 100  # the training arguments' fields among them


def test_a_section_switched_off_is_one_difference_named_by_its_flag(tmp_path):
    on, off = record_of(tmp_path, *EVERYTHING).to_json(), record_of(tmp_path).to_json()
    found = {d.path: d for d in json_differences(on, off)}
    assert found["method.queue"].off == "no queue" and found["method.queue"].flag == "queue_size"
    assert found["method.topic_batches"].flag == "topic_batches" and found["model.lora"].flag == "lora_r"




ARGUMENT_CLASSES = (ModelArguments, DataArguments, SimCSETrainingArguments)
ALL_ARGUMENTS = {f.name for cls in ARGUMENT_CLASSES for f in dataclasses.fields(cls)}


def test_every_argument_is_in_the_record_or_allowlisted(tmp_path):
    record = record_of(tmp_path, *EVERYTHING)
    paths = {path for path, _ in record_paths()}
    unrecorded = ALL_ARGUMENTS - set(CLAIMED) - set(ALLOWLIST)
    assert unrecorded == set(record.optimisation.arguments)  # every other argument is recorded as it is
    assert {name: path for name, path in CLAIMED.items() if name not in ALL_ARGUMENTS or path not in paths} == {}
    stale = [name for name in ALLOWLIST if name not in ALL_ARGUMENTS and name not in paths]
    assert stale == []
    assert "hub_token" not in json.dumps(record.to_json())


def test_an_argument_added_later_is_recorded_and_compared(tmp_path):
    """A field a later transformers (or simcse-hn) adds to the training arguments: in the record by default."""
    newer = dataclasses.make_dataclass(
        "NewerArguments", [("brand_new_knob", float, dataclasses.field(default=0.5))], bases=(SimCSETrainingArguments,)
    )
    model_args, data_args, training_args = parse_args(train_args(tmp_path / "out"))
    fields = {f.name: getattr(training_args, f.name) for f in dataclasses.fields(training_args) if f.init}
    before = build_record(model_args, data_args, newer(**fields), facts()).to_json()
    after = build_record(model_args, data_args, newer(**{**fields, "brand_new_knob": 0.75}), facts()).to_json()
    assert before["optimisation"]["arguments"]["brand_new_knob"] == 0.5
    [difference] = json_differences(before, after)
    assert (difference.flag, difference.trained, difference.now) == ("brand_new_knob", 0.5, 0.75)


def test_a_local_config_file_is_recorded_by_its_name_and_content(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": "auto"}', encoding="utf-8")
    from simcse_hn.configuration.record import _json

    value = _json(str(config))
    assert value["name"] == "ds.json" and len(value["sha256"]) == 64 and str(tmp_path) not in json.dumps(value)


def test_records_of_earlier_versions_still_read(tmp_path):
    """A results file of bench/results (its `training`: an earlier simcse_config.json, flat keys) reads as a record
    whose unrecorded fields are None; it is never whole, so never resumed from."""
    results = json.loads((ROOT / "bench/results/quality/runs/progcl-warmup0.5-b64-s42/results.json").read_text())
    record = RunRecord.from_json(results["training"])
    assert not record.is_whole and record.record_version == 1
    method, optimisation = record.method, record.optimisation
    assert (method.loss, method.temperature, method.options["warmup_ratio"]) == ("progcl", 0.05, 0.5)
    assert record.model.base_model == Source("sentence-transformers/all-MiniLM-L6-v2", local=False)
    assert (optimisation.seed, optimisation.per_device_train_batch_size, record.budget.steps) == (42, 64, 333)
    assert record.data.source.name == "wiki_shuffled.txt" and record.model.weights is None
    oldest = RunRecord.from_json({"base_model": "BAAI/bge-small-en-v1.5", "train_file": "data/wiki.txt"})
    assert oldest.model.base_model.local is False and oldest.data.source.name == "wiki.txt"
