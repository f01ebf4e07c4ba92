"""The command line's early answers (simcse_hn/cli/answers.py, entered through simcse_hn/cli/front.py): --help, a bad
flag, value, YAML key or missing file answered before torch and transformers are imported, in the words the command
itself uses; the flag tables they read are the real parsers' own."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import tomllib
from conftest import FIXTURES, ROOT

from simcse_hn.cli import answers, flag_table, reference
from simcse_hn.configuration.command_line import one_line
from simcse_hn.errors import UserError

CORPUS = str(FIXTURES / "tiny_corpus.txt")
COMMANDS = ("train", "sts", "compare", "curves", "mteb_check")


def real_parser(command: str):
    from simcse_hn.cli import compare, curves, mteb_check, sts
    from simcse_hn.configuration import parser

    builders = {
        "train": parser.build_parser,
        "sts": sts.build_parser,
        "compare": compare.build_parser,
        "curves": curves.build_parser,
        "mteb_check": mteb_check.build_parser,
    }
    return builders[command]()


# --- the tables are the real parsers' ---


def test_each_committed_table_is_the_one_its_real_parser_gives():
    for command, table in reference.tables().items():
        assert flag_table.load(command) == json.loads(flag_table.dumps(table)), "run python -m simcse_hn.cli.reference"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_rebuilt_parser_prints_the_real_help_word_for_word(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    light = flag_table.rebuild(flag_table.load(command))
    assert light.format_help() == real_parser(command).format_help()


def test_a_table_that_lost_a_flag_prints_another_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    table = flag_table.load("sts")
    table["flags"] = [flag for flag in table["flags"] if flag["dest"] != "sickr_all"]
    assert flag_table.rebuild(table).format_help() != real_parser("sts").format_help()


# --- train.py: the same refusal, in the same words ---


def early(argv: list[str]) -> str | None:
    """train.py's early answer: the error (no 'error: ') or None when the run goes on."""
    try:
        answers.check_train(flag_table.load("train"), argv)
    except UserError as e:
        return str(e)
    return None


def refused_by_the_run(argv: list[str]) -> str:
    from simcse_hn.cli import train

    with pytest.raises(UserError) as raised:
        train.run(argv)
    return str(raised.value)


