"""Report folders are the user's: eval/sts.py, eval/compare.py and eval/curves.py never replace a file in --output
(or --mteb_results) that a report did not write; they refuse in one line, and a rerun into their own folder works
(files.ReportFolder and its mark). Also --baseline: another encoder scored in the same run, beside the model."""

from __future__ import annotations

import json
import os

import pytest
from test_sts_cli import write_data

from simcse_hn.cli import compare, curves, sts
from simcse_hn.files import REPORT_MARK, ReportFolder
from simcse_hn.testing.models import TINY_MODEL

pytestmark = pytest.mark.usefixtures("one_thread")
USER_TEXT = "# my own notes: not a report\n"


def sts_args(data, out, *extra: str) -> list[str]:
    return ["--model", TINY_MODEL, "--pooler", "avg", "--data_dir", str(data), "--output", str(out),
            "--no_progress_bar", "--tasks", "sts12,stsb", *extra]  # fmt: skip


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_sts_refuses_a_users_results_md_and_reruns_into_its_own_folder(tmp_path, capsys):
    data = write_data(tmp_path / "sts")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text(USER_TEXT)
    assert sts.main(sts_args(data, out)) == 2
    line = one_error_line(capsys)
    assert "results.md" in line and "not written by a report" in line and str(out) in line
    assert (out / "results.md").read_text() == USER_TEXT  # untouched
    assert sorted(os.listdir(out)) == ["results.md"]  # nothing written beside it, no staging left

    os.remove(out / "results.md")
    (out / "notes.txt").write_text(USER_TEXT)  # a file of the user's that is not in the way
    assert sts.main(sts_args(data, out)) == 0
    first = json.loads((out / "results.json").read_text())
    mark = json.loads((out / REPORT_MARK).read_text())["files"]
    assert {"results.json", "results.md", "results.png", "predictions.npz"} <= set(mark)
    assert any(name.startswith("mteb/") for name in mark) and "notes.txt" not in mark
    capsys.readouterr()
    assert sts.main(sts_args(data, out, "--aggregation", "mean")) == 0  # a rerun replaces what it wrote
    second = json.loads((out / "results.json").read_text())
    assert (first["aggregation"], second["aggregation"]) == ("all", "mean")
    assert (out / "notes.txt").read_text() == USER_TEXT
    assert not [name for name in os.listdir(out) if name.startswith(".simcse-report-")]

    (out / "results.md").write_text((out / "results.md").read_text() + "\nmy remark\n")  # edited by the user
    capsys.readouterr()
    assert sts.main(sts_args(data, out)) == 2
    assert "results.md is there, changed since a report wrote it" in one_error_line(capsys)
    assert (out / "results.md").read_text().endswith("my remark\n")
    assert json.loads((out / "results.json").read_text())["aggregation"] == "mean"  # nothing else moved


def test_sts_refuses_a_users_file_in_an_mteb_cache_before_anything_moves(tmp_path, capsys):
    """The MTEB files go into another folder (--mteb_results): a user's file there where a task file would go
    stops the run, and the report folder stays as it was."""
    data = write_data(tmp_path / "sts")
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert sts.main(sts_args(data, cache / "probe", "--mteb_results", str(cache / "probe-mteb"))) == 0
    task_files = [os.path.relpath(os.path.join(root, f), cache / "probe-mteb")
                  for root, _, files in os.walk(cache / "probe-mteb") for f in files if f.endswith(".json")
                  and f != REPORT_MARK and f != "model_meta.json"]  # fmt: skip
    assert task_files  # results/{org}__{model}/{revision}/{Task}.json
    user_file = cache / "mteb" / task_files[0]
    user_file.parent.mkdir(parents=True)
    user_file.write_text(USER_TEXT)
    capsys.readouterr()
    assert sts.main(sts_args(data, out, "--mteb_results", str(cache / "mteb"))) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: --mteb_results {cache / 'mteb'}: ") and "not written by a report" in line
    assert user_file.read_text() == USER_TEXT
    assert os.listdir(out) == []  # the report was not moved in either


