"""docs/hub.md's worked example, run as written: an existing SentenceTransformerTrainer script, and the same script
with simcse-hn's queue and topic batches added by changing a few lines (a tiny model in place of MiniLM, the fixture
corpus as `sentences`)."""

from __future__ import annotations

import difflib
import re

import pytest
from conftest import FIXTURES, ROOT
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)

pytestmark = pytest.mark.usefixtures("one_thread")
HUB = "sentence-transformers/all-MiniLM-L6-v2"


def blocks() -> tuple[str, str]:
    text = (ROOT / "docs" / "hub.md").read_text(encoding="utf-8")
    section = text[text.index("## The queue and topic batches in sentence-transformers' trainer"):]
    existing, changed = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:2]
    return existing, changed


def test_the_example_changes_a_few_lines():
    existing, changed = blocks()
    diff = [line for line in difflib.ndiff(existing.splitlines(), changed.splitlines()) if line[:1] in "+-"]
    added = [line for line in diff if line.startswith("+")]
    assert 0 < len(added) <= 7, "\n".join(diff)
    assert "SimCSECallback(loss, batches)" in changed and "batch_sampler=batches" in changed


@pytest.mark.parametrize("which", [0, 1], ids=["existing", "changed"])
def test_the_example_trains_as_written(which, st_folder, tmp_path, monkeypatch):  # noqa: F811
    code = blocks()[which]
    assert code.count(HUB) == 1
    monkeypatch.chdir(tmp_path)  # output_dir="out"
    sentences = (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()
    scope = {"sentences": sentences}
    exec(compile(code.replace(HUB, str(st_folder)), "docs/hub.md", "exec"), scope)
    trainer = scope["trainer"]
    per_epoch = len(sentences) // 64 + (which == 0 and len(sentences) % 64 > 0)  # topic batches drop the last
    assert trainer.state.global_step == trainer.args.num_train_epochs * per_epoch
    if which:  # the queue filled once per optimizer step, the batches' cluster share logged
        (queue,) = scope["loss"].queue.queues.values()  # one embedding width, one queue
        assert queue.position == trainer.state.global_step * 64 % 4096
        assert scope["batches"].samplers[-1].topic is not None and scope["loss"].queue.encoder is not None