def yaml_file(tmp_path, text: str) -> str:
    path = tmp_path / f"c{len(list(tmp_path.glob('c*.yaml')))}.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def bad_runs(tmp_path) -> list[tuple[list[str], str | None]]:
    """(argv, the words expected, or None where the test only holds the early answer to the run's)."""
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    (no_config / "weights.bin").write_text("")
    base = ["--model_name_or_path", "builtin:tiny-bert", "--train_file", CORPUS, "--output_dir", str(tmp_path / "o")]
    cases = [
        (["--learning-rat3", "1e-4"], "--learning-rat3: no such flag (did you mean --learning_rate?)"),
        (["--bogus", "1"], "--bogus: no such flag; "),
        (["--learn", "1e-4"], "ambiguous option: --learn could match"),
        (["stray"], "'stray': a value without a flag"),
        (["--learning_rate", "abc"], "learning_rate: invalid float value: 'abc'"),
        (["--per_device_train_batch_size", "1.5"], None),
        (["--pooler", "avgg"], "pooler: invalid choice: 'avgg' (did you mean 'avg'?); choose from 'cls', "),
        (["--contrast_form", "pairs"], "contrast_form: invalid choice: 'pairs' (choose from 'simcse', 'symmetric')"),
        (["--eval_strategy", "step"], "eval_strategy: invalid choice: 'step' (did you mean 'steps'?)"),
        (["--optim", "adamw"], None),
        (["--bf16", "maybe"], "bf16: Truthy value expected: got maybe"),
        (["--debug", "loud"], "debug: invalid DebugOption value: 'loud'"),
        (["--lora_target_modules"], "lora_target_modules: expected at least one argument"),
        (["--loss", "hlc"], "loss: unknown loss 'hlc' (did you mean 'hcl'?); choose one of infonce, dcl, hcl,"),
        (["--loss", "supcon"], "loss: unknown loss 'supcon'; choose one of infonce"),
        (["--dropout", "1.5"], "dropout: must be in [0, 1), got 1.5"),
        (["--max_seq_length", "1"], None),
        (["--data_format", "pair"], "data_format: invalid choice: 'pair' (did you mean 'pairs'?)"),
        (["--lora_target_modules", "query"], "lora_target_modules: needs lora_r"),
        (["--train_file", "missing.txt"], "train_file: file not found: missing.txt"),
        (["--eval_file", "missing.jsonl"], "eval_file: file not found: missing.jsonl"),
        (["--dataset_name", "user/corpus"], "dataset_name: give train_file or dataset_name, not both"),
        (["--model_name_or_path", "./nowhere"], "model_name_or_path: no such model folder: ./nowhere"),
        (["--model_name_or_path", "runs/a/b"], "model_name_or_path: no such model folder: runs/a/b"),
        (["--model_name_or_path", str(no_config)], f"model_name_or_path: {no_config} is not a model folder"),
        (["--model_name_or_path", CORPUS], f"model_name_or_path: {CORPUS} is a file; give the model's folder"),
        (["--guide_model", "./nowhere"], "guide_model: no such model folder: ./nowhere"),
        (["--topic_batches", "true", "--topic_encoder", "./nowhere"], "topic_encoder: no such model folder"),
        (["--config", str(tmp_path / "none.yaml")], "config: file not found: "),
        (["--config", yaml_file(tmp_path, "loss: [hcl\n")], "config: malformed YAML in "),
        (["--config", yaml_file(tmp_path, "learnin_rate: 1.0e-4\n")], "learnin_rate: unknown key in "),
        (["--config", yaml_file(tmp_path, "pooler: avgg\n")], "(did you mean 'avg'?); choose from"),
        (["--config", yaml_file(tmp_path, "temperature: [1, 2]\n")], "temperature: expected one value, got a list"),
    ]
    return [(base + argv, words) for argv, words in cases] + [
        (["--model_name_or_path", "builtin:tiny-bert"], "train_file: required"),
        (["--config", yaml_file(tmp_path, "train_file: missing.txt\n")], "file not found: missing.txt (in "),
    ]


def test_every_early_refusal_is_the_runs_own_in_the_same_words(tmp_path):
    for argv, words in bad_runs(tmp_path):
        answer = early(argv)
        assert answer is not None, argv
        assert answer == refused_by_the_run(argv), argv
        assert words is None or words in answer, (argv, answer)
    assert "did you mean learning_rate?" in early(["--config", yaml_file(tmp_path, "learnin_rate: 1\n")])


def test_for_every_typed_flag_a_bad_value_is_refused_as_the_run_refuses_it(tmp_path):
    base = ["--model_name_or_path", "builtin:tiny-bert", "--train_file", CORPUS, "--output_dir", str(tmp_path / "o")]
    table = flag_table.load("train")
    typed = [flag for flag in table["flags"] if flag["type"] not in (None, "str", "text") or flag["choices"]]
    assert len(typed) > 100
    for flag in typed:
        argv = base + [flag["option_strings"][0], "zz"]
        answer = early(argv)
        assert answer is not None and answer.startswith(flag["dest"]), argv
        assert answer == refused_by_the_run(argv), argv


def test_a_valid_value_of_every_flag_is_let_through_or_refused_as_the_run_refuses_it(tmp_path):
    base = ["--model_name_or_path", "builtin:tiny-bert", "--train_file", CORPUS, "--output_dir", str(tmp_path / "o")]
    let_through = 0
    for flag in flag_table.load("train")["flags"]:
        if flag["action"] != "store" or flag["default"] in (None, [], "") or isinstance(flag["default"], dict):
            continue
        value = flag["default"] if isinstance(flag["default"], list) else [flag["default"]]
        argv = base + [flag["option_strings"][0], *(str(v).lower() if isinstance(v, bool) else str(v) for v in value)]
        answer = early(argv)
        if answer is None:
            let_through += 1
        else:
            assert answer == refused_by_the_run(argv), argv
    assert let_through > 80


