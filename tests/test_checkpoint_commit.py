"""A checkpoint is one unit: its manifest (checkpoint_manifest.json) is written last, after the Trainer's files and
every part (the queue, the topic clusters). A run killed between the Trainer's files and the manifest leaves a
checkpoint that resume skips in one line; rotation keeps the last whole checkpoint until the next one is whole; a
resumed run ends bit-equal to one never killed; a checkpoint push waits for the manifest. The kill is an exception
raised at that point of the save (the process ends there as it would under SIGKILL); bench/fault_injection.py sends
real SIGKILLs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest import FIXTURES, ROOT
from test_hub import hub_env, train_args  # noqa: F401  (hub_env: a fixture)

from simcse_hn.cli import train
from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE
from simcse_hn.files import SIMCSE_CONFIG
from simcse_hn.testing.hub_server import HubStandIn
from simcse_hn.training import checkpoints
from simcse_hn.training.checkpoints import (
    CHECKPOINT_MANIFEST,
    QUEUE_FILE,
    CheckpointCommit,
    checkpoint_problem,
    manifest_problem,
    resolve_resume,
    rotate_checkpoints,
    write_checkpoint_manifest,
)

RUNS = {  # the run's own part of each checkpoint, and the flags that make it
    "queue": (QUEUE_FILE, ["--loss", "hcl", "--queue_size", "40", "--momentum", "0.9"]),
    "topic": (TOPIC_CLUSTERS_FILE, ["--topic_batches", "true", "--topic_clusters", "4"]),
}


class Killed(Exception):
    """The process ends here (in-process stand-in for a SIGKILL at this point of the save)."""


def _args(out, kind: str, *extra: str) -> list[str]:
    return ["--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--train_file", str(FIXTURES / "tiny_corpus.txt"),
            "--output_dir", str(out), "--disable_tqdm", "true", "--max_steps", "6", "--save_steps", "3",
            "--eval_strategy", "no", "--load_best_model_at_end", "false", "--lr_scheduler_type", "constant",
            "--save_total_limit", "1", "--logging_steps", "3", *RUNS[kind][1], *extra]  # fmt: skip


def kill_between_trainer_files_and_manifest(monkeypatch, step: int, point: str) -> None:
    """Kill the save of checkpoint `step` after the Trainer's own files (trainer_state.json included): before the
    parts are written (`before parts`), or after them, before the manifest (`before manifest`)."""
    if point == "before parts":
        on_save = CheckpointCommit.on_save

        def killed(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise Killed
            return on_save(self, args, state, control, **kwargs)

        monkeypatch.setattr(CheckpointCommit, "on_save", killed)
    else:
        write = checkpoints.write_checkpoint_manifest

        def killed_write(folder, at=None):
            if at == step:
                raise Killed
            return write(folder, at)

        monkeypatch.setattr(checkpoints, "write_checkpoint_manifest", killed_write)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted runs, one per kind: their final weights (and queue)."""
    done = {}
    for kind in RUNS:
        trainer = train.run(_args(tmp_path_factory.mktemp(kind) / "out", kind))
        queue = trainer.queue.state_dict() if trainer.queue is not None else None
        done[kind] = ({k: v.clone() for k, v in trainer.model.state_dict().items()}, queue)
    return done


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before parts", "before manifest"])
@pytest.mark.parametrize("kind", list(RUNS))
def test_a_kill_between_the_trainers_files_and_the_manifest_resumes_bit_equal(
    tmp_path, monkeypatch, caplog, straight, kind, point
):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        kill_between_trainer_files_and_manifest(patch, 6, point)
        with pytest.raises(Killed):
            train.run(_args(out, kind))
    newest, previous = out / "checkpoint-6", out / "checkpoint-3"
    assert (newest / "trainer_state.json").is_file() and not (newest / CHECKPOINT_MANIFEST).exists()
    assert (newest / RUNS[kind][0]).exists() == (point == "before manifest")
    # save_total_limit 1: the whole checkpoint-3 is still there, the new one never became whole
    assert (previous / CHECKPOINT_MANIFEST).is_file() and (previous / RUNS[kind][0]).is_file()

    caplog.clear()
    with caplog.at_level("WARNING"):
        resumed = train.run(_args(out, kind, "--resume_from_checkpoint", "true"))
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert skipped == [f"{newest} is skipped: no {CHECKPOINT_MANIFEST} (the run stopped before the checkpoint was "
                       "whole)"]  # fmt: skip
    assert resumed.state.global_step == 6
    weights, queue = straight[kind]
    for name, want in weights.items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    if queue is not None:
        got = resumed.queue.state_dict()
        for key, value in queue["queue"]["buffer"].items():
            if value is not None:
                torch.testing.assert_close(got["queue"]["buffer"][key], value, rtol=0, atol=0, msg=key)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6"]  # whole now; the limit holds
    assert manifest_problem(str(newest)) is None


