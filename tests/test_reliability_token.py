"""Reliability, class 1: a Hub token given on the command line reaches no file the run writes (saved arguments in
the output folder and every checkpoint, TensorBoard event files, the card), no log line, and still pushes."""

from __future__ import annotations

import logging

from test_hub import hub_env, train_args  # noqa: F401 - hub_env is a fixture

from simcse_hn.cli import train
from simcse_hn.testing.hub_server import HubStandIn

SECRET = "hf_SECRETtokenThatMustNeverReachTheDisk0123"


def test_cli_hub_token_is_in_no_file_log_or_upload_and_still_pushes(tmp_path, hub_env, caplog, capfd):  # noqa: F811
    out = tmp_path / "out"
    repo = "tester/tiny-token"
    with HubStandIn(token=SECRET) as server, caplog.at_level(logging.DEBUG):
        hub_env(server.url, token=None)  # no HF_TOKEN, no saved login: the push can only use --hub_token
        argv = train_args(
            out,
            "--max_steps", "4", "--save_steps", "2", "--save_total_limit", "5", "--logging_steps", "1",
            "--report_to", "tensorboard", "--hub_token", SECRET, "--push_to_hub", "true", "--hub_model_id", repo,
        )  # fmt: skip
        assert train.main(argv) == 0
        uploaded = server.repos[repo]

    written = {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    names = [str(path.relative_to(out)) for path in written]
    # the places a token was written to before: pickled arguments (folder and each checkpoint), event files, card
    assert {"training_args.bin", "checkpoint-2/training_args.bin", "checkpoint-4/training_args.bin"} <= set(names)
    assert any("tfevents" in name for name in names) and "README.md" in names
    leaked = [name for name, (path, content) in zip(names, written.items()) if SECRET.encode() in content]
    assert leaked == []
    assert [name for name, content in uploaded.items() if SECRET.encode() in content] == []
    assert SECRET not in caplog.text
    printed = capfd.readouterr()
    assert SECRET not in printed.out and SECRET not in printed.err
