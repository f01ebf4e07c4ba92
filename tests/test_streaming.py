"""Streamed corpora (`--streaming`, data.load_sentence_stream): the same sentences as the in-memory reader, split
across processes without overlap, shuffled through a seeded buffer, the in-memory reader's one-line errors as far as
a stream allows, and a resumed run trains on the sentences an uninterrupted run would have seen next. Two processes
under FSDP: tests/test_sharded.py (the worker's stream run)."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import FIXTURES
from safetensors.torch import load_file
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.data.sentences import load_sentence_stream, load_sentences
from simcse_hn.errors import DataError
from simcse_hn.training.trainer import SimCSETrainer


def first(stream, count: int) -> list[str]:
    return [row["text"] for row in itertools.islice(stream, count)]


@pytest.fixture
def messy(tmp_path):
    """A text file with a byte-order mark, blank and white-space lines, and a form feed inside a sentence."""
    path = tmp_path / "messy.txt"
    path.write_bytes("\ufeffFirst sentence.\n\n   \n  Second one  \nthird\x0cwith a form feed\n\nlast\n".encode())
    return path


def test_a_stream_holds_the_in_memory_sentences_then_repeats(messy, tmp_path):
    want = load_sentences(str(messy))
    assert want == ["First sentence.", "Second one", "third\x0cwith a form feed", "last"]
    assert first(load_sentence_stream(str(messy), shuffle_buffer=0), 6) == want + want[:2]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"t": " a "}\n\n{"t": null}\n{"t": "b"}\n', encoding="utf-8")
    assert first(load_sentence_stream(str(jsonl), "t", shuffle_buffer=0), 2) == load_sentences(str(jsonl), "t")
    csv = tmp_path / "c.csv"
    csv.write_text('id,text\n1,"one, with a comma"\n2,\n3,"two\nlines"\n4,42\n', encoding="utf-8")
    assert first(load_sentence_stream(str(csv), shuffle_buffer=0), 3) == load_sentences(str(csv))


def test_processes_read_disjoint_shares_of_the_corpus(tmp_path):
    path = tmp_path / "lines.txt"
    lines = [f"sentence number {i}" for i in range(101)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shares = [first(load_sentence_stream(str(path), rank=r, world_size=2, shuffle_buffer=0), 51 - r) for r in (0, 1)]
    assert shares[0] == lines[0::2] and shares[1] == lines[1::2]  # every second sentence, from the rank's offset
    shuffled = [first(load_sentence_stream(str(path), rank=r, world_size=2, shuffle_buffer=16, seed=3), 20)
                for r in (0, 1)]  # fmt: skip
    # one shuffled stream (the same seed everywhere), every second sentence of it for each process
    assert not set(shuffled[0]) & set(shuffled[1]) and len(set(shuffled[0] + shuffled[1])) == 40
    assert set(shuffled[0]) <= set(lines) and shuffled[0] != lines[0::2][:20]
    again = first(load_sentence_stream(str(path), rank=0, world_size=2, shuffle_buffer=16, seed=3), 20)
    other = first(load_sentence_stream(str(path), rank=0, world_size=2, shuffle_buffer=16, seed=4), 20)
    assert again == shuffled[0] and other != shuffled[0]  # the order is the seed's


@pytest.mark.parametrize(
    "content, message",
    [
        (b"fine\nok\n\xff\xfebad\n", "bad.txt:3: not valid UTF-8"),
        (b"fine\nok\nnul\x00here\n", "bad.txt:3: NUL byte"),
        (b"\n  \n\n", "bad.txt: no sentences"),
        (b"one\ntwo\n", "bad.txt: 2 sentences, fewer than one batch (4 across processes)"),
    ],
)
def test_stream_errors_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError) as error:
        first(load_sentence_stream(str(path), shuffle_buffer=0, min_sentences=4), 4)
    assert str(error.value).startswith(str(tmp_path / message)), str(error.value)


def test_a_bad_record_deep_in_a_streamed_corpus_ends_the_run_with_one_line(tmp_path, capsys):
    path = tmp_path / "corpus.jsonl"
    rows = [f'{{"text": "sentence {i}"}}' for i in range(60)] + ['{"text": 7}']
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    code = train.main(train_args(tmp_path / "out", "--train_file", str(path), "--streaming", "true",
                                 "--streaming_shuffle_buffer", "0", "--max_steps", "8"))  # fmt: skip
    assert code == 2  # read at step 4: after the check of the first batch, before the run ends
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' progress bars of checkpoint-2
    assert last == f"error: {path}: record 61: field 'text' is not a string: 7"


def test_a_resumed_streamed_run_goes_on_with_the_sentences_an_uninterrupted_run_sees_next(tmp_path, monkeypatch):
    """The Trainer skips the batches a resumed run already trained on (reading them again): the run goes on with
    the stream's next batches, not its first lines, and ends with the uninterrupted run's weights."""
    seen: list[torch.Tensor] = []
    step = SimCSETrainer.training_step

    def recording_step(self, model, inputs, *args, **kwargs):
        seen.append(inputs["input_ids"].clone())
        return step(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SimCSETrainer, "training_step", recording_step)
    common = ["--streaming", "true", "--streaming_shuffle_buffer", "64", "--save_steps", "2", "--seed", "11",
              "--lr_scheduler_type", "constant", "--train_file", str(FIXTURES / "tiny_corpus.txt")]  # fmt: skip
    train.run(train_args(tmp_path / "straight", *common, "--max_steps", "4"))
    straight, seen[:] = list(seen), []
    train.run(train_args(tmp_path / "stopped", *common, "--max_steps", "2"))
    assert all(torch.equal(a, b) for a, b in zip(seen, straight[:2]))  # the same start
    seen.clear()
    checkpoint = str(tmp_path / "stopped" / "checkpoint-2")
    extended = ["--max_steps", "4", "--extend_schedule", "true"]  # a constant rate: the same as planned for 4 steps
    train.run(train_args(tmp_path / "stopped", *common, *extended, "--resume_from_checkpoint", checkpoint))
    assert len(seen) == 2
    assert all(torch.equal(a, b) for a, b in zip(seen, straight[2:])), "not the batches the straight run saw next"
    for name in ("model.safetensors", "simcse_head.safetensors"):
        want, got = load_file(str(tmp_path / "straight" / name)), load_file(str(tmp_path / "stopped" / name))
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=f"{name}: {key}")