def test_the_manifest_lists_every_file_and_catches_a_change(tmp_path):
    folder = tmp_path / "checkpoint-2"
    (folder / "global_step2").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"abc")
    (folder / "global_step2" / "shard.pt").write_bytes(b"xyz")
    assert manifest_problem(str(folder)).startswith(f"no {CHECKPOINT_MANIFEST}")
    manifest = write_checkpoint_manifest(str(folder), 2)
    assert sorted(manifest["files"]) == ["a.bin", "global_step2/shard.pt"] and manifest["step"] == 2
    assert manifest_problem(str(folder)) is None
    (folder / "a.bin").write_bytes(b"abd")  # same size, other bytes
    assert manifest_problem(str(folder), verify_hashes=False) is None
    assert manifest_problem(str(folder)) == f"a.bin is not the file {CHECKPOINT_MANIFEST} lists (another sha256)"
    (folder / "a.bin").write_bytes(b"ab")
    assert manifest_problem(str(folder)) == f"a.bin is 2 bytes, {CHECKPOINT_MANIFEST} says 3"
    os.remove(folder / "global_step2" / "shard.pt")
    assert manifest_problem(str(folder)).startswith("a.bin")  # sorted: the first problem
    (folder / "a.bin").write_bytes(b"abc")
    assert manifest_problem(str(folder)) == f"global_step2/shard.pt is missing (listed in {CHECKPOINT_MANIFEST})"


class _Part:
    def __init__(self, writes: bool):
        self.writes = writes

    def checkpoint_files(self):
        return ["part.pt"]

    def save_checkpoint(self, folder):
        if self.writes:
            torch.save({"x": 1}, os.path.join(folder, "part.pt"))


class _Args:
    def __init__(self, output_dir):
        self.output_dir, self.should_save = str(output_dir), True


class _State:
    global_step = 4


def test_the_commit_writes_the_parts_then_the_manifest_and_refuses_a_missing_part(tmp_path, caplog):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    CheckpointCommit([_Part(writes=False)]).on_save(_Args(tmp_path), _State(), None)
    assert not (folder / CHECKPOINT_MANIFEST).exists()
    assert f"{folder} is not whole (no part.pt)" in caplog.text
    commit = CheckpointCommit()
    commit.add_part(_Part(writes=True))
    commit.on_save(_Args(tmp_path), _State(), None)
    manifest = json.loads((folder / CHECKPOINT_MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["part.pt", "trainer_state.json"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished queue run: checkpoint-2 and checkpoint-4, both whole."""
    out = tmp_path_factory.mktemp("run") / "out"
    train.run(train_args(out, "--max_steps", "4", "--save_steps", "2", "--save_total_limit", "3",
                         "--queue_size", "16"))  # fmt: skip
    return out


def test_rotation_keeps_the_newest_whole_checkpoint_until_the_next_is_whole(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    shutil.copytree(out / "checkpoint-4", out / "checkpoint-6")
    os.remove(out / "checkpoint-6" / CHECKPOINT_MANIFEST)
    run_id = checkpoints.read_run_id(str(out))
    deleted = rotate_checkpoints(str(out), run_id, 1, {str(out / "checkpoint-6")})
    assert deleted == [str(out / "checkpoint-2")]  # checkpoint-4, the newest whole one, stays
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]


def test_a_checkpoint_written_before_manifests_resumes_when_its_run_has_every_file(finished, tmp_path, caplog):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    for name in ("checkpoint-2", "checkpoint-4"):  # as an earlier simcse-hn wrote them: no manifest, no mention
        os.remove(out / name / CHECKPOINT_MANIFEST)
        config = json.loads((out / name / SIMCSE_CONFIG).read_text())
        del config["checkpoint_manifest"]
        (out / name / SIMCSE_CONFIG).write_text(json.dumps(config))
    assert resolve_resume("true", str(out)) == str(out / "checkpoint-4")
    os.remove(out / "checkpoint-4" / QUEUE_FILE)  # a queue run's checkpoint without its queue
    with caplog.at_level("WARNING"):
        assert resolve_resume("true", str(out)) == str(out / "checkpoint-2")
    assert f"{out / 'checkpoint-4'} is skipped: no {QUEUE_FILE} (its run needs it" in caplog.text
    # a checkpoint of this version without its manifest is not whole, whatever files it has
    assert checkpoint_problem(str(finished / "checkpoint-4")) is None
    shutil.copytree(finished / "checkpoint-4", tmp_path / "checkpoint-4")
    os.remove(tmp_path / "checkpoint-4" / CHECKPOINT_MANIFEST)
    assert checkpoint_problem(str(tmp_path / "checkpoint-4")).startswith(f"no {CHECKPOINT_MANIFEST}")


def test_a_checkpoint_push_waits_for_its_manifest(tmp_path, hub_env, monkeypatch):  # noqa: F811
    """hub_strategy every_save: killed between checkpoint-2's Trainer files and its manifest, the run has pushed
    checkpoint-1 only (the push runs after the commit, and only for a whole checkpoint)."""
    kill_between_trainer_files_and_manifest(monkeypatch, 2, "before manifest")
    with HubStandIn() as server:
        hub_env(server.url, token=server.token)
        argv = train_args(tmp_path / "out", "--save_steps", "1", "--push_to_hub", "true", "--hub_model_id",
                          "tester/every-save", "--hub_strategy", "every_save")  # fmt: skip
        with pytest.raises(Killed):
            train.run(argv)
        assert [c["summary"] for c in server.commits] == ["Checkpoint at step 1"]


def test_a_push_of_a_checkpoint_that_is_not_whole_is_skipped(tmp_path, caplog):
    from simcse_hn.export.hub import CheckpointPush, HubTarget

    (tmp_path / "checkpoint-4").mkdir()

    class State:
        is_world_process_zero, global_step = True, 4

    CheckpointPush(HubTarget("tester/x")).on_save(_Args(tmp_path), State(), None)  # no server: it must not push
    assert f"{tmp_path / 'checkpoint-4'} is not pushed: no {CHECKPOINT_MANIFEST}" in caplog.text
