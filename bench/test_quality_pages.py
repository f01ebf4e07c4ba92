"""The quality study's committed pages (bench/results/quality/) are what bench/quality.py writes from its records:
runs.md from runs.json, and each comparison and chart folder from the results and curves kept beside it, byte for
byte. compare_b64/ and compare_b512/ hold runs whose results an earlier machine did not keep: the report leaves them
as they are and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import quality

COMMITTED = Path(__file__).resolve().parent / "results" / "quality"
KEPT_AS_THEY_ARE = {"compare_b64", "compare_b512"}


def runs() -> dict:
    return json.loads((COMMITTED / "runs.json").read_text(encoding="utf-8"))["runs"]


def test_runs_md_is_the_page_of_runs_json():
    assert quality.runs_page(runs()) == (COMMITTED / "runs.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_every_comparison_and_chart_folder_regenerates_byte_for_byte(tmp_path, capsys):
    quality.report({"runs": runs()}, out=tmp_path)
    said = capsys.readouterr().out
    for folder in KEPT_AS_THEY_ARE:
        assert f"{folder} kept as it is" in said and not (tmp_path / folder).exists()
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(COMMITTED).as_posix() for p in COMMITTED.rglob("*") if p.is_file()
                       and p.parent.name not in KEPT_AS_THEY_ARE and p.parent.parent.name != "runs"
                       and p.name not in ("runs.json", "runs.json.lock"))  # fmt: skip
    assert written == committed
    assert [name for name in written if (tmp_path / name).read_bytes() != (COMMITTED / name).read_bytes()] == []
