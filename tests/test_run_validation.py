"""Combinations that cannot work are refused by one validation of the resolved run (simcse_hn.configuration.resolved),
with one line naming the settings, before any model (or its config) or data rows load, from every way a user reaches
them: a flag, a YAML key, or the data's own columns (auto-detection, in memory and streamed). A hint in an error never
leads to a run that drops data silently."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import FIXTURES, ROOT
from test_scale_config import HAS_DEEPSPEED, deepspeed_errors, zero

from simcse_hn.cli import run_data, train
from simcse_hn.configuration.data_format import ResolvedData, resolve_data
from simcse_hn.configuration.parser import parse_args
from simcse_hn.configuration.resolved import CHECKS, resolve_run
from simcse_hn.data.sentences import load_sentences
from simcse_hn.errors import ConfigError, DataError
from simcse_hn.modeling import loading
from simcse_hn.modeling.model import SimCSEModel

STREAM_PAIRS = ("streaming: streams single-sentence corpora only; paired data (data_format pairs, "
                "hard_negative_weight) ")


def _write_data(folder) -> dict[str, str]:
    rows = range(40)
    files = {
        "tri.jsonl": "".join(json.dumps({"anchor": f"a {i}", "positive": f"p {i}", "negative": f"n {i}"}) + "\n"
                             for i in rows),  # fmt: skip
        "pairs.jsonl": "".join(json.dumps({"anchor": f"a {i}", "positive": f"p {i}"}) + "\n" for i in rows),
        "nli.csv": "sent0,sent1,hard_neg\n" + "".join(f"a {i},p {i},n {i}\n" for i in rows),
        "sents.jsonl": "".join(json.dumps({"text": f"s {i}", "id": i}) + "\n" for i in rows),
        "qa.jsonl": "".join(json.dumps({"query": f"q {i}", "answer": f"a {i}"}) + "\n" for i in rows),
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return {name: str(folder / name) for name in files}


@pytest.fixture
def nothing_loads(monkeypatch):
    """A refusal comes before the model's config, its weights or any data rows are read."""

    def fail(what):
        def refuse(*args, **kwargs):
            raise AssertionError(f"{what} before the combination was refused")

        return refuse

    monkeypatch.setattr(loading, "load_encoder_config", fail("the model config was read"))
    monkeypatch.setattr(SimCSEModel, "from_pretrained", fail("a model was loaded"))
    for reader in ("load_sentences", "load_pairs", "load_sentence_stream"):
        monkeypatch.setattr(run_data, reader, fail(f"{reader} ran"))


