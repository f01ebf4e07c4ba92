"""Reliability, class 6: the loaders parse instead of splitting, and what they cannot parse is a one-line error
naming the file and line, never silently changed data: CSV/TSV through the csv module on the whole text, JSON text
fields that are strings, a leading byte-order mark dropped, NUL bytes refused, off-scale STS scores reported."""

from __future__ import annotations

import json
import logging

import pytest

from simcse_hn.data.sentences import load_sentences
from simcse_hn.data.sts import load_sts_pairs, load_sts_task, read_sts_jsonl
from simcse_hn.errors import DataError

BOM = b"\xef\xbb\xbf"


def _load(tmp_path, name: str, content: bytes, column: str = "text") -> list[str]:
    path = tmp_path / name
    path.write_bytes(content)
    return load_sentences(str(path), text_column=column)


def test_a_quoted_csv_field_spanning_lines_is_one_sentence(tmp_path):
    csv_text = b'id,text\n1,"A sentence that goes on\nover two lines, with a comma."\n2,Plain.\n'
    assert _load(tmp_path, "a.csv", csv_text) == ["A sentence that goes on\nover two lines, with a comma.", "Plain."]
    tsv_text = b'text\tlabel\n"a tab\tinside"\t1\nHe said "no" twice.\t0\n'
    assert _load(tmp_path, "b.tsv", tsv_text) == ["a tab\tinside", 'He said "no" twice.']


@pytest.mark.parametrize(
    "name, content, message",
    [
        # the record starts on line 4, after a record of two lines
        ("fields.csv", b'id,text\n1,"a\nb"\n2,an unquoted, comma\n', "fields.csv:4: 3 fields, the header has 2"),
        ("open.csv", b'id,text\n1,fine\n2,"never closed\n3,x\n', "open.csv:3: malformed CSV (unexpected end of data)"),
        ("stray.tsv", b'text\tlabel\n"quoted" then\t1\n', "stray.tsv:2: malformed TSV ('\\t' expected after '\"')"),
    ],
)
def test_csv_that_does_not_parse_names_the_file_and_the_records_line(tmp_path, name, content, message):
    with pytest.raises(DataError) as error:
        _load(tmp_path, name, content)
    assert str(error.value).startswith(f"{tmp_path / message}") and "\n" not in str(error.value)


@pytest.mark.parametrize("value", ["42", "[1, 2]", '{"a": "b"}', "true"])
def test_a_json_text_field_that_is_not_a_string_is_an_error(tmp_path, value):
    content = f'{{"text": "fine"}}\n{{"text": {value}}}\n'.encode()
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'text' is not a string: ") as error:
        _load(tmp_path, "bad.jsonl", content)
    assert "\n" not in str(error.value)


def test_a_leading_byte_order_mark_is_dropped_by_every_reader(tmp_path):
    assert _load(tmp_path, "a.txt", BOM + b"first\nsecond\n") == ["first", "second"]
    assert _load(tmp_path, "b.jsonl", BOM + b'{"text": "first"}\n') == ["first"]
    assert _load(tmp_path, "c.csv", BOM + b"text,id\nfirst,1\n") == ["first"]
    sts = tmp_path / "sts.jsonl"
    sts.write_bytes(BOM + b'{"sentence1": "a", "sentence2": "b", "score": 3.0}\n')
    assert read_sts_jsonl(str(sts))[0]["sentence1"] == "a"


@pytest.mark.parametrize("name", ["nul.txt", "nul.jsonl", "nul.csv"])
def test_nul_bytes_are_an_error_naming_the_line(tmp_path, name):
    content = {
        "nul.txt": b"fine\nbro\x00ken\n",
        "nul.jsonl": b'{"text": "fine"}\n{"text": "bro\x00ken"}\n',
        "nul.csv": b"text\nfine\nbro\x00ken\n",
    }[name]
    line = 3 if name.endswith(".csv") else 2
    with pytest.raises(DataError) as error:
        _load(tmp_path, name, content)
    assert str(error.value).startswith(f"{tmp_path / name}:{line}: NUL byte")


def _sts_file(path, scores, **fields):
    rows = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": s, **fields} for i, s in enumerate(scores)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_off_scale_sts_scores_are_reported_once_with_the_file_and_count(tmp_path, caplog):
    dev = _sts_file(tmp_path / "dev.jsonl", [0.0, 7.5, 5.0, -1.0, 2.5])
    (tmp_path / "suite").mkdir()
    sickr = _sts_file(tmp_path / "suite" / "sickr.jsonl", [0.5, 1.0, 4.2, 5.0], split="test")
    _sts_file(tmp_path / "suite" / "sts13.jsonl", [0.0, 5.0, 2.0], subset="FNWN")
    with caplog.at_level(logging.WARNING, logger="simcse_hn.data"):
        load_sts_pairs(str(dev))
        load_sts_task("SICK-R", str(tmp_path / "suite"))
        load_sts_task("STS13", str(tmp_path / "suite"))  # 0 and 5 are on the STS scale: no warning
    assert [r.getMessage() for r in caplog.records] == [
        f"{dev}: 2 of 5 scores are outside the STS-B scale [0, 5]",
        f"{sickr}: 1 of 4 scores are outside the SICK-R scale [1, 5]",  # SICK-R's relatedness starts at 1
    ]
