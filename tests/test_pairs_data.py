"""Paired training data (simcse_hn/data/pairs.py): sentence-transformers' column conventions, SimCSE's NLI file read as
is, one-line errors naming file, line and column, how --data_format decides, and the collator's rows."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES

from simcse_hn.cli import train
from simcse_hn.data.collator import text_id
from simcse_hn.data.pairs import PairCollator, load_pairs, num_negatives, resolve_data_format
from simcse_hn.errors import DataError
from simcse_hn.testing.models import build_tiny_bert

NLI = (
    "\ufeffsent0,sent1,hard_neg\n"  # SimCSE's nli_for_simcse.csv header (here with a byte-order mark)
    '"A man, in a hat, plays.",A man plays.,Nobody plays.\n'
    "Two dogs run.,Dogs are running.,The dogs sleep.\n"
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def rows(dataset):
    return [tuple(dataset[c][i] for c in dataset.column_names) for i in range(len(dataset))]


def test_simcse_nli_csv_is_read_as_is(tmp_path):
    path = write(tmp_path, "nli_for_simcse.csv", NLI)
    assert resolve_data_format(path) == "pairs"
    dataset = load_pairs(path)
    assert dataset.column_names == ["anchor", "positive", "negative_1"] and num_negatives(dataset) == 1
    assert rows(dataset) == [("A man, in a hat, plays.", "A man plays.", "Nobody plays."),
                             ("Two dogs run.", "Dogs are running.", "The dogs sleep.")]  # fmt: skip


def test_sentence_transformers_names_win_over_column_order(tmp_path):
    path = write(
        tmp_path,
        "st.jsonl",
        '{"negative_10": "n10", "id": 3, "positive": "p", "negative_2": "n2", "anchor": "a", "negative": "n0"}\n',
    )
    assert resolve_data_format(path) == "pairs"
    dataset = load_pairs(path)  # negatives in their numeric order; "id" is not used
    assert rows(dataset) == [("a", "p", "n0", "n2", "n10")]


def test_column_order_label_columns_and_flags(tmp_path):
    path = write(tmp_path, "qa.tsv", "query\tanswer\tscore\tother\nq1\ta1\t1\to1\nq2\ta2\t0\to2\n")
    with pytest.raises(DataError, match="cannot tell sentences from pairs"):
        resolve_data_format(path)  # no conventional names: never a guess
    assert resolve_data_format(path, "pairs") == "pairs"
    assert rows(load_pairs(path)) == [("q1", "a1", "o1"), ("q2", "a2", "o2")]  # by order, the score skipped
    assert rows(load_pairs(path, negative_columns=["none"])) == [("q1", "a1"), ("q2", "a2")]
    assert rows(load_pairs(path, anchor_column="answer", positive_column="query")) == [("a1", "q1", "o1"),
                                                                                      ("a2", "q2", "o2")]
    assert resolve_data_format(path, column_flags=True) == "pairs"  # a column flag means pairs


def test_data_format_auto_decides_only_what_the_columns_say(tmp_path):
    assert resolve_data_format(str(FIXTURES / "tiny_corpus.txt")) == "sentences"
    assert resolve_data_format(write(tmp_path, "t.jsonl", '{"text": "a", "id": "1"}\n')) == "sentences"
    with pytest.raises(DataError, match="both a 'text' column"):
        resolve_data_format(write(tmp_path, "both.jsonl", '{"text": "a", "anchor": "b", "positive": "c"}\n'))
    with pytest.raises(DataError, match=r"t\.txt: one sentence per line; paired data needs columns"):
        resolve_data_format(write(tmp_path, "t.txt", "a\nb\n"), "pairs")
    with pytest.raises(DataError, match="data_format: must be one of"):
        resolve_data_format(write(tmp_path, "x.jsonl", '{"text": "a"}\n'), "triplets")


def test_a_hub_dataset_goes_through_datasets(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, data_files=None, split=None):
        calls.append((name, data_files, split))
        return datasets.Dataset.from_dict({"sent0": ["a", "b"], "sent1": ["p", "q"], "hard_neg": ["n", "m"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    name = "princeton-nlp/datasets-for-simcse"
    assert resolve_data_format(name, data_files="nli_for_simcse.csv") == "pairs"
    assert rows(load_pairs(name, data_files="nli_for_simcse.csv")) == [("a", "p", "n"), ("b", "q", "m")]
    assert set(calls) == {(name, "nli_for_simcse.csv", "train")}


@pytest.mark.parametrize(
    "name, content, kwargs, message",
    [
        ("miss.jsonl", '{"anchor": "a", "positive": "p"}\n{"anchor": "b"}\n', {}, "miss.jsonl:2: no field 'positive'"
         " (set --positive_column)"),
        ("type.jsonl", '{"anchor": "a", "positive": "p"}\n{"anchor": "b", "positive": 7}\n', {},
         "type.jsonl:2: field 'positive' is not a string: 7"),
        ("json.jsonl", '{"anchor": "a", "positive": "p"}\n{"anchor": \n', {}, "json.jsonl:2: malformed JSON"),
        ("list.jsonl", '["a", "p"]\n', {}, "list.jsonl:1: expected a JSON object, got list"),
        ("fields.csv", "sent0,sent1,hard_neg\na,p,n\nb,q\n", {}, "fields.csv:3: 2 fields, the header has 3"),
        ("quote.csv", 'sent0,sent1\na,"p\n', {}, "quote.csv:2: malformed CSV"),
        ("flag.csv", "sent0,sent1\na,p\n", {"negative_columns": ["hard_neg"]},
         "flag.csv: no column 'hard_neg' in ['sent0', 'sent1'] (set --negative_columns)"),
        ("flag2.csv", "sent0,sent1\na,p\n", {"anchor_column": "premise"},
         "flag2.csv: no column 'premise' in ['sent0', 'sent1'] (set --anchor_column)"),
        ("one.csv", "sent0\na\n", {}, "one.csv: paired data needs an anchor and a positive column"),
        ("twice.csv", "sent0,sent1\na,p\n", {"negative_columns": ["sent1"]}, "twice.csv: a column is used twice"),
        ("empty.csv", "sent0,sent1\n,p\n", {}, "empty.csv: no examples"),
    ],
)
def test_bad_paired_data_gives_a_one_line_error(tmp_path, name, content, kwargs, message):
    path = write(tmp_path, name, content)
    with pytest.raises(DataError) as error:
        load_pairs(path, **kwargs)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_readers_of_single_sentences_guard_pairs_too(tmp_path):
    """NUL bytes and bytes that are not UTF-8 fail as they do for sentences (simcse_hn.data.sentences._read_text)."""
    cases = [("nul.csv", b"sent0,sent1\na\x00,p\n", "nul.csv:2: NUL byte"),
             ("utf.jsonl", b'{"anchor": "a", "positive": "\xff"}\n', "utf.jsonl:1: not valid UTF-8")]
    for name, raw, message in cases:
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(DataError, match=message):
            load_pairs(str(tmp_path / name))


def test_empty_texts_are_dropped_and_repeats_counted(tmp_path, caplog):
    lines = ['{"anchor": "a", "positive": "p"}', "", '{"anchor": " ", "positive": "q"}',
             '{"anchor": "a", "positive": "p"}', '{"anchor": "b", "positive": null}',
             '{"anchor": "c", "positive": "r"}']
    path = write(tmp_path, "p.jsonl", "\n".join(lines) + "\n")
    with caplog.at_level("WARNING"):
        kept, dropped = load_pairs(path), load_pairs(path, drop_duplicates=True)
    assert rows(kept) == [("a", "p"), ("a", "p"), ("c", "r")] and rows(dropped) == [("a", "p"), ("c", "r")]
    assert "dropped 3 of 6 examples with an empty text" in caplog.text
    assert "1 repeated examples kept" in caplog.text and "1 repeated examples dropped" in caplog.text
    assert rows(load_pairs(path, max_samples=1)) == [("a", "p")]


def test_collator_emits_one_forward_of_anchor_positive_negative_rows():
    _, tokenizer = build_tiny_bert()
    features = [{"anchor": "a one", "positive": "p one", "negative_1": "n one", "negative_2": "m one"},
                {"anchor": "a two is longer", "positive": "p two", "negative_1": "n two", "negative_2": "m two"}]
    seen = []
    collator = PairCollator(tokenizer, max_length=8, negatives=2, guide_tokenize=lambda t: seen.append(t) or
                            {"input_ids": torch.arange(len(t))[:, None]})  # fmt: skip
    assert collator.group_size == 4
    batch = collator(features)
    texts = ["a one", "p one", "n one", "m one", "a two is longer", "p two", "n two", "m two"]
    want = tokenizer(texts, max_length=8, truncation=True, padding=True, return_tensors="pt")
    for key in want:
        assert torch.equal(batch[key], want[key]), key
    assert seen == [texts] and batch["guide_input_ids"].shape == (8, 1)  # the guide sees every row's text once
    assert batch["num_truncated"] == 1  # "a two is longer" has more than 8 tokens
    assert batch["text_ids"].tolist() == [text_id(t) for t in texts]  # each row's text, for the duplicate diagnostics
    with pytest.raises(ValueError, match="at least 2 examples"):
        collator(features[:1])


def test_train_rejects_settings_that_need_pairs_on_one_line(tmp_path, tiny_args, capsys):
    assert train.main(tiny_args + ["--hard_negative_weight", "1.0"]) == 2
    assert capsys.readouterr().err == (
        f"error: hard_negative_weight: needs paired data with explicit negatives; {FIXTURES / 'tiny_corpus.txt'} "
        "holds single sentences\n"
    )
    pairs = write(tmp_path, "pairs.jsonl", '{"anchor": "a", "positive": "p"}\n' * 20)
    assert train.main(tiny_args + ["--train_file", pairs, "--hard_negative_weight", "1.0"]) == 2
    assert "error: hard_negative_weight: " in capsys.readouterr().err
    unknown = write(tmp_path, "qa.jsonl", '{"query": "q", "answer": "a"}\n')
    assert train.main(tiny_args + ["--train_file", unknown]) == 2
    assert "cannot tell sentences from pairs by the columns ['query', 'answer']" in capsys.readouterr().err


def test_single_sentence_batches_carry_each_sentence_once_for_the_guide(tmp_path):
    """Single sentences: the guide embeds each sentence once and its embedding serves both views [a, a']."""
    from dist_worker_common import TinyGuide, make_loss, make_model, make_trainer

    from simcse_hn.data.collator import SimCSECollator

    _, tokenizer = build_tiny_bert()
    guide = TinyGuide()
    collator = SimCSECollator(tokenizer, 16, guide_tokenize=lambda texts: dict(tokenizer(texts, padding=True,
                              return_tensors="pt")))  # fmt: skip
    batch = collator(["one sentence", "another one", "a third"])
    assert batch["input_ids"].shape[0] == 6 and batch["guide_input_ids"].shape[0] == 3
    trainer = make_trainer(make_model(), make_loss("infonce", "infonce"), tmp_path, guide=guide,
                           guide_model="tiny-guide")  # fmt: skip
    rows = trainer._guide_embeddings({k: v for k, v in batch.items() if k.startswith("guide_")})
    features = {k.removeprefix("guide_"): v for k, v in batch.items() if k.startswith("guide_")}
    torch.testing.assert_close(rows, guide(features).repeat_interleave(2, dim=0), rtol=0, atol=0)
    trainer.training_step(trainer.model, batch)  # the step runs with the guide (and pops its features)
    assert "guide_removed" in trainer._metric_sums
