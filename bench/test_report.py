"""Every page in bench/results/ is its bench's `markdown(record)` of the JSON beside it (`python -m bench.report`),
except the two older pages that carry text their records lack."""

from pathlib import Path

import pytest

from bench import report

RESULTS = Path(__file__).resolve().parent / "results"
# Pages written before their bench wrote pages from records, with text the record does not hold (docs/speed.md).
HAND_WRITTEN = {"eval_speed_steal_5f639e0.md", "train_compile_tiny.md"}
RECORDS = sorted(path for path in RESULTS.rglob("*.json") if path.with_suffix(".md").is_file())


def pages():
    for path in RECORDS:
        try:
            yield path, report.page(path)
        except LookupError:  # a record no bench here writes a page from (a retired bench's, the quality study's)
            continue


@pytest.mark.parametrize("path, text", list(pages()), ids=lambda value: getattr(value, "name", "page"))
def test_each_page_is_its_records_page(path, text):
    target = path.with_suffix(".md")
    if target.name in HAND_WRITTEN:
        assert target.read_text(encoding="utf-8") != text  # still hand-written: the list stays true
    else:
        assert target.read_text(encoding="utf-8") == text
