"""What train.py saves loads in sentence-transformers and transformers with SimCSE's embeddings; the card and the
push to a Hub stand-in on 127.0.0.1 (simcse_hn/testing/hub_server.py); one-line errors without credentials or
network."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT
from huggingface_hub import ModelCard, constants
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from simcse_hn.cli import train
from simcse_hn.data.sts import STS_TASKS
from simcse_hn.evaluation.mteb_results import MTEB_TASKS
from simcse_hn.export import hub, model_card
from simcse_hn.export.hub import HubTarget
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.run_record import RunRecord, Source
from simcse_hn.testing.hub_server import HubStandIn
from simcse_hn.testing.models import TINY_MODEL

# The first sentence is longer than the training max_seq_length=32 (character-level tokenizer): the saved folder keeps
# the encoder's own 128-token limit, so every path must encode it whole.
SENTENCES = [
    "A man is playing a large guitar on the stage while the crowd sings along with him.",
    "Someone plays an instrument.",
    "The weather is cold today.",
]
SNIPPET_SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument."]  # those in the card's snippets
STS_RESULTS = {
    "model": "tester/tiny-simcse",
    "pooler": "cls",
    "aggregation": "all",
    "sickr_pairs": "test",
    "date": "2026-11-30",
    "versions": {"transformers": "5.24.0"},
    "tasks": {name: {"spearman": 61.25 + i, "pairs": 100 + i, "subsets": {}} for i, name in enumerate(STS_TASKS)},
    "average": 64.25,
}


# Training at 32 tokens and a stated inference limit of 48 (the first of SENTENCES is longer): both libraries must
# truncate at 48, never at 32.
INFERENCE_LENGTH = 48
SAVED_LENGTHS = {"max_seq_length": 32, "inference_max_seq_length": INFERENCE_LENGTH}


def train_args(output_dir: Path, *extra: str, evaluate: bool = False) -> list[str]:
    args = [
        "--config", str(ROOT / "configs" / "debug_tiny.yaml"),
        "--train_file", str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file", str(FIXTURES / "sts_tiny.jsonl"),
        "--output_dir", str(output_dir),
        "--max_steps", "2", "--save_steps", "2", "--eval_steps", "2", "--logging_steps", "2",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    if not evaluate:  # STS-B dev scoring is the slow part of a tiny run
        args += ["--eval_strategy", "no", "--load_best_model_at_end", "false"]
    return args + list(extra)


def snippet(card: str, heading: str) -> str:
    return re.search(rf"### {heading}.*?```python\n(.*?)```", card, re.DOTALL).group(1)


def run_snippet(code: str, folder: Path):
    """A card's snippet for a local folder loads `path/to/<name>`: this test puts the folder there."""
    code = re.sub(r'"path/to/[^"]+"', repr(str(folder)).replace("'", '"'), code)
    namespace: dict = {}
    exec(compile(code, "<model card>", "exec"), namespace)  # noqa: S102 - our own card's usage snippet
    return torch.as_tensor(namespace["embeddings"]).float()