def write_report(folder: str, content: str, kill_after_first_move=None) -> None:
    with ReportFolder(folder) as report:
        for name in ("a.md", "b.md"):
            with open(report.path(name), "w") as f:
                f.write(content)
        if kill_after_first_move is None:
            report.commit()
            return
        real_replace, moved = os.replace, []

        def replace(src, dst):  # the mark moves as always; the second report file is never reached
            if not dst.endswith(REPORT_MARK):
                if moved:
                    raise KeyboardInterrupt
                moved.append(dst)
            real_replace(src, dst)

        kill_after_first_move.setattr(os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            report.commit()
        kill_after_first_move.setattr(os, "replace", real_replace)


def test_a_kill_while_files_move_leaves_a_folder_the_next_run_owns(tmp_path, monkeypatch):
    """The mark lists both contents of each replaced file until every file has moved: a kill in between leaves files
    of either run, each still recognised as the report's own."""
    folder = str(tmp_path / "report")
    write_report(folder, "first")
    write_report(folder, "second", kill_after_first_move=monkeypatch)
    assert sorted(open(os.path.join(folder, n)).read() for n in ("a.md", "b.md")) == ["first", "second"]
    write_report(folder, "third")
    assert [open(os.path.join(folder, n)).read() for n in ("a.md", "b.md")] == ["third", "third"]


def test_compare_and_curves_refuse_a_users_file_and_rerun_into_their_own(tmp_path, capsys):
    data = write_data(tmp_path / "sts")
    assert sts.main(sts_args(data, tmp_path / "run")) == 0
    for name, main, argv in (
        ("comparison.md", compare.main, [str(tmp_path / "run"), "--output", str(tmp_path / "compare")]),
        ("curves.md", curves.main, [str(tmp_path / "curves_in.json"), "--output", str(tmp_path / "curves")]),
    ):
        if main is curves.main:  # a curves.json as eval/curves.py writes it
            series = {"loss": {"1": 1.0, "2": 0.5}, "eval_stsb_spearman": {"2": 10.0}}
            (tmp_path / "curves_in.json").write_text(json.dumps({"r": {"series": series}}))
        out = tmp_path / argv[-1]
        out.mkdir()
        (out / name).write_text(USER_TEXT)
        capsys.readouterr()
        assert main(argv) == 2
        line = one_error_line(capsys)
        assert name in line and "not written by a report" in line
        assert (out / name).read_text() == USER_TEXT and os.listdir(out) == [name]
        os.remove(out / name)
        assert main(argv) == 0 and main(argv) == 0  # written, then rewritten: its own folder
        assert (out / name).read_text() != USER_TEXT and name in json.loads((out / REPORT_MARK).read_text())["files"]


def test_baseline_is_scored_in_the_same_run_and_table(tmp_path, capsys):
    """--baseline MODEL:POOLER gives the same scores as evaluating that model alone, as a second row."""
    data = write_data(tmp_path / "sts")
    alone = tmp_path / "alone"
    args = ["--data_dir", str(data), "--output", str(alone), "--no_progress_bar", "--no_mteb_results"]
    assert sts.main(["--model", TINY_MODEL, "--pooler", "cls", *args]) == 0
    expected = json.loads((alone / "results.json").read_text())
    out = tmp_path / "both"
    args[3] = str(out)
    capsys.readouterr()
    assert sts.main(["--model", TINY_MODEL, "--pooler", "avg", "--baseline", f"{TINY_MODEL}:cls", *args]) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    (baseline,) = results["baselines"]
    assert baseline["label"] == f"{TINY_MODEL} (cls)" and baseline["pooler"] == "cls"
    assert baseline["tasks"] == expected["tasks"] and baseline["average"] == expected["average"]
    assert results["pooler"] == "avg" and results["average"] != expected["average"]
    row = f"| {TINY_MODEL} (cls) | " + " | ".join(f"{t['spearman']:.2f}" for t in expected["tasks"].values())
    for text in (printed, (out / "results.md").read_text()):
        assert row in text and f"| {TINY_MODEL} (avg) | " in text


def test_a_bad_baseline_is_one_line_before_any_model_loads(tmp_path, capsys):
    data = write_data(tmp_path / "sts")
    assert sts.main(sts_args(data, tmp_path / "out", "--baseline", str(tmp_path / "nowhere"))) == 2
    assert "--baseline" in one_error_line(capsys) and not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_is_one_line(tmp_path, capsys):
    data = write_data(tmp_path / "sts")
    (tmp_path / "taken").write_text(USER_TEXT)
    assert sts.main(sts_args(data, tmp_path / "taken")) == 2
    assert one_error_line(capsys) == f"error: --output {tmp_path / 'taken'}: a file is there, not a folder"
    assert compare.main([str(tmp_path / "nothing"), "--output", str(tmp_path / "taken")]) == 2
    assert "a file is there, not a folder" in one_error_line(capsys)
    assert (tmp_path / "taken").read_text() == USER_TEXT
