"""Reliability: a write the disk refuses (no space, a quota, a read-only folder) ends the run with one line naming
the path, what was being written and the last whole checkpoint, which stays intact; exit code 2. A full disk is the
real one: the file the save writes is /dev/full, whose writes fail with ENOSPC; a read-only folder and a quota are
the errors their system calls raise. Made room, the run resumes to the weights of one never stopped."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from safetensors.torch import load_file
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.errors import disk_problem
from simcse_hn.training import checkpoints

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")

COMMON = ["--max_steps", "2", "--save_steps", "1", "--lr_scheduler_type", "linear", "--seed", "3"]


def _full_disk_at(out, name: str) -> None:
    """checkpoint-2's `name`, when the run writes it, goes to /dev/full: the disk is full just then."""
    (out / "checkpoint-2").mkdir(parents=True)
    os.symlink("/dev/full", out / "checkpoint-2" / name)


@pytest.mark.parametrize(
    "name, says",
    [
        ("simcse_config.json", "no space left on the device"),  # Python's own write: errno ENOSPC
        ("optimizer.pt", "torch.save could not finish a file"),  # torch's writer keeps no errno
    ],
)
def test_a_full_disk_is_one_line_and_the_run_resumes_bit_equal_once_there_is_room(tmp_path, capsys, name, says):
    straight = tmp_path / "straight"
    assert train.main(train_args(straight, *COMMON)) == 0
    out = tmp_path / "out"
    _full_disk_at(out, name)
    assert train.main(train_args(out, *COMMON, "--overwrite_output_dir", "true")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: output_dir: {says}")
    assert f"while writing {out / 'checkpoint-2'} (a checkpoint)" in err
    assert f"the last whole checkpoint, {out / 'checkpoint-1'}, is intact" in err
    assert err.endswith("resume with --resume_from_checkpoint true\n")
    assert checkpoints.manifest_problem(str(out / "checkpoint-1")) is None

    os.remove(out / "checkpoint-2" / name)  # room made
    assert train.main(train_args(out, *COMMON, "--resume_from_checkpoint", "true")) == 0
    for file in ("model.safetensors", "simcse_head.safetensors"):
        want, got = load_file(str(straight / file)), load_file(str(out / file))
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=f"{file}: {key}")


@pytest.mark.parametrize(
    "code, says",
    [(errno.EROFS, "the file system is read-only"), (errno.EDQUOT, "the disk quota is exceeded")],
)
def test_a_read_only_folder_or_a_quota_is_one_line(tmp_path, capsys, monkeypatch, code, says):
    written = checkpoints.write_checkpoint_manifest

    def refused(folder, step=None):
        if step == 2:  # the second checkpoint's manifest: the system call fails as it would there
            raise OSError(code, os.strerror(code), os.path.join(folder, checkpoints.CHECKPOINT_MANIFEST))
        return written(folder, step)

    monkeypatch.setattr(checkpoints, "write_checkpoint_manifest", refused)
    out = tmp_path / "out"
    assert train.main(train_args(out, *COMMON)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: output_dir: {says} while writing {out / 'checkpoint-2'} (a checkpoint), file "
        f"{checkpoints.CHECKPOINT_MANIFEST}; the last whole checkpoint, {out / 'checkpoint-1'}, is intact: make room "
        "(or make the folder writable) and resume with --resume_from_checkpoint true\n"
    )


def test_a_full_disk_at_the_first_checkpoint_says_none_is_whole_and_a_resume_starts_again(tmp_path, capsys, caplog):
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    os.symlink("/dev/full", out / "checkpoint-1" / "simcse_config.json")
    assert train.main(train_args(out, *COMMON, "--overwrite_output_dir", "true")) == 2
    err = capsys.readouterr().err
    assert f"while writing {out / 'checkpoint-1'} (a checkpoint)" in err and err.count("\n") == 1
    assert "; no checkpoint of this run is whole yet: " in err
    os.remove(out / "checkpoint-1" / "simcse_config.json")  # room made; a restart script passes --resume as always
    with caplog.at_level("WARNING"):
        assert train.main(train_args(out, *COMMON, "--resume_from_checkpoint", "true")) == 0
    assert "checkpoint-1 cut short before its manifest): starting it again from step 0" in caplog.text
    assert (out / "checkpoint-1.incomplete").is_dir()
    assert checkpoints.manifest_problem(str(out / "checkpoint-2")) is None


def test_other_errors_are_not_taken_for_a_disk_error():
    assert disk_problem(ValueError("bad value")) is None
    assert disk_problem(RuntimeError("CUDA out of memory")) is None
    assert disk_problem(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/x.pt")
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as wrapped:
        assert disk_problem(wrapped) == ("no space left on the device", "/data/x.pt")
