"""Train a SimCSE sentence encoder.

python train.py --config configs/debug_tiny.yaml
accelerate launch train.py --config configs/unsup_bert_base_hcl.yaml --hcl_beta 0.2
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

import datasets
import torch
import transformers

from simcse_hn.cli.answers import answer_train
from simcse_hn.cli.train_end import final_dev_score, training_budget
from simcse_hn.configuration.command_line import TRAIN_SOURCE_REQUIRED
from simcse_hn.configuration.data_format import ResolvedData, resolve_data
from simcse_hn.configuration.parser import parse_args
from simcse_hn.configuration.resolved import resolve_run
from simcse_hn.data.collator import SimCSECollator, truncation_summary
from simcse_hn.data.guide import SELF, load_guide
from simcse_hn.data.pairs import PairCollator, is_hub_source, load_pairs, num_negatives
from simcse_hn.data.sentences import load_hub_dataset, load_sentence_stream, load_sentences
from simcse_hn.data.sts import dev_unreachable_line, load_dev_pairs
from simcse_hn.errors import ConfigError, DataError
from simcse_hn.evaluation.starting_point import own_pooling_start, start_summary
from simcse_hn.export.hub import CheckpointPush, HubError, HubTarget, find_token, push_to_hub
from simcse_hn.export.model_card import base_model_license, card_is_ours, write_model_card
from simcse_hn.files import CARD, source_record
from simcse_hn.losses.registry import flag_prefix, portable_loss_name
from simcse_hn.modeling.loading import (
    check_pooler,
    has_dropout,
    inference_max_length,
    load_encoder_config,
    load_tokenizer,
    model_max_length,
    resolve_packaged,
)
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.provenance import code_identity, command_line, data_sha256, invoked_as
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import (
    check_output_dir,
    checkpoint_run_id,
    claim_output_dir,
    new_run_id,
    resolve_resume,
)
from simcse_hn.training.process_exit import finish
from simcse_hn.training.resumed import check_resumed_objective, check_resumed_settings
from simcse_hn.training.trainer import SimCSETrainer

logger = logging.getLogger("simcse_hn.train")


def _setup_logging(training_args) -> None:
    level = logging.INFO if training_args.should_log else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, stream=sys.stdout)
    transformers.utils.logging.set_verbosity(logging.WARNING if level == logging.INFO else level)
    datasets.utils.logging.set_verbosity(logging.WARNING)
    logging.getLogger("simcse_hn").setLevel(level)
    # Quiet apart from the training progress bar and the metrics: no bars for loading weights or writing every
    # checkpoint's shards (transformers) or for preparing datasets.
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def _cpu_fallback(argv: list[str] | None) -> list[str]:
    """Under a multi-process launcher on a machine without a GPU, train on the CPU with gloo instead of failing."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available() and "--use_cpu" not in argv:
        argv += ["--use_cpu", "true"]
    return argv


def _prepare_output_dir(training_args, checkpoint: str | None) -> str:
    """Check and claim the output folder before any data or model is read; returns the run family's id (a resume
    keeps the checkpoint's, a fresh run gets a new one), the same on every process."""
    output_dir = training_args.output_dir
    check_output_dir(output_dir, resuming=checkpoint is not None, overwrite=training_args.overwrite_output_dir)
    if not training_args.overwrite_output_dir and not card_is_ours(output_dir):
        raise ConfigError(
            f"output_dir: {os.path.join(output_dir, CARD)} was not written by simcse-hn and the model card "
            "would replace it; move it away, or pass --overwrite_output_dir true"
        )
    run_id = checkpoint_run_id(checkpoint) if checkpoint is not None else new_run_id()
    run_id = distributed.broadcast_object(run_id)  # process 0's fresh id
    if training_args.should_save:  # the processes that write checkpoints (one per node with save_on_each_node)
        claim_output_dir(output_dir, run_id)
    return run_id


