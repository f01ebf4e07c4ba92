"""SimCSETrainer: a `transformers.Trainer` whose step is one SimCSE forward over [a, a', b, b', ...] and a contrastive
loss (training.step), on the Trainer's public hooks and callbacks; the private methods it still overrides are listed,
each with its reason, in training.trainer_internals. Its batches are training.batches'; the modules that ask for
ranks are listed in training.distributed."""

from __future__ import annotations

import copy
import functools
import logging
import os

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from transformers import Trainer, TrainerState
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import TrainOutput

from simcse_hn.data.collator import GUIDE_PREFIX
from simcse_hn.data.guide import SELF, Guide, guide_row_embeddings, load_guide
from simcse_hn.data.sts import STSPairs
from simcse_hn.evaluation.dev_sentences import DevSentences
from simcse_hn.evaluation.encoding import simcse_encode_fn
from simcse_hn.losses import ContrastiveLoss
from simcse_hn.losses.targets import RowLayout
from simcse_hn.run_record import RunRecord
from simcse_hn.training import callbacks, checkpoints, distributed, grad_cache
from simcse_hn.training.batches import TrainingBatches
from simcse_hn.training.queue import QueueCallback, QueueRun, resume_queue
from simcse_hn.training.step import add_to_window, contrastive_loss, take_nonfinite_grads, window_means
from simcse_hn.training.trainer_internals import check_trainer_internals, reached_planned_steps

logger = logging.getLogger(__name__)


