"""A training run in parts, each short enough to read on one screen, in the order `simcse_hn.cli.train.run` calls
them: check the settings, prepare the folder (its lock, the checkpoint to resume), load the data, record the run
(and compare the record with the resumed checkpoint's, before any model loads), load the model, build the trainer,
train, finish (save, card, push). `guarded()` holds the folder's lock for the run's whole life and turns a write the
disk refuses into one line."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys

import datasets
import torch
import transformers

from simcse_hn.cli.run_data import training_data_sha256, training_set
from simcse_hn.cli.train_end import final_dev_score, training_budget
from simcse_hn.configuration.command_line import TRAIN_SOURCE_REQUIRED
from simcse_hn.configuration.data_format import resolve_data
from simcse_hn.configuration.parser import parse_args
from simcse_hn.configuration.record import RunFacts, build_record
from simcse_hn.configuration.resolved import resolve_run
from simcse_hn.data.collator import SimCSECollator, truncation_summary
from simcse_hn.data.guide import SELF, load_guide
from simcse_hn.data.pairs import PairCollator, is_hub_source, num_negatives
from simcse_hn.data.sentences import load_hub_dataset
from simcse_hn.data.sts import dev_unreachable_line, load_dev_pairs
from simcse_hn.errors import ConfigError, DiskError, UserError, disk_problem
from simcse_hn.evaluation.starting_point import own_pooling_start, start_summary
from simcse_hn.export.hub import CheckpointPush, HubTarget, find_token, push_to_hub
from simcse_hn.export.model_card import base_model_license, card_is_ours, write_model_card
from simcse_hn.files import CARD, checkpoints_by_step
from simcse_hn.losses.registry import flag_prefix
from simcse_hn.modeling import loading
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.provenance import code_identity, command_line, invoked_as
from simcse_hn.run_record import Budget
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import (
    RESUME_LATEST,
    check_output_dir,
    checkpoint_problem,
    checkpoint_run_id,
    claim_output_dir,
    folder_entries,
    new_run_id,
    read_run_id,
    resolve_resume,
    resume_requested,
)
from simcse_hn.training.output_lock import OutputLock
from simcse_hn.training.resumed import check_resumed_objective, check_resumed_record
from simcse_hn.training.trainer import SimCSETrainer

logger = logging.getLogger("simcse_hn.train")


def setup_logging(training_args) -> None:
    level = logging.INFO if training_args.should_log else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, stream=sys.stdout)
    transformers.utils.logging.set_verbosity(logging.WARNING if level == logging.INFO else level)
    datasets.utils.logging.set_verbosity(logging.WARNING)
    logging.getLogger("simcse_hn").setLevel(level)
    # Quiet apart from the training progress bar and the metrics: no bars for loading weights or writing every
    # checkpoint's shards (transformers) or for preparing datasets.
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def cpu_fallback(argv: list[str] | None) -> list[str]:
    """Under a multi-process launcher on a machine without a GPU, train on the CPU with gloo instead of failing."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available() and "--use_cpu" not in argv:
        argv += ["--use_cpu", "true"]
    return argv


