"""Reliability, class 2: files in --output_dir that simcse-hn did not write are never overwritten, deleted or taken
for its own. A folder is simcse-hn's when it holds simcse_run.json; a checkpoint is this run family's when its
simcse_config.json carries the folder's run_id; a card is simcse-hn's when it carries model_card.CARD_MARKER."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hub import files_snapshot, train_args

from simcse_hn.cli import train
from simcse_hn.export import model_card
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import TINY_MODEL


def _someone_elses(folder: Path) -> dict[str, bytes]:
    """A folder of another tool's files, checkpoint-like names included."""
    (folder / "checkpoint-old").mkdir(parents=True)
    (folder / "checkpoint-old" / "model.safetensors").write_bytes(b"not ours")
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "notes.txt").write_text("an experiment log", encoding="utf-8")
    (folder / "README.md").write_text("# My project\n\nHand-written notes.\n", encoding="utf-8")
    (folder / ".env").write_text("API_KEY=123\n", encoding="utf-8")
    return files_snapshot(folder)


def test_a_non_empty_folder_simcse_hn_did_not_write_is_refused_and_left_alone(tmp_path, capsys):
    out = tmp_path / "theirs"
    before = _someone_elses(out)
    assert train.main(train_args(out)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: output_dir: {out} is not empty and was not written by simcse-hn (no simcse_run.json); "
        "choose a new folder, or pass --overwrite_output_dir true to write into it\n"
    )
    assert files_snapshot(out) == before


def test_rotation_deletes_only_this_runs_checkpoints(tmp_path):
    """save_total_limit 1 with the best model kept: the Trainer's rotation (during training, and at the end) would
    delete every checkpoint-* folder but the best, whoever wrote it."""
    out = tmp_path / "theirs"
    theirs = {p: b for p, b in _someone_elses(out).items() if p.startswith("checkpoint-")}
    extra = ["--overwrite_output_dir", "true", "--max_steps", "6", "--save_steps", "2", "--eval_steps", "2",
             "--eval_strategy", "steps", "--load_best_model_at_end", "true", "--save_total_limit", "1"]  # fmt: skip
    trainer = train.run(train_args(out) + extra)
    after = files_snapshot(out)
    assert {p: b for p, b in after.items() if p in theirs} == theirs
    ours = sorted({p.split("/")[0] for p in after if p.startswith("checkpoint-") and p not in theirs})
    assert ours == [Path(trainer.state.best_model_checkpoint).name]  # the run's own 2, 4, 6 were rotated to 1


def test_the_card_never_replaces_a_readme_simcse_hn_did_not_write(tmp_path):
    model = SimCSEModel.from_pretrained(TINY_MODEL, pooler="avg")
    model.save_pretrained(str(tmp_path), tokenizer=load_tokenizer(TINY_MODEL), extra_config={"max_seq_length": 32})
    readme = tmp_path / "README.md"
    readme.write_text("# Notes I wrote\n", encoding="utf-8")
    with pytest.raises(FileExistsError, match="README.md was not written by simcse-hn") as error:
        model_card.write_model_card(str(tmp_path))
    assert "\n" not in str(error.value)
    assert readme.read_text(encoding="utf-8") == "# Notes I wrote\n"

    model_card.write_model_card(str(tmp_path), overwrite=True)  # the user said so
    first = readme.read_text(encoding="utf-8")
    assert first.rstrip().endswith(model_card.CARD_MARKER)
    model_card.write_model_card(str(tmp_path), dev_spearman=50.0)  # our own card is rewritten without asking
    assert readme.read_text(encoding="utf-8") != first


def test_train_refuses_before_training_when_the_card_would_replace_a_readme(tmp_path, capsys):
    out = tmp_path / "out"
    argv = train_args(out, "--save_strategy", "no")
    assert train.main(argv) == 0
    (out / "README.md").write_text("# Results I wrote down\n", encoding="utf-8")
    before = files_snapshot(out)
    assert train.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: output_dir: {out / 'README.md'} was not written by simcse-hn and the model card would replace it; "
        "move it away, or pass --overwrite_output_dir true"
    )
    assert files_snapshot(out) == before


def test_a_fresh_run_does_not_mix_into_an_earlier_runs_checkpoints(tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(train_args(out)) == 0
    before = files_snapshot(out)
    assert train.main(train_args(out)) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: output_dir: {out} holds checkpoints of an earlier run (checkpoint-2); pass "
        "--resume_from_checkpoint true to continue it, or --overwrite_output_dir true to start a new run there"
    )
    assert files_snapshot(out) == before