class SimCSETrainer(Trainer):
    """Trainer for `SimCSEModel` with a `ContrastiveLoss`.

    * compute_loss: embeddings (2B, D) -> `contrastive_loss` (gathered candidates, targets, context) -> loss; the loss
      diagnostics are averaged over the logging window and over processes before `log()`. With
      `cache_minibatch_size`, compute_loss is a GradCache loss (grad_cache.py): the Trainer's own training_step runs
      unchanged, and its backward replays the mini-batches (same loss and gradient, one mini-batch's memory).
    * STS-B dev through the Trainer's evaluation loop (DevSentences: `prediction_step` returns embeddings,
      `compute_metrics` the Spearman x 100 `eval_stsb_spearman`): logging and best-model selection are the Trainer's.
    * The Trainer never pushes: train.py pushes the finished folder itself (simcse_hn.export.hub).
    * Paired data: `group_size` (default: the collator's, simcse_hn.data.pairs.PairCollator) says that rows come as
      [a, p, n_1..n_k] per example; `args.hard_negative_weight` applies. `args.guide_model` ("self", or a model that
      `guide` holds, loaded from the id when not given) removes the guide's false negatives each step.
    * The training batches (no duplicates, topic batches, a stream): training.batches.TrainingBatches.
    * Checkpoints: `save_total_limit` rotates this run's checkpoints only (callbacks.RotateCheckpoints); the Trainer
      itself is given the arguments without it, since its rotation would delete any `checkpoint-*` folder.
    """

    def __init__(
        self,
        model,
        args,
        loss_fn: ContrastiveLoss,
        eval_pairs: STSPairs | None = None,
        eval_max_length: int | None = None,
        record: RunRecord | None = None,
        group_size: int | None = None,
        guide: Guide | None = None,
        **kwargs,
    ):
        model.loss_fn = loss_fn  # a submodule: learned loss parameters train, loss state is checkpointed
        # the loss is a per-batch mean, so the Trainer must divide it by the accumulation steps: the model attribute
        # every 5.x Trainer reads for that (its class attribute `loss_is_scaled_for_ga` is newer than 5.17)
        model.accepts_loss_kwargs = False
        collated = getattr(kwargs.get("data_collator"), "group_size", None)
        if group_size is not None and collated is not None and group_size != collated:
            raise ValueError(f"group_size {group_size} differs from the collator's {collated}")
        self.layout = RowLayout(group_size if group_size is not None else collated)  # how the batches' rows go
        self.eval_pairs, self.eval_max_length = eval_pairs, eval_max_length
        if eval_pairs is not None:
            self._dev = DevSentences(eval_pairs, kwargs["processing_class"], eval_max_length)
            kwargs.setdefault("eval_dataset", self._dev.dataset)
            kwargs.setdefault("compute_metrics", self._dev.metrics)
        check_trainer_internals()
        limit, args = args.save_total_limit, copy.copy(args)
        args.save_total_limit = None  # the Trainer's rotation is off: RotateCheckpoints rotates this run's only
        super().__init__(model=model, args=args, **kwargs)
        self.record = record  # simcse_config.json of every checkpoint and of the folder (train.py builds it)
        self.trained_sentences = 0  # sentences of the batches this process trained on (resumed runs: since resuming)
        self.truncated_sentences = 0  # of those, how many were longer than max_seq_length
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_count = 0
        scaler = getattr(self.accelerator, "scaler", None) is not None
        self.gradient_guard = callbacks.NonFiniteGradientGuard(sharded=self.is_fsdp_enabled, scaler_skips=scaler)
        self.batches = TrainingBatches(args, self.layout.paired, self._encode_with_model)
        self.run_id = record.run_id if record is not None else checkpoints.new_run_id()  # every checkpoint's family
        self.rotation = callbacks.RotateCheckpoints(limit, self.run_id)
        self.saving = callbacks.SavingNow()  # which folder is being written (a disk error names it)
        callbacks.name_progress_bars(self)
        self.clamped = callbacks.ClampedBatches.for_loss(loss_fn, callbacks.debiasing_setting(args))
        self.queue = QueueRun.for_run(args, self.layout.group_size)  # earlier steps' embeddings as negatives, or None
        queued = [QueueCallback(self.queue)] if self.queue is not None else []
        # each checkpoint's parts, then its manifest, written last; rotation (and train.py's push) after it
        commit = checkpoints.CheckpointCommit([self.batches] + [self.queue] * (self.queue is not None))
        clamp_warning = callbacks.ClampWarningCallback(self.clamped)
        callbacks_in_order = (self.gradient_guard, clamp_warning, self.batches, *queued, commit)
        for callback in (*callbacks_in_order, self.rotation, self.saving):
            self.add_callback(callback)
        self.guide = None
        if args.guide_model not in (None, SELF):
            self.guide = (guide if guide is not None else load_guide(args.guide_model)).to(args.device)
        if hasattr(self.model, "length_groups"):  # a SimCSEModel (tests may train other modules)
            self.model.length_groups = args.forward_length_groups()
        sharded = self.is_fsdp_enabled or self.is_deepspeed_enabled
        distributed.warn_if_unsharded(args.sharding_engine(), sharded, args.device.type)

    def step_loss(self, model, embeddings, head_inputs=None, text_ids=None, guide_embeddings=None, inputs=None):
        """A step's loss (`contrastive_loss`); in training with a queue, the batch's entries (from `inputs`, the model
        inputs) are handed to the queue first, which enqueues them after the optimizer step (QueueCallback)."""
        if self.queue is not None and model.training:
            bare = self.accelerator.unwrap_model(model)  # the momentum encoder copies the model, not its wrapper
            self.queue.remember(bare, inputs, embeddings, head_inputs, text_ids, guide_embeddings)
        return self.contrastive_loss(model, embeddings, head_inputs, text_ids, guide_embeddings)

    def contrastive_loss(self, model, embeddings, head_inputs=None, text_ids=None, guide_embeddings=None):
        """Loss of local embeddings (R, D) against the (gathered) candidates and the queue (step.contrastive_loss).
        With `guide_model: self` the guide's embeddings are these, detached; an external guide's (R, E) given."""
        args = self.args
        queue = self.queue.entries() if self.queue is not None and model.training else None
        if args.guide_model == SELF:
            guide_embeddings = embeddings.detach()
        return contrastive_loss(
            self.accelerator.unwrap_model(model).loss_fn, embeddings, form=args.contrast_form,
            group_size=self.layout.group_size, hard_negative_weight=args.hard_negative_weight,
            guide_embeddings=guide_embeddings, guide_margin=args.guide_margin, head_inputs=head_inputs,
            gather=self.args.gathers, step=self.state.global_step, max_steps=self.state.max_steps,
            text_ids=text_ids, queue=queue,
        )  # fmt: skip

    def _guide_embeddings(self, guide_inputs: dict[str, Tensor]) -> Tensor | None:
        """The external guide's embeddings (R, E) of the batch's rows (guide_row_embeddings); None without one."""
        return None if self.guide is None else guide_row_embeddings(self.guide, guide_inputs, self.layout)

    def _embed(self, model, inputs):
        """-> embeddings (2B, D), head inputs (2B, H) when the loss needs them, else None"""
        loss_fn: ContrastiveLoss = self.accelerator.unwrap_model(model).loss_fn
        output = model(**inputs, return_head_inputs=loss_fn.needs_head_inputs)
        return output.embeddings, output.head_inputs

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's total gradient norm of each optimizer step, handed to the non-finite guard
        (PRIVATE_TRAINER_OVERRIDES). A Trainer that stops calling this leaves the guard its own pass."""
        self.gradient_guard.total_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        return self.gradient_guard.total_norm

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        truncated = inputs.pop("num_truncated", 0)  # the collator's count for this batch (an int: no host sync)
        text_ids = inputs.pop("text_ids", None)  # (R,) for the duplicate diagnostics
        guide_inputs = {key: inputs[key] for key in inputs if key.startswith(GUIDE_PREFIX)}
        inputs = {key: value for key, value in inputs.items() if key not in guide_inputs}
        rows, group = inputs["input_ids"].shape[0], self.layout.rows_per_example
        if model.training:
            self.trained_sentences += self.layout.texts(rows)
            self.truncated_sentences += truncated
        guide_embeddings = self._guide_embeddings(guide_inputs) if model.training else None
        sentences = self.args.cache_minibatch_size  # examples (sentences, or groups of paired rows) per mini-batch
        if model.training and sentences is not None and group * sentences < rows:
            result = grad_cache.cached_loss(
                model,
                grad_cache.split_groups(inputs, sentences, group),
                embed=self._embed,
                loss_fn=functools.partial(self.step_loss, model, text_ids=text_ids,
                                          guide_embeddings=guide_embeddings, inputs=inputs),  # fmt: skip
                no_sync=functools.partial(self.accelerator.no_sync, model),
                autocast=self.compute_loss_context_manager,
                loss_parameters=list(self.accelerator.unwrap_model(model).loss_fn.parameters()),
            )
        else:
            result = self.step_loss(model, *self._embed(model, inputs), text_ids=text_ids,
                                           guide_embeddings=guide_embeddings, inputs=inputs)  # fmt: skip
        if model.training:
            add_to_window(self._metric_sums, result.metrics)
            self._metric_count += 1
            self.clamped.see(result.metrics, self.state.global_step + 1)
        return (result.loss, result) if return_outputs else result.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metric_count:  # a training log: the window's diagnostics join it
            logs.update(window_means(self._metric_sums, self._metric_count))
            logs["skipped_steps"] = self.gradient_guard.skipped_steps  # resumed runs: since resuming
            logs.update(take_nonfinite_grads(self.model.loss_fn, self.state.global_step))
            self._metric_sums.clear()
            self._metric_count = 0
        super().log(logs, start_time)

    # --- the training batches: training.batches ---

    def get_train_dataloader(self):
        loader = self.batches.loader(self.train_dataset, self.data_collator, self.accelerator)
        return loader if loader is not None else super().get_train_dataloader()

    def _encode_with_model(self):
        """An encoder of texts by the model as it is now (topic clustering), with a bar naming it."""
        tokenizer = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        model, length = self.accelerator.unwrap_model(self.model), getattr(self.data_collator, "max_length", None)
        bar = "topic batches: encoding the corpus with the model being trained"
        return simcse_encode_fn(model, tokenizer, max_length=length, show_progress_bar=bar)

    # --- evaluation: STS-B dev Spearman x 100, through the Trainer's loop ---

    def get_eval_dataloader(self, eval_dataset=None):
        """The dev sentences (DevSentences.loader), unless another dataset is asked for."""
        if self.eval_pairs is None or (eval_dataset is not None and eval_dataset is not self._dev.dataset):
            return super().get_eval_dataloader(eval_dataset)
        args = self.args
        return self.accelerator.prepare(self._dev.loader(args.eval_batch_size, args.dataloader_num_workers,
                                                         args.dataloader_pin_memory))  # fmt: skip

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """-> (no loss, embeddings (b, D) float32, the sentences' indices (b,))"""
        if self.eval_pairs is None:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        index = inputs.pop("sentence_index")
        inputs = {key: value.to(self.args.device) for key, value in inputs.items()}  # token ids: no dtype to cast
        with torch.no_grad(), self.compute_loss_context_manager():
            embeddings = model(**inputs).embeddings.float()
        return None, embeddings, index.to(embeddings.device)

    # --- saving and loading: transformers + sentence-transformers folder, plus head and loss state ---

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The folder of SimCSEModel.save_pretrained (transformers and sentence-transformers files, head, loss state)
        and training_args.bin, written by the saving process; the Trainer's checkpoints come here too. A model that
        FSDP or DeepSpeed holds is gathered first, every process joining, so every saved folder is a complete model
        (with FSDP's SHARDED_STATE_DICT the Trainer itself would write none: its checkpoints resume from
        pytorch_model_fsdp_0/). A model never prepared (a run that only finishes its save) is saved from its own,
        whole, parameters."""
        state_dict = None
        if self._is_sharded():
            try:
                state_dict = self.accelerator.get_state_dict(self.model_wrapped)
            except ValueError:  # ZeRO-3 without gathered weights
                raise RuntimeError("no weights to save: DeepSpeed ZeRO-3 needs "
                                   "stage3_gather_16bit_weights_on_model_save") from None  # fmt: skip
        if not self.args.should_save:
            return
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        self.saving.folder = output_dir
        config = checkpoints.saved_config(self.record, self.run_id)
        self.accelerator.unwrap_model(self.model).save_pretrained(
            output_dir, tokenizer=self.processing_class, extra_config=config, state_dict=state_dict
        )
        args = checkpoints.args_for_disk(self.args, self.rotation.limit)
        torch.save(args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _is_sharded(self) -> bool:
        """Whether FSDP or DeepSpeed holds the model's parameters now (the training loop wrapped the model)."""
        if self.is_deepspeed_enabled:
            return self.model_wrapped is not self.model  # the DeepSpeed engine, once prepared
        if self.is_fsdp_enabled:
            return isinstance(self.model, (FSDPModule, FullyShardedDataParallel))
        return False

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Resume: the Trainer's FSDP loader for a sharded model (the checkpoint's pytorch_model_fsdp* files, which
        the Trainer wrote with the optimizer state); otherwise the saved folder's own files. (DeepSpeed resumes
        through its own checkpoint, global_step*/, without this method.)"""
        if self._is_sharded():
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        else:
            self.accelerator.unwrap_model(model or self.model).load_weights(resume_from_checkpoint)

    def _load_best_model(self) -> None:
        """The Trainer's DeepSpeed and FSDP loaders when the model is sharded; otherwise the saved folder's files."""
        if self._is_sharded():
            return super()._load_best_model()
        logger.info("loading best model from %s (score %s)", self.state.best_model_checkpoint, self.state.best_metric)
        self.accelerator.unwrap_model(self.model).load_weights(self.state.best_model_checkpoint)

    # --- resuming a run that already ended ---

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        self.batches.resume(resume_from_checkpoint)
        resume_queue(self.queue, resume_from_checkpoint, self.args.device)
        at_end = isinstance(resume_from_checkpoint, str) and reached_planned_steps(
            self.args, resume_from_checkpoint, self.get_train_dataloader
        )
        if at_end:
            return self._finish_from_checkpoint(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _finish_from_checkpoint(self, checkpoint: str) -> TrainOutput:
        """A run killed after its last checkpoint (e.g. during the final save): the Trainer, which checks for the end
        only after a step, would train one step more. Take the checkpoint's weights and state and end as training
        ends (the best checkpoint's weights with load_best_model_at_end), without a step."""
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, checkpoints.TRAINER_STATE))
        logger.info("%s already reached step %d: finishing the save only", checkpoint, self.state.global_step)
        self._load_from_checkpoint(checkpoint)
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and os.path.isdir(best):
            self._load_best_model()
        self.rotation.keep_only_the_best(self.args, self.state)
        losses = [entry["loss"] for entry in self.state.log_history if "loss" in entry]
        return TrainOutput(self.state.global_step, losses[-1] if losses else float("nan"), {})
