"""docs/reference.md lists the names the code makes at import time (the objectives' flags, the SimCSE{Title}Loss
classes), so that grep finds each; the page is the code's own (`python -m simcse_hn.cli.reference` writes it) and a
page that differs fails, naming that command."""

from __future__ import annotations

import dataclasses

from simcse_hn.cli import reference
from simcse_hn.configuration.objective import ObjectiveFlags
from simcse_hn.export import st_losses


def test_the_page_is_the_one_the_code_writes():
    page = reference.PAGE.read_text(encoding="utf-8")
    assert page == reference.markdown(), f"docs/reference.md differs from the code: run `{reference.COMMAND}`"


def test_every_generated_flag_and_loss_class_can_be_found_on_the_page():
    page = reference.PAGE.read_text(encoding="utf-8")
    flags = [f"`--{item.name}`" for item in dataclasses.fields(ObjectiveFlags)]
    classes = [f"`{name}`" for name in st_losses.__all__]
    assert len(flags) > 10 and "`SimCSEHCLLoss`" in classes
    assert [name for name in flags + classes if name not in page] == []


def test_the_check_fails_on_a_stale_page_and_the_command_mends_it(tmp_path, capsys):
    page = tmp_path / "reference.md"
    page.write_text(reference.PAGE.read_text(encoding="utf-8").replace("`--hcl_beta`", "`--hcl_b`"), encoding="utf-8")
    tables = ["--tables", str(tmp_path / "flags")]  # the committed tables stay as they are
    assert reference.main(["--check", "--page", str(page), *tables]) == 1
    err = capsys.readouterr().err
    assert "reference.md differs from the code: run `python -m simcse_hn.cli.reference`" in err
    assert "train.json differs from the code" in err  # no table there yet
    assert reference.main(["--page", str(page), *tables]) == 0
    assert reference.main(["--check", "--page", str(page), *tables]) == 0
    assert page.read_text(encoding="utf-8") == reference.PAGE.read_text(encoding="utf-8")
    assert (tmp_path / "flags" / "sts.json").read_text() == (reference.flag_table.TABLES / "sts.json").read_text()