def auto_model_embeddings(path: Path, pooler: str, mlp_only_train: bool) -> torch.Tensor:
    """transformers only, pooling written out independently of simcse_hn."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    layers = {
        "avg": out.last_hidden_state,
        "avg_first_last": (out.hidden_states[1] + out.hidden_states[-1]) / 2,
        "avg_top2": (out.hidden_states[-2] + out.hidden_states[-1]) / 2,
    }
    if pooler in layers:
        return (layers[pooler] * mask).sum(1) / mask.sum(1)
    return out.pooler_output if pooler == "cls" and not mlp_only_train else out.last_hidden_state[:, 0]


def files_snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, but the folder's lock (simcse_run.lock: each run that holds it writes who it is)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "simcse_run.lock"}  # fmt: skip


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """Point huggingface_hub (HF_ENDPOINT is read at import: patch its constants) at `endpoint`, with `token` as the
    only credential."""

    def use(endpoint: str, token: str | None = None, offline: bool = False) -> None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))  # no saved login
        monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / "agents.json"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
            monkeypatch.delenv(name, raising=False)
        if token is not None:
            monkeypatch.setenv("HF_TOKEN", token)

    return use


@pytest.fixture
def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more: connections are refused at once


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory) -> Path:
    """A saved (untrained) tiny model: enough for the error paths."""
    out = tmp_path_factory.mktemp("saved")
    model = SimCSEModel.from_pretrained(TINY_MODEL, pooler="avg")
    model.save_pretrained(str(out), tokenizer=load_tokenizer(TINY_MODEL), extra_config={"max_seq_length": 32})
    model_card.write_model_card(str(out))
    return out


# --- train.py's folder loads in both libraries with SimCSE's embeddings ---

POOLER_RUNS = {
    "cls": ("cls", True),  # SimCSE unsup: MLP in training only
    "avg": ("avg", True),
    "cls_mlp": ("cls", False),  # MLP kept at inference: a Dense(tanh) module / the encoder's pooler
}


@pytest.fixture(scope="module", params=list(POOLER_RUNS))
def trained(request, tmp_path_factory):
    pooler, mlp_only_train = POOLER_RUNS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "out"
    trainer = train.run(train_args(out, "--pooler", pooler, "--mlp_only_train", str(mlp_only_train).lower()))
    return trainer, out, pooler, mlp_only_train


def test_train_py_folder_loads_in_sentence_transformers_and_transformers_with_simcse_embeddings(trained):
    trainer, out, pooler, mlp_only_train = trained
    model, tokenizer = trainer.model, trainer.processing_class
    expected = model.encode(SENTENCES, tokenizer)  # the trained model in memory, at full length

    st = SentenceTransformer(str(out), device="cpu")
    assert st.max_seq_length == 128  # the encoder's limit, not the training max_seq_length (32)
    torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(auto_model_embeddings(out, pooler, mlp_only_train), expected, rtol=0, atol=1e-5)
    reloaded = SimCSEModel.from_pretrained(str(out))
    torch.testing.assert_close(reloaded.encode(SENTENCES, load_tokenizer(str(out))), expected, rtol=0, atol=1e-5)

    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling"] + (["Dense"] if not mlp_only_train else [])
    checkpoints = list(out.glob("checkpoint-*"))
    assert checkpoints
    for checkpoint in checkpoints:  # checkpoints are complete sentence-transformers folders too
        names = {p.name for p in checkpoint.iterdir()}
        assert {"modules.json", "sentence_bert_config.json", "simcse_config.json"} <= names

    # The card's own usage snippets give the same embeddings.
    card = (out / "README.md").read_text()
    reference = model.encode(SNIPPET_SENTENCES, tokenizer)
    torch.testing.assert_close(run_snippet(snippet(card, "transformers"), out), reference, rtol=0, atol=1e-5)
    torch.testing.assert_close(run_snippet(snippet(card, "sentence-transformers"), out), reference, rtol=0, atol=1e-5)
    # a card for a folder without a Hub id: no path of the training machine anywhere, a placeholder in the snippets
    assert str(out) not in card and str(FIXTURES) not in card and f'"path/to/{out.name}"' in card
    assert "local file `tiny_corpus.txt`" in card and "2 steps" in card and "sentences seen" in card
    saved = json.loads((out / "simcse_config.json").read_text())
    assert saved["data"]["source"] == {"name": "tiny_corpus.txt", "local": True} and saved["budget"]["steps"] == 2


@pytest.mark.parametrize("pooler", ["avg_first_last", "avg_top2"])
def test_layer_average_poolers_load_in_sentence_transformers(tmp_path, pooler):
    """No Pooling mode averages two layers: a WeightedLayerPooling (weights 1 on the two layers, 0 elsewhere) does.
    Three layers, so avg_first_last really skips a middle layer."""
    tokenizer = load_tokenizer(TINY_MODEL)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = SimCSEModel(BertModel(config), pooler=pooler)
    model.save_pretrained(str(tmp_path), tokenizer=tokenizer, extra_config=SAVED_LENGTHS)
    model_card.write_model_card(str(tmp_path))
    expected = model.encode(SENTENCES, tokenizer, max_length=INFERENCE_LENGTH)

    st = SentenceTransformer(str(tmp_path), device="cpu")
    torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(auto_model_embeddings(tmp_path, pooler, True), expected, rtol=0, atol=1e-5)
    assert "output_hidden_states" not in json.loads((tmp_path / "config.json").read_text())  # AutoModel unchanged
    reference = model.encode(SNIPPET_SENTENCES, tokenizer, max_length=INFERENCE_LENGTH)
    card = (tmp_path / "README.md").read_text()
    torch.testing.assert_close(run_snippet(snippet(card, "transformers"), tmp_path), reference, rtol=0, atol=1e-5)


ALL_POOLERS = [("cls", True), ("cls", False), ("avg", True), ("avg_first_last", True), ("avg_top2", True)]


def saved_pooler_folders(root: Path) -> dict[str, tuple[Path, torch.Tensor]]:
    """A saved 3-layer tiny model per pooler (and cls with the MLP kept) -> name: (folder, SimCSEModel embeddings)."""
    tokenizer = load_tokenizer(TINY_MODEL)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    folders = {}
    for pooler, mlp_only_train in ALL_POOLERS:
        torch.manual_seed(0)
        model = SimCSEModel(BertModel(config), pooler=pooler, mlp_only_train=mlp_only_train)
        folder = root / f"{pooler}-{'mlp_train_only' if mlp_only_train else 'mlp'}"
        model.save_pretrained(str(folder), tokenizer=tokenizer, extra_config=SAVED_LENGTHS)
        folders[folder.name] = (folder, model.encode(SENTENCES, tokenizer, max_length=INFERENCE_LENGTH))
    return folders


def test_saved_modules_use_the_classic_format_every_version_reads(tmp_path):
    """sentence-transformers 6 saves module paths under sentence_transformers.base/... and renamed config keys, which
    5.x cannot load; the folder is rewritten to the format of the models on the Hub (6.x loads it: tests above)."""
    folders = saved_pooler_folders(tmp_path)
    for name, (folder, _) in folders.items():
        entries = json.loads((folder / "modules.json").read_text())
        assert all(e["type"].startswith("sentence_transformers.models.") for e in entries), name
        config = json.loads((folder / "sentence_bert_config.json").read_text())
        assert config["max_seq_length"] == INFERENCE_LENGTH and config["do_lower_case"] is False
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        assert tokenizer_config["model_max_length"] == INFERENCE_LENGTH  # transformers users truncate alike
        assert not {"is_local", "local_files_only"} & set(tokenizer_config)  # nothing about this machine's copy
        assert ("config_args" in config) == name.startswith(("avg_first_last", "avg_top2"))
        for entry in entries[1:]:
            module_config = json.loads((folder / entry["path"] / "config.json").read_text())
            assert "embedding_dimension" not in module_config and "module_input_name" not in module_config, name
    pooling = json.loads((folders["cls-mlp"][0] / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 32 and pooling["pooling_mode_cls_token"]
    assert not pooling["pooling_mode_mean_tokens"]
    dense = json.loads((folders["cls-mlp"][0] / "2_Dense" / "config.json").read_text())
    assert dense == {"in_features": 32, "out_features": 32, "bias": True,
                     "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    for name, (folder, expected) in folders.items():  # and the current version still reads it
        st = SentenceTransformer(str(folder), device="cpu")
        torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), expected, rtol=0, atol=1e-5, msg=name)


OLD_ST = os.environ.get("SIMCSE_HN_OLD_ST")
OLD_ST_SCRIPT = """
import sys, torch, sentence_transformers
from sentence_transformers import SentenceTransformer
for folder in sys.argv[2:]:
    model = SentenceTransformer(folder, device="cpu")
    torch.save(model.encode(sys.argv[1].split("|"), convert_to_tensor=True), folder + "/old_st.pt")