def _main(tmp_path, capsys, cli: list[str], keys: dict | None = None) -> str:
    """train.main on debug_tiny's settings (as a YAML file with `keys` added) and `cli`; -> its one stderr line."""
    config = yaml.safe_load((ROOT / "configs" / "debug_tiny.yaml").read_text(encoding="utf-8"))
    config.update(train_file=str(FIXTURES / "tiny_corpus.txt"), eval_file=str(FIXTURES / "sts_tiny.jsonl"),
                  output_dir=str(tmp_path / "out"), max_steps=2, eval_strategy="no", save_strategy="no",
                  load_best_model_at_end=False)  # fmt: skip
    config.update(keys or {})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert train.main(["--config", str(path), *cli]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: ") :].strip()


# (name, command-line flags, YAML keys, the line's start); "{tri}" etc. are the files of _write_data
CASES = [
    # a streamed corpus takes single sentences only: every way a run can be paired
    ("stream, auto-detected jsonl pairs", ["--streaming", "true", "--train_file", "{tri}"], {},
     STREAM_PAIRS + "is read into memory, and this run's data is paired ({tri}: record 1 has the columns "
     "['anchor', 'positive', 'negative'])"),
    ("stream, auto-detected csv pairs (YAML streaming)", ["--train_file", "{nli}"], {"streaming": True},
     STREAM_PAIRS + "is read into memory, and this run's data is paired ({nli}: record 1 has the columns"),
    ("stream, column flags", ["--streaming", "true", "--train_file", "{tri}", "--anchor_column", "anchor",
                              "--positive_column", "positive"], {},
     STREAM_PAIRS + "is read into memory, and this run's data is paired (anchor_column, positive_column set)"),
    ("stream, column flag in YAML", ["--streaming", "true", "--train_file", "{tri}"], {"negative_columns": "none"},
     STREAM_PAIRS + "is read into memory, and this run's data is paired (negative_columns set)"),
    ("stream, data_format pairs flag", ["--streaming", "true", "--train_file", "{tri}", "--data_format", "pairs"], {},
     STREAM_PAIRS + "is read into memory, and this run's data is paired (data_format pairs)"),
    ("stream, data_format pairs in YAML", ["--train_file", "{tri}"], {"streaming": True, "data_format": "pairs"},
     STREAM_PAIRS + "is read into memory, and this run's data is paired (data_format pairs)"),
    ("stream, hard_negative_weight on a text file", ["--streaming", "true", "--hard_negative_weight", "1"], {},
     STREAM_PAIRS + "is read into memory, and this run's data is paired (hard_negative_weight 1.0, which needs"),
    # the hints of those errors lead to no run that drops columns
    ("stream, --text_column on a paired file", ["--streaming", "true", "--train_file", "{tri}", "--text_column",
                                                "anchor"], {},
     "{tri}: columns ['anchor', 'positive', 'negative'] hold both a 'anchor' column (sentences) and pair columns"),
    ("stream, data_format sentences on a paired file", ["--streaming", "true", "--train_file", "{tri}",
                                                        "--data_format", "sentences"], {},
     "{tri}: record 1: no field 'text', and its columns ['anchor', 'positive', 'negative'] are paired data"),
    ("in memory, data_format sentences on a paired file", ["--train_file", "{nli}"], {"data_format": "sentences"},
     "{nli}: record 1: no field 'text', and its columns ['sent0', 'sent1', 'hard_neg'] are paired data"),
    ("stream, columns that tell nothing", ["--streaming", "true", "--train_file", "{qa}"], {},
     "{qa}: cannot tell sentences from pairs by the columns ['query', 'answer']"),
    # other streaming combinations
    ("stream without max_steps", ["--streaming", "true", "--max_steps", "-1"], {},
     "max_steps: required with streaming"),
    ("stream without max_steps (YAML)", ["--max_steps", "-1"], {"streaming": True},
     "max_steps: required with streaming"),
    ("stream, drop_duplicates", ["--streaming", "true", "--drop_duplicates", "true"], {},
     "drop_duplicates: not available with streaming"),
    ("stream, drop_duplicates (YAML)", ["--streaming", "true"], {"drop_duplicates": True},
     "drop_duplicates: not available with streaming"),
    ("stream, no_duplicates", ["--streaming", "true", "--no_duplicates", "true"], {},
     "no_duplicates: not available with streaming"),
    ("stream, no_duplicates (YAML)", [], {"streaming": True, "no_duplicates": True},
     "no_duplicates: not available with streaming"),
    ("stream, topic_batches", ["--streaming", "true", "--topic_batches", "true"], {},
     "topic_batches: not available with streaming (the corpus is clustered up front, in memory)"),
    ("stream, topic_batches (YAML)", ["--streaming", "true"], {"topic_batches": True},
     "topic_batches: not available with streaming (the corpus is clustered up front, in memory)"),
    ("topic_recluster_steps without topic batches", ["--topic_recluster_steps", "5"], {},
     "topic_recluster_steps: 5 needs topic_batches"),
    ("topic_recluster_steps with a fixed topic_encoder (YAML)", ["--topic_batches", "true"],
     {"topic_recluster_steps": 5, "topic_encoder": "some/encoder"},
     "topic_recluster_steps: re-clusters with the model being trained; topic_encoder some/encoder is fixed"),
    # hard negatives need explicit negatives
    ("hard_negative_weight, a text file", ["--hard_negative_weight", "1"], {},
     f"hard_negative_weight: needs paired data with explicit negatives; {FIXTURES / 'tiny_corpus.txt'} holds single "
     "sentences"),
    ("hard_negative_weight, auto-detected sentences (YAML)", ["--train_file", "{sents}"],
     {"hard_negative_weight": 0.5}, "hard_negative_weight: needs paired data with explicit negatives; {sents} holds"),
    ("hard_negative_weight, data_format sentences", ["--train_file", "{tri}", "--data_format", "sentences",
                                                     "--text_column", "anchor", "--hard_negative_weight", "1"], {},
     "hard_negative_weight: needs paired data with explicit negatives; {tri} holds single sentences"),
    ("hard_negative_weight, auto-detected pairs without negatives", ["--train_file", "{pairs}",
                                                                     "--hard_negative_weight", "1"], {},
     "hard_negative_weight: {pairs} has no negative columns"),
    ("hard_negative_weight, negative_columns none", ["--train_file", "{tri}", "--negative_columns", "none"],
     {"hard_negative_weight": 1.0}, "hard_negative_weight: {tri} has no negative columns"),
    # the data format against the other settings
    ("data_format sentences with a column flag", ["--data_format", "sentences", "--anchor_column", "a"], {},
     "data_format: 'sentences' takes text_column; the anchor/positive/negative column flags are for pairs"),
    ("data_format sentences with a column flag (YAML)", [], {"data_format": "sentences", "positive_column": "p"},
     "data_format: 'sentences' takes text_column; the anchor/positive/negative column flags are for pairs"),
    ("text_column with column flags", ["--train_file", "{tri}", "--text_column", "anchor", "--anchor_column",
                                       "anchor"], {},
     "text_column: 'anchor' names a sentence column; paired data (anchor_column set) takes anchor_column"),
    ("text_column with data_format pairs (YAML)", ["--text_column", "sent0"], {"train_file": "{nli}",
                                                                               "data_format": "pairs"},
     "text_column: 'sent0' names a sentence column; paired data (data_format pairs) takes anchor_column"),
    ("contrast_form simcse on auto-detected pairs", ["--train_file", "{tri}", "--contrast_form", "simcse"], {},
     "contrast_form: 'simcse' pairs a sentence's two dropout views; paired data ({tri}: columns"),
    ("contrast_form simcse with data_format pairs (YAML)", ["--train_file", "{nli}"],
     {"data_format": "pairs", "contrast_form": "simcse"},
     "contrast_form: 'simcse' pairs a sentence's two dropout views; paired data (data_format pairs)"),
    ("word_repetition on auto-detected pairs", ["--train_file", "{tri}", "--word_repetition", "0.3"], {},
     "word_repetition: augments the second dropout view of single sentences; paired data ({tri}: columns"),
    ("word_repetition with data_format pairs (YAML)", ["--train_file", "{nli}"],
     {"data_format": "pairs", "word_repetition": 0.3},
     "word_repetition: augments the second dropout view of single sentences; paired data (data_format pairs)"),
    ("an objective off its contrast form", ["--loss", "hcl", "--contrast_form", "simcse"], {},
     "contrast_form: loss 'hcl' is defined on the 'symmetric' form only"),
    ("an objective off its contrast form (YAML)", [], {"loss": "unremix", "contrast_form": "simcse"},
     "contrast_form: loss 'unremix' is defined on the 'symmetric' form only"),
    # the objective's own refusals see the resolved data: paired batches have B x W x (1 + k) - 1 negatives
    ("ProGCL mix_k above the negatives of auto-detected pairs", ["--train_file", "{tri}", "--loss", "progcl",
                                                                 "--progcl_mode", "mix", "--progcl_mix_k", "32"], {},
     "progcl_mix_k: must be <= the 31 negatives per anchor (16 examples x 1 processes x (1 positive + 1 negatives) "
     "- 1), got 32"),
    ("ProGCL mix_k above the negatives of sentences (YAML)", [], {"loss": "progcl", "progcl_mode": "mix",
                                                                  "progcl_mix_k": 31},
     "progcl_mix_k: must be <= the 30 negatives per anchor (2 x 16 sentences x 1 processes - 2), got 31"),
    ("DCL's tau_plus 0 on auto-detected pairs (YAML)", ["--train_file", "{pairs}"],
     {"loss": "dcl", "dcl_tau_plus": 0.0}, "dcl_tau_plus: 0 makes DCL symmetric InfoNCE"),
    # the guide
    ("guide_margin without a guide", ["--guide_margin", "0.1"], {}, "guide_margin: 0.1 needs guide_model"),
    ("guide_margin without a guide (YAML)", [], {"guide_margin": 0.2}, "guide_margin: 0.2 needs guide_model"),
    # length groups and torch_compile (the engines: test_engine_combinations below)
    ("length_groups with torch_compile", ["--length_groups", "4", "--torch_compile", "true"], {},
     "length_groups: > 1 is not supported with torch_compile"),
]  # fmt: skip


@pytest.mark.parametrize("name, cli, keys, message", CASES, ids=[case[0] for case in CASES])
def test_a_combination_that_cannot_work_is_one_line_before_anything_loads(tmp_path, capsys, nothing_loads, name,
                                                                          cli, keys, message):  # fmt: skip
    files = {file.split(".")[0]: path for file, path in _write_data(tmp_path).items()}
    keys = {key: value.format(**files) if isinstance(value, str) else value for key, value in keys.items()}
    err = _main(tmp_path, capsys, [arg.format(**files) for arg in cli], keys)
    assert err.startswith(message.format(**files)), err


def test_the_engines_are_refused_from_the_launch_and_the_settings(tmp_path, monkeypatch):
    """FSDP comes from accelerate launch's environment: length groups refused with it, from a flag or a key."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    config = tmp_path / "c.yaml"
    config.write_text("length_groups: 4\n", encoding="utf-8")
    for argv in (["--length_groups", "4"], ["--config", str(config)]):
        with pytest.raises(ConfigError) as error:
            parse_args([*argv, "--output_dir", str(tmp_path)])
        assert str(error.value).startswith("length_groups: > 1 is not supported with FSDP"), str(error.value)
    # clustering with the model being trained (process 0 alone) under a sharded model; a separate encoder is fine
    config.write_text("topic_batches: true\n", encoding="utf-8")
    for argv in (["--topic_batches", "true"], ["--config", str(config)]):
        with pytest.raises(ConfigError) as error:
            parse_args([*argv, "--output_dir", str(tmp_path)])
        assert str(error.value).startswith("topic_batches: clustering with the model being trained runs on process 0 "
                                           "alone, which FSDP shards"), str(error.value)  # fmt: skip
    parse_args(["--topic_batches", "true", "--topic_encoder", "some/encoder", "--output_dir", str(tmp_path)])
    # a momentum encoder (a whole copy of the model on every process) under a sharded model; a memory bank is fine
    config.write_text("queue_size: 64\nmomentum: 0.99\n", encoding="utf-8")
    for argv in (["--queue_size", "64", "--momentum", "0.99"], ["--config", str(config)]):
        with pytest.raises(ConfigError) as error:
            parse_args([*argv, "--output_dir", str(tmp_path)])
        assert str(error.value).startswith("momentum: the momentum encoder is a whole copy of the model on every "
                                           "process, which FSDP shards"), str(error.value)  # fmt: skip
    parse_args(["--queue_size", "64", "--output_dir", str(tmp_path)])


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="needs deepspeed")
def test_deepspeed_combinations_from_a_yaml_key(tmp_path):
    """GradCache under ZeRO-2 and UnReMix's learned mixture under ZeRO-3 given as YAML keys (flags:
    tests/test_scale_config.py): the same lines, naming the file."""
    config = yaml.safe_load((ROOT / "configs" / "debug_tiny.yaml").read_text(encoding="utf-8"))
    cache, learned = tmp_path / "cache.yaml", tmp_path / "learned.yaml"
    cache.write_text(yaml.safe_dump({**config, "cache_minibatch_size": 4}), encoding="utf-8")
    learned.write_text(yaml.safe_dump({**config, "loss": "unremix", "unremix_learn_mixture": True}), encoding="utf-8")
    errors = deepspeed_errors([["cache", zero(2), ["--config", str(cache)]],
                               ["learned", zero(3), ["--config", str(learned)]]], tmp_path)  # fmt: skip
    assert errors["cache"].startswith("cache_minibatch_size: GradCache does not work with DeepSpeed ZeRO-2")
    assert errors["cache"].endswith(f"(in {cache})")
    assert errors["learned"].startswith("unremix_learn_mixture: not with DeepSpeed ZeRO-3"), errors["learned"]


def test_every_check_refuses_something_here():
    """Each check of the resolved run has a case above (the DeepSpeed ones: tests/test_scale_config.py)."""
    covered = {"_sentences_with_column_flags", "_pairs_with_text_column", "_streaming_needs_max_steps",
               "_streaming_cannot_drop_duplicates",
               "_streaming_takes_no_pairs", "_streaming_has_no_sampler", "_streaming_has_no_topic_batches",
               "_topic_re_clustering", "_topic_clusters_with_a_sharded_model",
               "_hard_negatives_need_them",
               "_pairs_have_no_contrast_form", "_pairs_have_no_word_repetition", "_objective_form",
               "_guide_margin_needs_a_guide", "_length_groups", "_momentum_encoder_is_not_sharded",
               "_objective_refusals"}  # fmt: skip
    deepspeed = {"_grad_cache", "_zero3_saves_weights"}
    assert {check.__name__ for check in CHECKS} == covered | deepspeed


def _run(tmp_path, data: ResolvedData, *argv: str):
    _, data_args, training_args = parse_args(["--output_dir", str(tmp_path), "--per_device_train_batch_size", "16",
                                              *argv])  # fmt: skip
    return resolve_run(data_args, training_args, data)


def test_paired_data_with_more_negatives_allows_more_mix_k(tmp_path):
    """The shape is the resolved data's, not the sentences': 2 negatives per example, 16 x 3 - 1 = 47 negatives."""
    argv = ("--loss", "progcl", "--progcl_mode", "mix", "--progcl_mix_k", "40", "--train_file",
            str(tmp_path / "t.jsonl"))
    (tmp_path / "t.jsonl").write_text("{}\n", encoding="utf-8")
    run = _run(tmp_path, ResolvedData("pairs", "t.jsonl", "data_format pairs", negatives=2), *argv)
    assert run.problems() == [] and run.shape().negatives_per_anchor == 47
    sentences = _run(tmp_path, ResolvedData("sentences", "t.txt"), *argv)
    assert sentences.problems() == ["progcl_mix_k: must be <= the 30 negatives per anchor (2 x 16 sentences x 1 "
                                    "processes - 2), got 40"]  # fmt: skip
    assert _run(tmp_path, ResolvedData(None, "t.jsonl"), *argv).shape() is None  # not known yet: checked later


def test_a_table_under_auto_is_checked_when_its_columns_are_read(tmp_path, capsys):
    """parse_args cannot know a table's format; train.py refuses it on the columns, with the same line."""
    files = _write_data(tmp_path)
    _, data_args, training_args = parse_args(["--train_file", files["tri.jsonl"], "--streaming", "true",
                                              "--max_steps", "2", "--output_dir", str(tmp_path)])  # fmt: skip
    assert data_args.data_format == "auto"  # parsed: nothing refused yet
    with pytest.raises(ConfigError, match="^" + STREAM_PAIRS.replace("(", r"\(").replace(")", r"\)")):
        resolve_run(data_args, training_args, resolve_data(data_args)).check()