class RunBuilder:
    """One training run, from its arguments (`argv`, as the command line gives them) to the saved folder."""

    def __init__(self, argv: list[str] | None = None):
        self.argv = sys.argv[1:] if argv is None else argv  # as given: the record's command
        self.model_args, self.data_args, self.training_args = parse_args(cpu_fallback(argv))
        setup_logging(self.training_args)
        self.base_model = self.model_args.model_name_or_path  # as named: a packaged model's record is its Hub id
        self.model_args.model_name_or_path = loading.resolve_packaged(self.base_model)
        self.lock: OutputLock | None = None
        self.run_id: str | None = None
        self.checkpoint: str | None = None
        self.trainer: SimCSETrainer | None = None
        self.writing: str | None = None  # what the run writes now, outside the trainer's saves (a disk error says it)
        logger.info("world size %d (process %d)", self.training_args.world_size, self.training_args.process_index)

    @contextlib.contextmanager
    def guarded(self):
        """The run's life: the folder's lock is released at its end (the kernel releases it if the process dies), and
        a write the disk refuses is a DiskError naming the path, what was written and the last whole checkpoint."""
        try:
            yield self
        except (OSError, RuntimeError) as e:
            problem = disk_problem(e)
            if problem is None:
                raise
            raise self.disk_error(*problem) from None
        finally:
            if self.lock is not None:
                self.lock.release()

    # --- 1. the settings: what can be known without data rows or weights, in the order a user would fix it ---

    def check_settings(self) -> None:
        data_args, args = self.data_args, self.training_args
        if data_args.train_source is None:
            raise ConfigError(TRAIN_SOURCE_REQUIRED)
        if args.push_to_hub and not args.hub_model_id:
            raise ConfigError("hub_model_id: required with push_to_hub (e.g. user/unsup-simcse-bert-base)")
        if args.push_to_hub and find_token(args.hub_token) is None:
            logger.warning("no Hugging Face token (HF_TOKEN or `hf auth login`): the model will be saved, not pushed")
        self.eval_pairs = load_dev_pairs(data_args.eval_file, data_args.eval_split, data_args.eval_optional)
        if self.eval_pairs is None and args.eval_strategy != "no":
            logger.warning("no STS-B dev pairs: STS-B dev evaluation and best-model selection are off")
            off = {"load_best_model_at_end": False, "metric_for_best_model": None, "eval_on_start": False}
            args = dataclasses.replace(args, eval_strategy="no", **off)
        # The Trainer never pushes and never holds the token (it pickles its arguments into every checkpoint): the
        # builder keeps the Hub settings and pushes the finished folder itself.
        self.hub_target = HubTarget.from_args(args) if args.push_to_hub else None
        self.training_args = args = dataclasses.replace(args, push_to_hub=False, hub_token=None)
        # The run as it will train: the data's format and columns (a table's header, a stream's first record; a Hub
        # dataset is loaded once, here) with every other setting, and the combinations that cannot work refused.
        self.hub_dataset = None
        if not data_args.streaming and is_hub_source(data_args.train_source):
            self.hub_dataset = load_hub_dataset(
                data_args.train_source,
                data_args.train_data_files,
                data_args.dataset_split,
                data_args.dataset_config_name,
                field=data_args.train_source_field,
            )
        self.data = resolve_data(data_args, self.hub_dataset)
        resolve_run(data_args, args, self.data).check()
        self.check_model()

    def check_model(self) -> None:
        """The model, tokenizer, objective, optimizer, guide and topic encoder: found, not loaded."""
        model_args, data_args, args = self.model_args, self.data_args, self.training_args
        name = model_args.model_name_or_path
        self.encoder_config = loading.load_encoder_config(name)
        positions = loading.model_max_length(self.encoder_config)
        if positions is not None and data_args.max_seq_length > positions:
            raise ConfigError(
                f"max_seq_length: {data_args.max_seq_length} is above the {positions} positions of {name}"
            )
        loading.check_pooler(self.encoder_config, model_args.pooler, name)
        noise = model_args.dropout if model_args.dropout is not None else loading.has_dropout(self.encoder_config)
        if not noise and not (model_args.lora_r and model_args.lora_dropout):
            logger.warning(
                "%s has no dropout: SimCSE's two views of a sentence are identical; pass --dropout 0.1", name
            )
        self.loss_fn = args.build_loss()
        args.check_optimizer()
        self.guide_path = None  # a separate guide model: found before any data is read
        if args.guide_model not in (None, SELF):
            self.guide_path = loading.resolve_packaged(args.guide_model, field="guide_model")
            loading.load_encoder_config(self.guide_path, field="guide_model")
        self.topic_encoder = None  # the encoder that clusters the corpus for topic batches
        if args.topic_batches and args.topic_encoder is not None:
            self.topic_encoder = loading.resolve_packaged(args.topic_encoder, field="topic_encoder")
            loading.load_encoder_config(self.topic_encoder, field="topic_encoder")
            self.training_args = dataclasses.replace(args, topic_encoder=self.topic_encoder)
        if model_args.tokenizer_name_or_path is not None:
            self.tokenizer = loading.load_tokenizer(model_args.tokenizer_name_or_path, field="tokenizer_name_or_path")
        else:
            self.tokenizer = loading.load_tokenizer(name)

    # --- 2. the output folder: one writer, and the checkpoint a resume takes ---

    def prepare_folder(self) -> None:
        """Process 0 takes the folder's lock (training.output_lock) before anything is read or written there, then,
        holding it, chooses the checkpoint to resume, checks the folder and claims it for the run family; the other
        processes wait for its answer (the checkpoint and the run family, or its refusal, which they raise too)."""
        args = self.training_args
        answer: tuple[str | None, str] | UserError | None = None
        if args.process_index == 0:
            try:
                answer = self._claim_folder()
            except UserError as e:
                answer = e
        answer = distributed.broadcast_object(answer)
        if isinstance(answer, UserError):
            raise answer
        self.checkpoint, self.run_id = answer
        if args.should_save and args.process_index != 0:  # another node's writer (save_on_each_node)
            claim_output_dir(args.output_dir, self.run_id)

    def _claim_folder(self) -> tuple[str | None, str]:
        args, output_dir = self.training_args, self.training_args.output_dir
        resume = args.resume_from_checkpoint
        if read_run_id(output_dir) is None:  # nothing of simcse-hn's there: refused before anything is written there
            check_output_dir(output_dir, resuming=resume_requested(resume), overwrite=args.overwrite_output_dir)
            if resume_requested(resume) and resume.lower() in RESUME_LATEST and folder_entries(output_dir):
                resolve_resume(resume, output_dir)  # someone else's files, no simcse_run.json: refused, nothing read
        self.lock = OutputLock(output_dir)
        self.lock.acquire()
        checkpoint = resolve_resume(args.resume_from_checkpoint, output_dir)
        if checkpoint is not None:
            check_resumed_objective(checkpoint, args.loss, args.objective.record())
            logger.info("resuming from %s", checkpoint)
        check_output_dir(output_dir, resuming=checkpoint is not None, overwrite=args.overwrite_output_dir)
        if not args.overwrite_output_dir and not card_is_ours(output_dir):
            raise ConfigError(
                f"output_dir: {os.path.join(output_dir, CARD)} was not written by simcse-hn and the model card "
                "would replace it; move it away, or pass --overwrite_output_dir true"
            )
        run_id = checkpoint_run_id(checkpoint) if checkpoint is not None else new_run_id()
        claim_output_dir(output_dir, run_id)
        return checkpoint, run_id

    # --- 3. the data ---

    def load_data(self) -> None:
        data_args, args = self.data_args, self.training_args
        self.train_dataset, self.data_format, self.examples = training_set(
            data_args, args, self.data, self.hub_dataset
        )
        unit = "sentences" if self.data_format == "sentences" else "examples"
        dev = len(self.eval_pairs.scores) if self.eval_pairs else 0
        logger.info("%s training %s, %s STS dev pairs", self.examples or "streamed", unit, dev)
        self.guide = load_guide(self.guide_path) if self.guide_path is not None else None

    # --- 4. the record: built once; a resume compares it with the checkpoint's before any model loads ---

    def record_run(self) -> None:
        model_args, data_args, args = self.model_args, self.data_args, self.training_args
        name, config, tokenizer = model_args.model_name_or_path, self.encoder_config, self.tokenizer
        self.eval_max_length = data_args.eval_max_seq_length or loading.model_max_length(config, tokenizer)
        inference = model_args.inference_max_seq_length or loading.inference_max_length(name, config, tokenizer)
        pairs = self.data_format == "pairs"
        facts = RunFacts(
            base_model=self.base_model,
            data=dataclasses.replace(self.data, format=self.data_format),
            examples=self.examples,
            negatives_per_example=num_negatives(self.train_dataset) if pairs else None,
            train_sha256=training_data_sha256(data_args, self.train_dataset),
            weights=loading.weights_identity(name),
            architecture=getattr(config, "model_type", None),
            eval_max_seq_length=self.eval_max_length,
            inference_max_seq_length=inference,
            run_id=self.run_id,
            license=base_model_license(name),
            topic_encoder=self.topic_encoder,
            code=code_identity(),
            command=command_line(invoked_as("train.py", "simcse-hn-train"), self.argv),
            tokenizer_sha256=loading.tokenizer_sha256(tokenizer),
            guide_weights=loading.weights_identity(self.guide_path) if self.guide_path else None,
            topic_encoder_weights=loading.weights_identity(self.topic_encoder) if self.topic_encoder else None,
        )
        self.record = build_record(model_args, data_args, args, facts)
        if self.checkpoint is not None:  # one line naming a field the resume would change
            cls = args.objective.cls
            flags = {key: f"{flag_prefix(cls)}_{key}" for key in args.objective.options.as_dict()}
            self.record = check_resumed_record(
                self.checkpoint, self.record, flags if flag_prefix(cls) else {}, args.extend_schedule
            )

    # --- 5. the model ---

    def load_model(self) -> None:
        model_args, args = self.model_args, self.training_args
        transformers.set_seed(args.seed)  # the MLP head and any new weights start the same in every run
        self.model = SimCSEModel.from_pretrained(
            model_args.model_name_or_path,
            pooler=model_args.pooler,
            mlp_only_train=model_args.mlp_only_train,
            dropout=model_args.dropout,
            dtype=torch.float32,  # master weights (a decoder's checkpoint is often bf16): --bf16 / --fp16 for autocast
        )
        if model_args.lora_r is not None:
            self.model.add_lora(
                model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout, model_args.lora_target_modules
            )
        self.own_start = None  # a sentence-transformers base model's STS-B dev score through its own modules
        if self.eval_pairs is not None and args.process_index == 0:
            self.own_start = own_pooling_start(
                model_args.model_name_or_path,
                self.base_model,
                self.eval_pairs,
                self.eval_max_length,
                str(args.device),
                args.per_device_eval_batch_size,
            )

    # --- 6. the trainer ---

    def build_trainer(self) -> None:
        data_args = self.data_args
        guide_tokenize = self.guide.tokenize if self.guide is not None else None
        if self.data_format == "pairs":
            negatives = num_negatives(self.train_dataset)
            collator = PairCollator(self.tokenizer, data_args.max_seq_length, negatives, guide_tokenize)
        else:
            seed = (
                self.training_args.data_seed if self.training_args.data_seed is not None else self.training_args.seed
            )
            collator = SimCSECollator(
                self.tokenizer,
                data_args.max_seq_length,
                guide_tokenize=guide_tokenize,
                word_repetition=data_args.word_repetition,
                seed=seed,
            )
        self.trainer = SimCSETrainer(
            model=self.model,
            args=self.training_args,
            loss_fn=self.loss_fn,
            eval_pairs=self.eval_pairs,
            eval_max_length=self.eval_max_length,
            record=self.record,
            train_dataset=self.train_dataset,
            data_collator=collator,
            processing_class=self.tokenizer,
            guide=self.guide,
        )
        if self.hub_target is not None and self.hub_target.strategy == "every_save":
            self.trainer.add_callback(CheckpointPush(self.hub_target))

    # --- 7. training, and the finished folder ---

    def train(self) -> None:
        trainer = self.trainer
        trainer.train(resume_from_checkpoint=self.checkpoint)
        if trainer.truncated_sentences:
            length = self.data_args.max_seq_length
            logger.warning("%s", truncation_summary(trainer.truncated_sentences, trainer.trained_sentences, length))

    def finish(self) -> None:
        trainer, args, output_dir = self.trainer, self.training_args, self.training_args.output_dir
        trainer.record = dataclasses.replace(trainer.record, budget=Budget(**training_budget(trainer)))
        trainer.save_model(output_dir)
        trainer.saving.folder = None
        dev_spearman = final_dev_score(trainer) if self.eval_pairs is not None else None
        if dev_spearman is not None:
            before = next(
                (
                    e["eval_stsb_spearman"]
                    for e in trainer.state.log_history
                    if e.get("step") == 0 and "eval_stsb_spearman" in e
                ),
                None,
            )  # eval_on_start
            lines = start_summary(
                self.model_args.pooler,
                dev_spearman,
                before,
                self.own_start,
                output_dir,
                self.base_model,
                self.data_args.eval_file,
            )
            for line in lines:
                logger.info("%s", line)
        if trainer.is_world_process_zero():
            self.writing = f"{os.path.join(output_dir, CARD)} (the model card)"
            write_model_card(
                output_dir, repo_id=args.hub_model_id, dev_spearman=dev_spearman, overwrite=args.overwrite_output_dir
            )
            self.writing = None
            if self.hub_target is not None:  # one push of the finished folder; SimCSETrainer never pushes by itself
                push_to_hub(output_dir, self.hub_target)
            if self.eval_pairs is None and self.data_args.eval_file is not None:  # eval_optional, the Hub out of reach
                logger.warning("%s", dev_unreachable_line(self.data_args.eval_file))

    def disk_error(self, problem: str, file: str | None) -> DiskError:
        """One line: what the disk refused, the path being written, and the last whole checkpoint (intact)."""
        output_dir = self.training_args.output_dir
        saving = self.trainer.saving.folder if self.trainer is not None else None
        if saving is not None:
            what = (
                f"{saving} ({'a checkpoint' if os.path.basename(saving).startswith('checkpoint-') else 'the model'})"
            )
        else:
            what = self.writing or file or output_dir
        if file is not None and saving is not None:
            what += f", file {os.path.relpath(file, saving) if file.startswith(saving) else file}"
        whole = [
            path
            for _, path in checkpoints_by_step(output_dir)
            if self.run_id is not None and checkpoint_problem(path, self.run_id, verify_hashes=False) is None
        ]
        last = (
            f"the last whole checkpoint, {whole[-1]}, is intact" if whole else "no checkpoint of this run is whole yet"
        )
        return DiskError(
            f"output_dir: {problem} while writing {what}; {last}: make room (or make the folder "
            "writable) and resume with --resume_from_checkpoint true"
        )