def run(argv: list[str] | None = None) -> SimCSETrainer:
    model_args, data_args, training_args = parse_args(_cpu_fallback(argv))
    _setup_logging(training_args)
    base_model = model_args.model_name_or_path  # as named: a packaged model's record is its Hub id
    model_args.model_name_or_path = resolve_packaged(base_model)
    logger.info("world size %d (process %d)", training_args.world_size, training_args.process_index)

    if data_args.train_source is None:
        raise ConfigError(TRAIN_SOURCE_REQUIRED)
    if training_args.push_to_hub and not training_args.hub_model_id:
        raise ConfigError("hub_model_id: required with push_to_hub (e.g. user/unsup-simcse-bert-base)")
    if training_args.push_to_hub and find_token(training_args.hub_token) is None:
        logger.warning("no Hugging Face token (HF_TOKEN or `hf auth login`): the model will be saved, not pushed")
    eval_pairs = load_dev_pairs(data_args.eval_file, data_args.eval_split, data_args.eval_optional)
    if eval_pairs is None and training_args.eval_strategy != "no":
        logger.warning("no STS-B dev pairs: STS-B dev evaluation and best-model selection are off")
        training_args = dataclasses.replace(
            training_args,
            eval_strategy="no",
            load_best_model_at_end=False,
            metric_for_best_model=None,
            eval_on_start=False,
        )
    # The Trainer never pushes and never holds the token (it pickles its arguments into every checkpoint): train.py
    # keeps the Hub settings and pushes the finished folder itself.
    hub_target = HubTarget.from_args(training_args) if training_args.push_to_hub else None
    training_args = dataclasses.replace(training_args, push_to_hub=False, hub_token=None)

    # The run as it will train: the data's format and columns (a table's header, a stream's first record; a Hub
    # dataset is loaded once, here) with every other setting, and the combinations that cannot work refused at once.
    hub_dataset = None
    if not data_args.streaming and is_hub_source(data_args.train_source):
        hub_dataset = load_hub_dataset(data_args.train_source, data_args.train_data_files, data_args.dataset_split,
                                       data_args.dataset_config_name)  # fmt: skip
    data = resolve_data(data_args, hub_dataset)
    resolve_run(data_args, training_args, data).check()

    # Everything else that can be known without data rows or weights, in the order a user would fix it.
    encoder_config = load_encoder_config(model_args.model_name_or_path)
    positions = model_max_length(encoder_config)
    if positions is not None and data_args.max_seq_length > positions:
        raise ConfigError(
            f"max_seq_length: {data_args.max_seq_length} is above the {positions} positions of "
            f"{model_args.model_name_or_path}"
        )
    check_pooler(encoder_config, model_args.pooler, model_args.model_name_or_path)
    noise = model_args.dropout if model_args.dropout is not None else has_dropout(encoder_config)
    if not noise and not (model_args.lora_r and model_args.lora_dropout):
        logger.warning("%s has no dropout: SimCSE's two views of a sentence are identical; pass --dropout 0.1",
                       model_args.model_name_or_path)
    loss_fn = training_args.build_loss()
    training_args.check_optimizer()
    guide_path = None  # a separate guide model: found before any data is read
    if training_args.guide_model not in (None, SELF):
        guide_path = resolve_packaged(training_args.guide_model, field="guide_model")
        load_encoder_config(guide_path, field="guide_model")
    topic_encoder = None  # the encoder that clusters the corpus for topic batches: found before any data is read
    if training_args.topic_batches and training_args.topic_encoder is not None:
        topic_encoder = resolve_packaged(training_args.topic_encoder, field="topic_encoder")
        load_encoder_config(topic_encoder, field="topic_encoder")
        training_args = dataclasses.replace(training_args, topic_encoder=topic_encoder)
    if model_args.tokenizer_name_or_path is not None:
        tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, field="tokenizer_name_or_path")
    else:
        tokenizer = load_tokenizer(model_args.model_name_or_path)
    checkpoint = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    if checkpoint is not None:
        check_resumed_objective(checkpoint, training_args.loss, training_args.objective.record())
        logger.info("resuming from %s", checkpoint)
    run_id = _prepare_output_dir(training_args, checkpoint)

    global_batch = training_args.per_device_train_batch_size * training_args.world_size
    data_seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    if data_args.streaming:  # single sentences (resolve_run refuses a streamed paired corpus)
        train_dataset = load_sentence_stream(
            data_args.train_source,
            data_args.text_column,
            data_args.train_data_files,
            data_args.max_train_samples,
            config_name=data_args.dataset_config_name,
            split=data_args.dataset_split,
            shuffle_buffer=data_args.streaming_shuffle_buffer,
            seed=data_seed,
            rank=training_args.process_index,
            world_size=training_args.world_size,
            min_sentences=global_batch,
        )
        data_format, count, unit = "sentences", "streamed", "sentences"
    else:
        train_dataset, data_format = load_training_data(data_args, data, hub_dataset)
        unit = "sentences" if data_format == "sentences" else "examples"
        count = len(train_dataset)
        if count < global_batch:
            raise DataError(
                f"{data_args.train_source}: {count} {unit}, fewer than one batch "
                f"({training_args.per_device_train_batch_size} x {training_args.world_size} processes)"
            )
        if training_args.topic_batches and training_args.topic_clusters > count:
            raise ConfigError(f"topic_clusters: {training_args.topic_clusters} clusters for {count} {unit}")
    dev = len(eval_pairs.scores) if eval_pairs else 0
    logger.info("%s training %s, %s STS dev pairs", count, unit, dev)
    guide = load_guide(guide_path) if guide_path is not None else None

    # the run's record (simcse_config.json, in every checkpoint): a resume must repeat what shapes batches and loss
    simcse_config = {
        "base_model": source_record(base_model),
        "base_model_license": base_model_license(model_args.model_name_or_path),
        "loss": portable_loss_name(training_args.loss),  # a resume must name the same objective
        "loss_kwargs": training_args.loss_kwargs(),
        "objective": training_args.objective.record(),  # its texts, for the card: never imported back
        "contrast_form": training_args.contrast_form,
        "max_seq_length": data_args.max_seq_length,
        "seed": training_args.seed,
        "train_file": source_record(data_args.train_source),
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "world_size": training_args.world_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "learning_rate": training_args.learning_rate,
        "run_id": run_id,  # marks every checkpoint as this run family's (simcse_hn.training.checkpoints)
        "train_data_sha256": training_data_sha256(data_args, train_dataset),  # simcse_hn.provenance
        "code": code_identity(),
        "command": command_line(invoked_as("train.py", "simcse-hn-train"), sys.argv[1:] if argv is None else argv),
    }
    if training_args.data_seed is not None:
        simcse_config["data_seed"] = training_args.data_seed
    if not data_args.streaming:  # the examples read: max_train_samples and drop_duplicates shape the corpus too
        simcse_config["train_examples"] = count
    if data_args.streaming:
        simcse_config["streaming"] = {"shuffle_buffer": data_args.streaming_shuffle_buffer}
    if data_args.word_repetition:
        simcse_config["word_repetition"] = data_args.word_repetition
    if model_args.lora_r is not None:  # the folder's weights are merged; the adapter is in adapter/
        target = model_args.lora_target_modules
        simcse_config["lora"] = {"r": model_args.lora_r, "alpha": model_args.lora_alpha,
                                 "dropout": model_args.lora_dropout, "target_modules": target}  # fmt: skip
    if data_format == "pairs":  # SimCSE's supervised targets: the unsupervised contrast form does not apply
        del simcse_config["contrast_form"]
        simcse_config.update(data_format="pairs", negatives_per_example=num_negatives(train_dataset),
                             hard_negative_weight=training_args.hard_negative_weight)  # fmt: skip
    if training_args.guide_model is not None:
        # by name only: a local guide by its folder's name, no path of this machine (files.source_record)
        simcse_config.update(guide_model=source_record(training_args.guide_model)["name"],
                             guide_margin=training_args.guide_margin)  # fmt: skip
    if training_args.topic_batches:
        simcse_config["topic_batches"] = {
            "clusters": training_args.topic_clusters, "share": training_args.topic_share,
            "encoder": source_record(topic_encoder)["name"] if topic_encoder else "the model being trained",
            "recluster_steps": training_args.topic_recluster_steps,
        }  # fmt: skip
    if training_args.queue_size:
        simcse_config["queue"] = {"size": training_args.queue_size, "momentum": training_args.momentum}
    if training_args.no_duplicates is not None or data_format == "pairs":
        simcse_config["no_duplicates"] = training_args.no_duplicates is not False
    if checkpoint is not None:  # before any model loads: one line naming a setting the resume would change
        cls = training_args.objective.cls
        flags = {key: f"{flag_prefix(cls)}_{key}" for key in training_args.loss_kwargs()} if flag_prefix(cls) else {}
        check_resumed_settings(checkpoint, simcse_config, flags)
    transformers.set_seed(training_args.seed)  # the MLP head and any new weights start the same in every run
    model = SimCSEModel.from_pretrained(
        model_args.model_name_or_path,
        pooler=model_args.pooler,
        mlp_only_train=model_args.mlp_only_train,
        dropout=model_args.dropout,
        dtype=torch.float32,  # master weights (a decoder's checkpoint is often bf16): --bf16 / --fp16 for autocast
    )
    if model_args.lora_r is not None:
        model.add_lora(model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout,
                       model_args.lora_target_modules)  # fmt: skip
    eval_max_length = data_args.eval_max_seq_length or model_max_length(model.config, tokenizer)
    own_start = None  # a sentence-transformers base model's STS-B dev score through its own modules
    if eval_pairs is not None and training_args.process_index == 0:
        own_start = own_pooling_start(model_args.model_name_or_path, base_model, eval_pairs, eval_max_length,
                                      str(training_args.device), training_args.per_device_eval_batch_size)  # fmt: skip
    inference_length = model_args.inference_max_seq_length or inference_max_length(
        model_args.model_name_or_path, model.config, tokenizer
    )
    simcse_config.update(eval_max_seq_length=eval_max_length, inference_max_seq_length=inference_length)
    guide_tokenize = guide.tokenize if guide is not None else None
    if data_format == "pairs":
        collator = PairCollator(tokenizer, data_args.max_seq_length, num_negatives(train_dataset), guide_tokenize)
    else:
        collator = SimCSECollator(tokenizer, data_args.max_seq_length, guide_tokenize=guide_tokenize,
                                  word_repetition=data_args.word_repetition, seed=data_seed)  # fmt: skip
    trainer = SimCSETrainer(
        model=model,
        args=training_args,
        loss_fn=loss_fn,
        eval_pairs=eval_pairs,
        eval_max_length=eval_max_length,
        simcse_config=simcse_config,
        train_dataset=train_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        guide=guide,
    )
    if hub_target is not None and hub_target.strategy == "every_save":
        trainer.add_callback(CheckpointPush(hub_target))
    trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.truncated_sentences:
        logger.warning("%s", truncation_summary(trainer.truncated_sentences, trainer.trained_sentences,
                                                data_args.max_seq_length))
    trainer.simcse_config.update(training_budget(trainer))  # the final folder says how much training it had
    trainer.save_model(training_args.output_dir)
    dev_spearman = final_dev_score(trainer) if eval_pairs is not None else None
    if dev_spearman is not None:
        before = next((e["eval_stsb_spearman"] for e in trainer.state.log_history if e.get("step") == 0
                       and "eval_stsb_spearman" in e), None)  # fmt: skip  (eval_on_start)
        for line in start_summary(model_args.pooler, dev_spearman, before, own_start, training_args.output_dir,
                                  base_model, data_args.eval_file):  # fmt: skip
            logger.info("%s", line)
    if trainer.is_world_process_zero():
        write_model_card(
            training_args.output_dir,
            repo_id=training_args.hub_model_id,
            dev_spearman=dev_spearman,
            overwrite=training_args.overwrite_output_dir,
        )
        if hub_target is not None:  # one push of the finished folder; SimCSETrainer never pushes by itself
            push_to_hub(training_args.output_dir, hub_target)
        if eval_pairs is None and data_args.eval_file is not None:  # eval_optional, and the Hub out of reach
            logger.warning("%s", dev_unreachable_line(data_args.eval_file))
    return trainer