def test_explicit_sentences_of_a_paired_table_say_which_columns_are_not_used(tmp_path, caplog):
    files = _write_data(tmp_path)
    _, data_args, _ = parse_args(["--train_file", files["tri.jsonl"], "--data_format", "sentences", "--text_column",
                                  "anchor", "--output_dir", str(tmp_path)])  # fmt: skip
    with caplog.at_level("WARNING", logger="simcse_hn"):
        assert resolve_data(data_args).format == "sentences"
    assert "data_format sentences trains on the 'anchor' column only; the columns ['positive', 'negative']" in \
        caplog.text  # fmt: skip


def test_a_valid_paired_run_resolves_its_columns_once(tmp_path):
    files = _write_data(tmp_path)
    _, data_args, training_args = parse_args(["--train_file", files["nli.csv"], "--hard_negative_weight", "1",
                                              "--output_dir", str(tmp_path)])  # fmt: skip
    data = resolve_data(data_args)
    assert (data.format, data.negatives, data.columns.all) == ("pairs", 1, ("sent0", "sent1", "hard_neg"))
    assert resolve_run(data_args, training_args, data).problems() == []


def test_a_missing_text_column_without_pair_columns_keeps_its_hint(tmp_path):
    files = _write_data(tmp_path)
    with pytest.raises(DataError, match=r"qa.jsonl:1: no field 'text' \(set --text_column\)$"):
        load_sentences(files["qa.jsonl"])
