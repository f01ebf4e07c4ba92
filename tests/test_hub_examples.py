"""Every Python example of docs/hub.md's sentence-transformers sections (and the README's) run as written: a tiny
model in place of MiniLM, fixture sentences as `sentences` (and `anchors`, `positives`, `negatives`), each in a fresh
folder. The queue-and-topic-batches pair runs in tests/test_st_example.py. And every refusal the page quotes is
said, word for word, by the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)

pytestmark = pytest.mark.usefixtures("one_thread")
HUB = "sentence-transformers/all-MiniLM-L6-v2"
PAGE = ROOT / "docs" / "hub.md"
FIRST = "## The objectives inside sentence-transformers' own trainer"
TESTED_ELSEWHERE = "## The queue and topic batches in sentence-transformers' trainer"  # tests/test_st_example.py


def examples() -> dict[str, str]:
    """'section heading #n' -> the code of each Python block from FIRST on, but TESTED_ELSEWHERE's."""
    text = PAGE.read_text(encoding="utf-8")
    found = {}
    for section in re.split(r"\n(?=## )", text[text.index(FIRST) :]):
        heading = section.splitlines()[0]
        if heading == TESTED_ELSEWHERE:
            continue
        for number, code in enumerate(re.findall(r"```python\n(.*?)```", section, flags=re.S)):
            found[f"{heading[3:]} #{number + 1}"] = code
    return found


def lines(start: int, count: int) -> list[str]:
    return (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()[start : start + count]


def run(code: str, folder: Path, workdir: Path, monkeypatch) -> dict:
    assert code.count(HUB) == 1
    monkeypatch.chdir(workdir)  # output_dir="out", or the default tmp_trainer
    scope = {
        "sentences": lines(0, 128),
        "anchors": lines(128, 32),
        "positives": lines(160, 32),
        "negatives": lines(192, 32),
    }
    exec(compile(code.replace(HUB, str(folder)), str(PAGE), "exec"), scope)
    return scope


@pytest.mark.parametrize("name", list(examples()))
def test_each_example_runs_as_written(name, st_folder, tmp_path, monkeypatch):  # noqa: F811
    scope = run(examples()[name], st_folder, tmp_path, monkeypatch)
    trainer = scope.get("trainer")
    if trainer is not None:  # the examples that keep their trainer: it trained, and the parts did their work
        assert trainer.state.global_step > 0
        loss = scope.get("inner", scope["loss"])
        if getattr(loss, "queue", None) is not None:
            assert loss.queue.queues and all(q.position > 0 for q in loss.queue.queues.values())
        if "MatryoshkaLoss" in examples()[name]:  # a queue per dimension
            dim = scope["dim"]
            assert sorted(loss.queue.queues) == [dim // 4, dim // 2, dim]
        if "batches" in scope:
            assert [s for s in scope["batches"].samplers if s.training and s.topic is not None]
        if "eval_dataset=dev" in examples()[name]:
            assert [entry for entry in trainer.state.log_history if "eval_loss" in entry]


def test_the_readme_example_runs_as_written(st_folder, tmp_path, monkeypatch):  # noqa: F811
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = next(block for block in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "SimCSEHCLLoss" in block)
    corpus = tmp_path / "sentences.txt"  # the quickstart's 4000 sentences would take a minute
    corpus.write_text("\n".join(lines(0, 64)), encoding="utf-8")
    assert code.count('"data/wiki_quickstart.txt"') == 1
    run(code.replace('"data/wiki_quickstart.txt"', repr(str(corpus))), st_folder, tmp_path, monkeypatch)


def test_every_refusal_the_page_quotes_is_the_codes():
    """Each quoted message, its example values (numbers, an objective's name) aside, is in the package's source,
    string literals joined as Python joins them (each is raised in a test too)."""
    text = PAGE.read_text(encoding="utf-8")
    quoted = re.findall(r"^\| [^|]+ \| `([^`]+)` \|$", text[text.index("### Combinations refused") :], flags=re.M)
    source = " ".join(path.read_text(encoding="utf-8") for path in (ROOT / "simcse_hn").rglob("*.py"))
    source = re.sub(r'"\s+r?f?"', "", source)  # "...{x} "  f"..." on the next line: one literal
    assert len(quoted) >= 10
    for message in quoted:
        pieces = [piece for piece in re.split(r"\d+|unremix", message) if len(piece.strip()) > 3]
        assert pieces and all(piece in source for piece in pieces), message