print(sentence_transformers.__version__)
"""


@pytest.mark.skipif(not OLD_ST, reason="SIMCSE_HN_OLD_ST: a folder with sentence-transformers 5.x and its "
                    "transformers (.ci/run installs one)")  # fmt: skip
def test_saved_folders_load_in_sentence_transformers_5(tmp_path):
    """Users on sentence-transformers 5.x (with transformers 4.x) load what we save: every pooler, same embeddings.
    The old packages come first on PYTHONPATH of a subprocess; torch and numpy are this environment's."""
    folders = saved_pooler_folders(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(OLD_ST), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", OLD_ST_SCRIPT, "|".join(SENTENCES), *(str(f) for f, _ in folders.values())],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("5."), done.stdout
    for name, (folder, expected) in folders.items():
        got = torch.load(folder / "old_st.pt", weights_only=True)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=name)


# --- the card ---


def test_card_metadata_and_sts_table(tmp_path, saved_folder):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: mit\n---\n# a base encoder\n")
    saved = RunRecord.from_json(json.loads((saved_folder / "simcse_config.json").read_text()))
    config = dataclasses.replace(
        saved,
        model=dataclasses.replace(saved.model, base_model=Source(str(base), True), license="mit"),
        method=dataclasses.replace(saved.method, loss="hcl", objective_name=None, objective_summary=None,
                                   objective_citation=None, options={"beta": 0.1, "tau_plus": 0.0}),
        data=dataclasses.replace(saved.data, source=Source("princeton-nlp/datasets-for-simcse", False)),
    )
    path = model_card.write_model_card(
        str(tmp_path), config, STS_RESULTS, repo_id="tester/tiny-hcl", dev_spearman=81.5
    )

    card = ModelCard.load(path)
    data = card.data
    assert data.library_name == "sentence-transformers" and data.pipeline_tag == "sentence-similarity"
    assert data.tags == ["sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", "hcl"]
    assert data.license == "mit"  # read from the local base model's card
    assert data.datasets == ["princeton-nlp/datasets-for-simcse"] and data.base_model is None  # a local base
    values = {r.dataset_name: r.metric_value for r in data.eval_results}
    assert values == {name: round(t["spearman"], 2) for name, t in STS_RESULTS["tasks"].items()}
    assert data.model_name == "tiny-hcl"
    # filed under MTEB's datasets and revisions; SICK-R's test split said to be SimCSE's, not MTEB's 9,927 pairs
    assert {r.dataset_name: (r.dataset_type, r.dataset_revision, r.dataset_split) for r in data.eval_results} == {
        name: (task.dataset, task.revision, "test") for name, task in MTEB_TASKS.items()}
    protocols = {r.dataset_name: r.metric_args["protocol"] for r in data.eval_results}
    assert protocols.pop("SICK-R").startswith("SimCSE: the SICK test split") and set(protocols.values()) == {"SimCSE"}
    row = "| tiny-hcl | 61.25 | 62.25 | 63.25 | 64.25 | 65.25 | 66.25 | 67.25 | 64.25 |"
    assert row in card.text and "| STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |" in card.text
    assert "| beta | `0.1` |" in card.text and "81.50" in card.text and "arXiv:2010.04592" in card.text
    assert json.loads((tmp_path / "sts_results.json").read_text()) == STS_RESULTS  # kept next to the card
    assert model_card.base_model_license("bert-base-uncased") == "apache-2.0"
    assert model_card.base_model_license(TINY_MODEL) is None


