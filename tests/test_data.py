"""Sentences, the [a, a', b, b'] collator and the contrastive targets."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES

from simcse_hn.data.collator import SimCSECollator, model_inputs, text_id
from simcse_hn.data.sentences import load_sentences
from simcse_hn.data.sts import load_sts_pairs
from simcse_hn.errors import ConfigError, DataError
from simcse_hn.losses.targets import contrastive_targets
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.run_record import Source
from simcse_hn.testing.models import build_tiny_bert


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_bert()[1]


def test_collator_emits_each_sentence_twice_with_identical_tokens(tokenizer):
    texts = ["the cat sat.", "a much longer sentence about dogs", "x"]
    batch = SimCSECollator(tokenizer, max_length=16)([{"text": t} for t in texts])
    assert batch["input_ids"].shape[0] == 6
    for k in range(3):
        assert torch.equal(batch["input_ids"][2 * k], batch["input_ids"][2 * k + 1])
        assert torch.equal(batch["attention_mask"][2 * k], batch["attention_mask"][2 * k + 1])
    single = tokenizer(texts[1], max_length=16, truncation=True)["input_ids"]
    assert batch["input_ids"][2, : len(single)].tolist() == single
    assert batch["input_ids"].shape[1] <= 16


def test_model_inputs_drop_the_collators_bookkeeping_so_the_encoder_takes_the_batch(tokenizer):
    collator = SimCSECollator(tokenizer, 16, guide_tokenize=lambda texts: dict(tokenizer(texts, return_tensors="pt",
                                                                                         padding=True)))  # fmt: skip
    batch = collator(["first sentence here", "second one"])
    model = SimCSEModel(build_tiny_bert()[0], pooler="cls")
    with pytest.raises(TypeError, match="num_truncated"):
        model(**{k: v for k, v in batch.items() if not k.startswith("guide_")})  # what the benches once did
    inputs = model_inputs(batch)
    assert sorted(inputs) == sorted(k for k in batch if k not in ("num_truncated", "text_ids")
                                    and not k.startswith("guide_"))  # fmt: skip
    assert "input_ids" in inputs and "num_truncated" in batch  # the batch itself is left as it was
    assert model(**inputs).embeddings.shape[0] == 4


def test_collator_rejects_a_batch_without_negatives(tokenizer):
    with pytest.raises(ValueError, match="at least 2 sentences"):
        SimCSECollator(tokenizer)(["only one"])


@pytest.mark.parametrize("dropout, identical", [(0.0, True), (0.1, False)])
def test_dropout_makes_the_two_views_differ(tokenizer, dropout, identical):
    encoder, _ = build_tiny_bert(dropout=dropout)
    model = SimCSEModel(encoder, pooler="cls").train()
    batch = SimCSECollator(tokenizer)(["first sentence here", "second one"])
    assert batch.pop("num_truncated") == 0  # not model inputs: the trainer pops and counts them
    assert torch.equal(batch.pop("text_ids")[0::2], batch["input_ids"].new_tensor([text_id("first sentence here"),
                                                                                  text_id("second one")]))  # fmt: skip
    z = model(**batch).embeddings  # (4, D)
    assert torch.allclose(z[0], z[1]) is identical
    assert torch.allclose(z[2], z[3]) is identical


def test_symmetric_targets():
    anchor_rows, positive_index, negative_mask = contrastive_targets(6)
    assert anchor_rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert positive_index.tolist() == [1, 0, 3, 2, 5, 4]
    assert negative_mask.sum(1).tolist() == [4] * 6
    assert not negative_mask[torch.arange(6), torch.arange(6)].any()
    assert not negative_mask[torch.arange(6), positive_index].any()


def test_simcse_targets_with_rank_offset():
    anchor_rows, positive_index, negative_mask = contrastive_targets(4, "simcse", offset=4, num_candidates=8)
    assert anchor_rows.tolist() == [0, 2]
    assert positive_index.tolist() == [5, 7]
    # negatives: the other second views of the global batch
    assert negative_mask.nonzero().tolist() == [[0, 1], [0, 3], [0, 7], [1, 1], [1, 3], [1, 5]]


def test_targets_need_two_sentences():
    with pytest.raises(ValueError, match=">= 2 sentences"):
        contrastive_targets(2)


def test_load_sentences_formats(tmp_path):
    (tmp_path / "a.txt").write_text("  one \n\n two\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text('{"sentence": "one"}\n{"sentence": "two"}\n', encoding="utf-8")
    (tmp_path / "c.csv").write_text('id,sentence\n1,"one, with comma"\n2,two\n', encoding="utf-8")
    assert load_sentences(str(tmp_path / "a.txt")) == ["one", "two"]
    assert load_sentences(str(tmp_path / "b.jsonl"), text_column="sentence") == ["one", "two"]
    assert load_sentences(str(tmp_path / "c.csv"), text_column="sentence") == ["one, with comma", "two"]


def test_load_sentences_from_a_hub_dataset_goes_through_datasets(monkeypatch):
    import datasets

    calls = {}

    def fake_load_dataset(name, data_files=None, split=None):
        calls.update(name=name, data_files=data_files, split=split)
        return datasets.Dataset.from_dict({"text": ["a sentence", "  ", "another"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    sentences = load_sentences("princeton-nlp/datasets-for-simcse", data_files="wiki1m_for_simcse.txt")
    assert sentences == ["a sentence", "another"]
    assert calls == {
        "name": "princeton-nlp/datasets-for-simcse",
        "data_files": "wiki1m_for_simcse.txt",
        "split": "train",
    }


def test_sts_pairs_keep_the_requested_split(tmp_path):
    path = tmp_path / "sts.jsonl"
    path.write_text(
        '{"sentence1": "a", "sentence2": "b", "score": 1, "split": "dev"}\n'
        '{"sentence1": "c", "sentence2": "d", "score": "2.5", "split": "test"}\n',
        encoding="utf-8",
    )
    pairs = load_sts_pairs(str(path), "test")
    assert (pairs.sentence1, pairs.sentence2, pairs.scores) == (["c"], ["d"], [2.5])


@pytest.mark.parametrize(
    "name, content, column, message",
    [
        ("missing.txt", None, "text", "missing.txt: file not found"),
        ("empty.txt", b"", "text", "empty.txt: no sentences"),
        ("blank.txt", b"\n  \n\t\n", "text", "blank.txt: no sentences"),
        ("bad.txt", b"fine\nbad \xff byte\n", "text", "bad.txt:2: not valid UTF-8"),
        ("nocol.jsonl", b'{"text": "a"}\n{"sentence": "b"}\n', "text", "nocol.jsonl:2: no field 'text'"),
        ("broken.jsonl", b'{"text": "a"}\n{"text": \n', "text", "broken.jsonl:2: malformed JSON"),
        ("nocol.csv", b"id,sentence\n1,a\n", "text", "nocol.csv:1: no column 'text'"),
    ],
)
def test_bad_training_data_gives_a_one_line_error(tmp_path, name, content, column, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as error:
        load_sentences(str(path), text_column=column)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_blank_lines_and_duplicates_are_counted(tmp_path, caplog):
    path = tmp_path / "dup.txt"
    path.write_text("a\n\nb\na\n  \na\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        kept = load_sentences(str(path))
        dropped = load_sentences(str(path), drop_duplicates=True)
    assert kept == ["a", "b", "a", "a"]
    assert dropped == ["a", "b"]
    assert "dropped 2 empty lines of 6" in caplog.text
    assert "2 duplicated sentences kept" in caplog.text
    assert "2 duplicated sentences dropped" in caplog.text


def test_dataset_name_route_passes_config_split_and_files_to_datasets(monkeypatch, tmp_path):
    """--dataset_name / --dataset_config_name / --dataset_split / --train_data_files reach datasets.load_dataset
    (a stand-in here: the Hub is out of reach); train_file and dataset_name together are refused."""
    import datasets

    from simcse_hn.cli import train
    from simcse_hn.configuration.parser import parse_args

    calls = []

    def load_dataset(path, name=None, data_files=None, split=None):
        calls.append((path, name, data_files, split))
        return datasets.Dataset.from_dict({"text": [f"sentence {i} from the hub" for i in range(40)]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    argv = ["--model_name_or_path", "builtin:tiny-bert", "--dataset_name", "owner/corpus", "--dataset_config_name",
            "en", "--dataset_split", "train[:40]", "--train_data_files", "part.txt", "--per_device_train_batch_size",
            "8", "--max_steps", "1", "--eval_strategy", "no", "--load_best_model_at_end", "false", "--save_strategy",
            "no", "--metric_for_best_model", "loss", "--output_dir", str(tmp_path / "out"),
            "--disable_tqdm", "true"]  # fmt: skip
    trainer = train.run(argv)
    assert calls == [("owner/corpus", "en", "part.txt", "train[:40]")]
    assert len(trainer.train_dataset) == 40
    assert trainer.record.data.source == Source("owner/corpus", local=False)
    fixture = str(FIXTURES / "tiny_corpus.txt")
    with pytest.raises(ConfigError, match="dataset_name: give train_file or dataset_name, not both"):
        parse_args(["--train_file", fixture, "--dataset_name", "owner/corpus"])
    with pytest.raises(ConfigError, match="dataset_name: .* is not a Hub dataset id"):
        parse_args(["--dataset_name", fixture])