def training_data_sha256(data_args, train_dataset) -> str | None:
    """The hash of the training data as read: the local file's bytes, else the Hub dataset's id and fingerprint
    (None for a stream, which has no fingerprint to hash)."""
    source = data_args.train_source
    if source is not None and os.path.exists(source):
        return data_sha256(source)
    if data_args.streaming:
        return data_sha256(f"{source}:{data_args.dataset_config_name}:{data_args.dataset_split}")
    return data_sha256(train_dataset)


def load_training_data(data_args, data: ResolvedData, dataset=None) -> tuple[datasets.Dataset, str]:
    """The training set in the format resolved (`data`, simcse_hn.configuration.data_format.resolve_data): single
    sentences (a `text` column, load_sentences as SimCSE reads them) or paired examples (`anchor`, `positive`,
    `negative_1..k`: simcse_hn.data.pairs, in the columns resolved). `dataset`: a Hub dataset's split, already
    loaded."""
    source = data_args.train_source
    hub = {"config_name": data_args.dataset_config_name, "split": data_args.dataset_split, "dataset": dataset}
    if data.format == "sentences":
        sentences = load_sentences(
            source,
            data_args.text_column,
            data_args.train_data_files,
            data_args.max_train_samples,
            data_args.drop_duplicates,
            **hub,
        )
        return datasets.Dataset.from_dict({"text": sentences}), data.format
    dataset = load_pairs(
        source,
        data_args.anchor_column,
        data_args.positive_column,
        data_args.negative_columns,
        data_args.train_data_files,
        data_args.max_train_samples,
        data_args.drop_duplicates,
        columns=data.columns,
        **hub,
    )
    return dataset, data.format


def main(argv: list[str] | None = None) -> int:
    """The run, after the front's answer (--help, or one error line for what is known before torch is imported)."""
    code = answer_train(argv)
    if code is not None:
        return code
    try:
        run(argv)
    except (ConfigError, DataError, HubError) as e:  # a HubError comes after the model is saved
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def console(argv: list[str] | None = None) -> None:
    """`simcse-hn-train`, `python train.py` and `accelerate launch train.py` (through cli.front.train, which answers
    before this module's imports when it can): main(), then the exit a launched process needs (not sys.exit:
    simcse_hn/training/process_exit.py)."""
    finish(main(argv))


if __name__ == "__main__":
    console()