def test_update_card_sts_keeps_other_metadata_and_results():
    foreign = (
        "---\nlicense: apache-2.0\nmodel-index:\n- name: m\n  results:\n  - task: {type: text-classification}\n"
        "    dataset: {name: SST-2, type: glue}\n    metrics:\n    - {type: accuracy, value: 90.1}\n---\n# m\n"
    )
    updated = ModelCard(model_card.update_card_sts(foreign, STS_RESULTS))
    assert updated.data.license == "apache-2.0"
    assert [r.dataset_name for r in updated.data.eval_results] == ["SST-2", *STS_TASKS]
    changed = {**STS_RESULTS, "tasks": {"STS12": {"spearman": 70.0}}}
    again = ModelCard(model_card.update_card_sts(updated.content, changed))
    assert [(r.dataset_name, r.metric_value) for r in again.data.eval_results] == [("SST-2", 90.1), ("STS12", 70.0)]
    assert again.text.count("## STS results") == 1 and "| m | 70.00 | – |" in again.text


# --- pushing ---


def test_train_py_pushes_once_and_eval_results_update_the_card(tmp_path, hub_env):
    out = tmp_path / "out"
    repo = "tester/tiny-simcse"
    with HubStandIn() as server:
        hub_env(server.url, token=server.token)
        argv = train_args(out, "--loss", "hcl", "--push_to_hub", "true", "--hub_model_id", repo, evaluate=True)
        assert train.main(argv) == 0
        # One commit of the final folder: the Trainer itself created no repo and pushed no checkpoint.
        assert [c["summary"] for c in server.commits] == ["Upload SimCSE sentence encoder"]
        assert [p for _, p in server.requests if p == "/api/repos/create"] == ["/api/repos/create"]
        local = files_snapshot(out)
        pushed = server.repos[repo]
        run_state = ("training_args.bin", "simcse_run.json")  # the run's files, not the model's
        expected = {p: b for p, b in local.items() if not p.startswith("checkpoint-") and p not in run_state}
        assert pushed == expected
        model_files = {"model.safetensors", "tokenizer.json", "simcse_config.json", "simcse_head.safetensors"}
        assert model_files | {"modules.json", "1_Pooling/config.json", "README.md"} <= set(pushed)
        card = ModelCard(pushed["README.md"].decode())
        assert card.data.library_name == "sentence-transformers" and "hcl" in card.data.tags
        assert "STS-B dev Spearman x 100" in card.text and "Not evaluated on the STS benchmarks yet" in card.text
        assert f'SentenceTransformer("{repo}")' in card.text

        url = hub.push_sts_results(repo, STS_RESULTS)
        assert url.startswith(f"{server.url}/{repo}/commit/")
        assert server.commits[-1]["paths"] == ["README.md", "sts_results.json"]
        assert json.loads(server.repos[repo]["sts_results.json"]) == STS_RESULTS
        card = ModelCard(server.repos[repo]["README.md"].decode())
        values = {r.dataset_name: r.metric_value for r in card.data.eval_results}
        assert values == {name: round(t["spearman"], 2) for name, t in STS_RESULTS["tasks"].items()}
        assert "| tiny-simcse | 61.25 | 62.25 | 63.25 | 64.25 | 65.25 | 66.25 | 67.25 | 64.25 |" in card.text
        assert "hcl" in card.data.tags and "STS-B dev Spearman x 100" in card.text  # the rest of the card is kept
    assert files_snapshot(out) == local  # pushing results changes nothing locally