def test_every_recipe_config_is_let_through_or_refused_as_the_run_refuses_it(tmp_path):
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        argv = ["--config", str(config), "--output_dir", str(tmp_path / "o")]
        answer = early(argv)
        if answer is not None:
            assert answer == refused_by_the_run(argv), config
    assert early(["--config", str(ROOT / "configs" / "debug_tiny.yaml")]) is None


# --- train.py --help ---


def help_text(argv: list[str], capsys) -> tuple[int, str]:
    code = answers.answer_train(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_help_shows_the_common_flags_and_says_where_the_others_are(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "119")
    code, text = help_text(["--help"], capsys)
    assert code == 0 and len(text.splitlines()) < 80, text
    for name in (
        "model_name_or_path",
        "train_file",
        "eval_file",
        "loss",
        "per_device_train_batch_size",
        "learning_rate",
        "max_steps",
        "output_dir",
        "eval_steps",
        "config",
    ):
        assert f"--{name} " in text, name
    assert "--hcl_beta" not in text and "--adam_beta1" not in text
    assert "--help-all" in text and "docs/reference.md" in text and "--help FLAG" in text
    assert help_text(["--hel"], capsys) == (0, text)  # argparse's abbreviation of --help
    assert help_text(["-h", "--bogus"], capsys) == (0, text)


def test_help_all_is_the_real_parsers_help_and_the_reference_lists_every_flag(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, text = help_text(["--help-all"], capsys)
    assert code == 0 and text == real_parser("train").format_help()
    page = reference.PAGE.read_text(encoding="utf-8")
    names = flag_table.flag_names(flag_table.load("train"))
    assert len(names) > 150 and [name for name in names if f"`--{name}`" not in page and name != "help"] == []
    # an objective's option flag is None when unset: its help and its row name the objective's default alone
    assert "(default: 0.1) (default: None)" not in " ".join(text.split())
    assert "| `--hcl_beta` | float |  | HCL concentration beta (tilt beta/t per unit cosine). (default: 0.1) |" in page


def test_help_names_one_flag_or_one_group_and_a_misspelt_one_gets_the_closest(capsys):
    code, text = help_text(["--help", "loss"], capsys)
    assert code == 0 and "--loss" in text and "--temperature" not in text
    code, text = help_text(["--help", "hcl"], capsys)
    assert code == 0 and "--hcl_beta" in text and "--hcl_tau_plus" in text and "--loss {" not in text
    assert "(default: 0.1)" in text and "(default: None)" not in text  # the objective's default, and only it
    code, text = help_text(["--help", "lss"], capsys)
    assert (code, text) == (2, "error: --help lss: no such flag or group (did you mean --loss?)\n")


# --- the argparse commands: one line, and the same words ---


def sts_cases(tmp_path) -> list[list[str]]:
    return [
        [],
        ["--model"],
        ["--model", "m", "--bogus"],
        ["--model", "m", "--sickr-all"],
        ["--model", "m", "--batch_size", "x"],
        ["--model", "m", "--aggregation", "meen"],
        ["--model", "m", "stray"],
    ]


def test_a_bad_sts_flag_is_one_line_with_the_real_parsers_words(tmp_path, capsys):
    from simcse_hn.cli import sts

    for argv in sts_cases(tmp_path):
        assert answers.answer("sts", argv) == 2
        line = capsys.readouterr().err
        with pytest.raises(SystemExit) as raised:
            sts.main(argv)
        assert raised.value.code == 2
        real = capsys.readouterr().err.strip().splitlines()[-1].split(" error: ", 1)[1]
        if real.startswith("unrecognized arguments: "):  # the first of them named
            first = real.split(": ", 1)[1].split()[0]
            assert line.startswith((f"error: {first}: no such flag", f"error: {first!r}: a value without")), line
        else:
            assert line == f"error: {one_line(real, dashes=True)}\n", argv
    assert answers.answer("sts", ["--model", "m", "--sickr-all"]) == 2
    assert "(did you mean --sickr_all?)" in capsys.readouterr().err
    assert answers.answer("sts", ["--model", "m", "--aggregation", "meen"]) == 2
    assert "invalid choice: 'meen' (did you mean 'mean'?)" in capsys.readouterr().err


def test_what_sts_refuses_of_its_flags_it_refuses_early_and_in_the_run_alike(tmp_path, capsys):
    from simcse_hn.cli import sts

    cases = [
        (["--model", str(tmp_path / "nowhere")], f"--model: no such model folder: {tmp_path / 'nowhere'}"),
        (["--model", "builtin:tiny-bert", "--data_dir", "./nowhere"], "--data_dir: no such folder: ./nowhere"),
        (["--model", "builtin:tiny-bert", "--pooler", "avgg"], "--pooler: no pooler 'avgg' (did you mean 'avg'?)"),
        (["--model", "builtin:tiny-bert", "--baseline", "./none:avg"], "--baseline ./none:avg: './none' is neither"),
        (["--model", "builtin:tiny-brt"], "--model: builtin:tiny-brt is not a builtin model (did you mean builtin:ti"),
        (["--model", CORPUS], f"--model: {CORPUS} is a file; give the model's folder (the one holding config.json)"),
    ]
    for argv, words in cases:
        argv = argv + ["--output", str(tmp_path / "out")]
        assert answers.answer("sts", argv) == 2
        line = capsys.readouterr().err
        assert line.startswith(f"error: {words}"), line
        assert sts.main(argv) == 2
        assert capsys.readouterr().err.splitlines()[-1] == line.strip()
    assert answers.answer("sts", ["--model", "builtin:tiny-bert", "--data_dir", str(tmp_path)]) is None


@pytest.mark.parametrize("command", ["compare", "curves", "mteb_check"])
def test_the_report_commands_refuse_a_bad_flag_in_one_line(command, capsys):
    assert answers.answer(command, ["--bogus"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- before torch: in a process of its own ---

# A process in which importing torch, transformers or datasets fails: an answer that needs them is a traceback.
NO_TORCH = """
import runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in ('torch', 'transformers', 'datasets', 'sentence_transformers'):
            raise ImportError(name + ' imported before the answer')
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[1:]
if sys.argv[0].endswith('.py'):
    runpy.run_path(sys.argv[0], run_name='__main__')
else:  # a console script's entry point, module:function, which reads sys.argv as the installed script does
    module, _, function = sys.argv[0].partition(':')
    sys.exit(getattr(__import__(module, fromlist=[function]), function)())
"""


def without_torch(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )


STUDY = "simcse_hn.cli.study:console"  # simcse-hn-study's entry point
SCRIPT_ANSWERS = [
    (["train.py", "--help"], 0, "--help-all"),
    (["train.py", "--help-all"], 0, "--hcl_beta"),
    (["train.py", "--help", "temperature"], 0, "--temperature"),
    (["train.py", "--bogus", "1"], 2, "error: --bogus: no such flag"),
    (["train.py", "--loss", "hlc", "--train_file", CORPUS], 2, "(did you mean 'hcl'?)"),
    (["train.py", "--config", "nowhere.yaml"], 2, "error: config: file not found: nowhere.yaml"),
    (["train.py", "--train_file", "nowhere.txt"], 2, "error: train_file: file not found: nowhere.txt"),
    (["train.py", "--train_file", CORPUS, "--model_name_or_path", "./nowhere"], 2, "no such model folder"),
    (["train.py"], 2, "error: train_file: required"),
    (["eval/sts.py", "--help"], 0, "--baseline"),
    (["eval/sts.py", "--model", "m", "--bogus"], 2, "error: --bogus: no such flag"),
    (["eval/sts.py", "--model", "./nowhere"], 2, "error: --model: no such model folder: ./nowhere"),
    (["eval/sts.py", "--model", "m", "--data_dir", "./nowhere"], 2, "error: --data_dir: no such folder"),
    (["eval/compare.py", "--help"], 0, "--bootstrap"),
    (["eval/curves.py", "run", "--output", "o", "--bogus"], 2, "error: --bogus: no such flag"),
    (["eval/mteb_check.py", "--help"], 0, "--tolerance"),
    ([STUDY, "--help"], 0, "pilot"),
    ([STUDY, "rn", "plan.yaml"], 2, "invalid choice: 'rn' (did you mean 'run'?)"),
    ([STUDY, "run", "nowhere.yaml"], 2, "error: nowhere.yaml: no such plan"),
    ([STUDY, "run", "p.yaml", "--jbos", "2"], 2, "--jbos: no such flag (did you mean --jobs?)"),
]


@pytest.mark.parametrize("argv, code, words", SCRIPT_ANSWERS, ids=[" ".join(a[0]) for a in SCRIPT_ANSWERS])
def test_the_answer_comes_before_torch_or_transformers_is_imported(argv, code, words):
    result = without_torch(*argv)
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and words in result.stdout + result.stderr
    assert code == 0 or result.stderr.count("\n") == 1


def test_every_console_script_answers_help_before_torch():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    fronts = {name for name, entry in scripts.items() if entry.startswith("simcse_hn.cli.front:")}
    assert fronts == {
        "simcse-hn-train",
        "simcse-hn-sts",
        "simcse-hn-compare",
        "simcse-hn-curves",
        "simcse-hn-mteb-check",
    }
    for name, entry in scripts.items():  # the others (mine, negatives, study) import the heavy modules late
        result = without_torch(entry, "--help")
        assert result.returncode == 0 and result.stdout.startswith("usage:"), (name, result.stderr[-2000:])


def test_the_check_fails_where_a_command_needs_torch():
    argv = ["train.py", "--train_file", CORPUS, "--model_name_or_path", "builtin:tiny-bert", "--max_steps", "1"]
    result = without_torch(*argv)
    assert result.returncode != 0 and "imported before the answer" in result.stderr


# --- did you mean: every name a user types ---


def test_a_misspelt_name_gets_the_closest_known_one_and_a_far_one_none(tmp_path):
    from simcse_hn.data.sentences import load_sentences
    from simcse_hn.data.sts import parse_tasks
    from simcse_hn.errors import did_you_mean
    from simcse_hn.losses.hcl import HCLLoss

    with pytest.raises(ValueError, match=r"unknown STS task 'stsbb' \(did you mean 'STS-B'\?\); choose from all,"):
        parse_tasks("sts12,stsbb")
    with pytest.raises(ValueError, match=r"bta: not an option of this objective \(did you mean 'beta'\?\)"):
        HCLLoss.Options.from_mapping({"bta": 0.2})
    table = tmp_path / "t.csv"
    table.write_text("txt,label\nhello,1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"no column 'text' \(did you mean 'txt'\?\) in header"):
        load_sentences(str(table), "text")
    assert did_you_mean("premise", ["sent0", "sent1"]) == ""
    assert did_you_mean("--Learning-Rate", ["learning_rate"], lambda name: f"--{name}") == (
        " (did you mean --learning_rate?)"
    )


def test_the_answers_docs_training_shows_are_the_ones_train_py_gives():
    """docs/training.md's example session, run: each `$ python train.py ...` line and the line it prints."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    session = re.search(r"```text\n(\$ python train\.py .*?)```", text, flags=re.S).group(1).splitlines()
    pairs = list(zip(session[::2], session[1::2], strict=True))
    assert len(pairs) >= 2
    for command, printed in pairs:
        result = subprocess.run(
            [sys.executable, *shlex.split(command[2:])[1:]], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert (result.returncode, result.stderr) == (2, printed + "\n"), command