def test_push_without_token_or_network_is_one_line_and_leaves_the_folder(saved_folder, hub_env, closed_port_url):
    before = files_snapshot(saved_folder)
    cases = [
        (dict(token=None), "no Hugging Face token"),
        (dict(token="hf_x"), "cannot reach"),
        (dict(token="hf_x", offline=True), "offline mode"),
    ]
    for env, message in cases:
        hub_env(closed_port_url, **env)
        for push in (
            lambda: hub.push_to_hub(str(saved_folder), HubTarget("tester/m")),
            lambda: hub.push_sts_results("tester/m", STS_RESULTS),
        ):
            with pytest.raises(hub.HubError, match=message) as error:
                push()
            assert "\n" not in str(error.value) and "tester/m" in str(error.value)
    assert files_snapshot(saved_folder) == before


def test_push_with_a_rejected_token_names_the_status(saved_folder, hub_env):
    with HubStandIn(token="the-right-one") as server:
        hub_env(server.url, token="a-wrong-one")
        with pytest.raises(hub.HubError, match="HTTP 401") as error:
            hub.push_to_hub(str(saved_folder), HubTarget("tester/m"))
        assert "\n" not in str(error.value) and not server.commits


def test_train_py_without_credentials_saves_then_exits_2(tmp_path, hub_env, closed_port_url, capsys):
    hub_env(closed_port_url, token=None)
    out = tmp_path / "out"
    assert train.main(train_args(out, "--push_to_hub", "true", "--hub_model_id", "tester/m")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: push ") and "no Hugging Face token" in err[-1]
    for name in ("model.safetensors", "tokenizer.json", "modules.json", "simcse_config.json", "README.md"):
        assert (out / name).is_file(), name


def test_push_to_hub_needs_a_repo_name(tmp_path, capsys):
    argv = train_args(tmp_path / "out", "--push_to_hub", "true")
    assert train.main(argv) == 2
    assert "error: hub_model_id: required with push_to_hub" in capsys.readouterr().err
    assert not (tmp_path / "out" / "model.safetensors").exists()  # refused before training


def test_push_uploads_exactly_the_saved_files_to_the_named_revision(tmp_path, hub_env):
    """The upload is an allow-list: the save's manifest, not whatever else lies in the folder (a .env, notes, a
    sub-folder, the Trainer's pickled arguments); `hub_revision` names the branch, created when missing."""
    folder = tmp_path / "model"
    model = SimCSEModel.from_pretrained(TINY_MODEL, pooler="avg")
    saved = model.save_pretrained(str(folder), tokenizer=load_tokenizer(TINY_MODEL), extra_config={"loss": "hcl"})
    model_card.write_model_card(str(folder))
    (folder / ".env").write_text("HF_TOKEN=hf_should_never_leave\n")
    (folder / "notes.txt").write_text("private notes\n")
    (folder / "drafts").mkdir()
    (folder / "drafts" / "idea.md").write_text("# an idea\n")
    (folder / "training_args.bin").write_bytes(b"pickled arguments")
    with HubStandIn() as server:
        hub_env(server.url, token=server.token)
        hub.push_to_hub(str(folder), HubTarget("tester/allow", revision="experiment-1"))
        pushed = set(server.repos["tester/allow"])
        assert server.commits[-1]["revision"] == "experiment-1" and server.branches["tester/allow"] == {"experiment-1"}
    assert pushed == set(saved) | {"README.md", "simcse_files.json"}
    assert {"model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"} <= pushed


def test_every_save_pushes_each_checkpoints_model_files_then_the_folder(tmp_path, hub_env):
    out = tmp_path / "out"
    repo = "tester/every-save"
    with HubStandIn() as server:
        hub_env(server.url, token=server.token)
        argv = train_args(out, "--save_steps", "1", "--push_to_hub", "true", "--hub_model_id", repo,
                          "--hub_strategy", "every_save")  # fmt: skip
        assert train.main(argv) == 0
        summaries = [c["summary"] for c in server.commits]
        assert summaries == ["Checkpoint at step 1", "Checkpoint at step 2", "Upload SimCSE sentence encoder"]
        checkpoint_paths = set(server.commits[0]["paths"])
        assert "model.safetensors" in checkpoint_paths
        assert not checkpoint_paths & {"optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin"}


def test_hub_strategies_that_push_checkpoint_state_are_refused(tmp_path, capsys):
    for strategy in ("checkpoint", "all_checkpoints"):
        argv = train_args(tmp_path / "out", "--push_to_hub", "true", "--hub_model_id", "tester/m",
                          "--hub_strategy", strategy)  # fmt: skip
        assert train.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: hub_strategy:") and "\n" not in err
    assert not (tmp_path / "out").exists()
