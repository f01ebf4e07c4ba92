"""SimCSETrainer: a `transformers.Trainer` whose step is one SimCSE forward over [a, a', b, b', ...] and a
contrastive loss. The only place besides distributed.py that knows about ranks."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os

import datasets
import torch
from torch import Tensor
from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from simcse_hn import distributed, grad_cache
from simcse_hn.callbacks import ClampWarningCallback
from simcse_hn.checkpoints import TRAINER_STATE, new_run_id, rotate_checkpoints
from simcse_hn.data import STSPairs
from simcse_hn.evaluation import sts_dev_metrics
from simcse_hn.losses import ContrastiveLoss, LossOutput
from simcse_hn.targets import LossContext, build_targets

logger = logging.getLogger(__name__)


def contrastive_loss(
    loss_fn: ContrastiveLoss,
    embeddings: Tensor,
    *,
    form: str = "symmetric",
    head_inputs: Tensor | None = None,
    gather: bool = True,
    step: int | None = None,
    max_steps: int | None = None,
    text_ids: Tensor | None = None,
) -> LossOutput:
    """One SimCSE step's loss: local rows [a, a', b, b', ...] (2B, D) -> candidates gathered from every process with
    gradient (when `gather` and there is more than one process), targets offset by rank, the loss context.

    Each process averages over its own anchors and DDP averages gradients over processes, so W processes give exactly
    the gradient of one process on the global batch. head_inputs (2B, H): the MLP head's inputs (UnReMix);
    text_ids (2B,): each row's text id (the duplicate diagnostics).
    """
    candidates, candidate_features, candidate_ids, offset = embeddings, head_inputs, text_ids, 0
    several = distributed.world_size() > 1
    if gather and several:
        candidates = distributed.all_gather_with_grad(embeddings)  # (2BW, D)
        if head_inputs is not None:
            candidate_features = distributed.all_gather_with_grad(head_inputs)  # (2BW, H)
        if text_ids is not None:
            candidate_ids = distributed.all_gather_no_grad(text_ids)  # (2BW,)
        offset = distributed.rank() * embeddings.shape[0]
    targets = build_targets(embeddings.shape[0], form, offset, candidates.shape[0], embeddings.device)
    context = LossContext(
        step=step,
        max_steps=max_steps,
        # every process fits the same ProGCL mixture, from all processes' pairs
        all_reduce=distributed.all_reduce_sum if several else None,
        candidate_features=candidate_features,
        candidate_text_ids=None if candidate_ids is None else candidate_ids.to(embeddings.device),
    )
    return loss_fn.compute(candidates, targets, context)


class _NonFiniteGradientGuard(TrainerCallback):
    """Skips the optimizer step when any gradient is NaN/inf (e.g. an fp16 overflow in the encoder): gradients are
    dropped (`grad = None`, so the optimizer leaves those weights and their moments alone) and the skip is counted.
    Under DDP gradients are already all-reduced, so every process takes the same decision; under FSDP the processes
    agree through one all-reduce of the verdict."""

    def __init__(self, trainer: SimCSETrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if getattr(self.trainer.accelerator, "scaler", None) is not None:
            return  # fp16 with a GradScaler: the scaler already skips non-finite steps (and needs the gradients)
        # under FSDP each process holds a shard of every gradient (a DTensor's local part, or a flat shard): the
        # processes decide together. Under DeepSpeed the gradients live in its optimizer (p.grad is None): its own.
        sharded = self.trainer.is_fsdp_enabled
        grads = [p.grad for p in self.trainer.model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if not grads and not sharded:
            return
        bad = torch.stack([(~torch.isfinite(g)).any() for g in grads]).any() if grads else torch.tensor(False)
        if sharded:
            bad = distributed.all_reduce_sum(bad.float().to(args.device)) > 0
        if bool(bad):  # one host synchronisation per optimizer step, outside the loss
            for p in self.trainer.model.parameters():
                p.grad = None
            self.trainer.skipped_steps += 1
            logger.warning(
                "step %d: non-finite gradients, optimizer step skipped (%d so far)",
                state.global_step + 1,
                self.trainer.skipped_steps,
            )


class SimCSETrainer(Trainer):
    """Trainer for `SimCSEModel` with a `ContrastiveLoss`.

    * compute_loss: embeddings (2B, D) -> `contrastive_loss` (gathered candidates, targets, context) -> loss; the loss
      diagnostics are averaged over the logging window and over processes before `log()`. With
      `cache_minibatch_size`, compute_loss is a GradCache loss (grad_cache.py): the Trainer's own training_step runs
      unchanged, and its backward replays the mini-batches (same loss and gradient, one mini-batch's memory).
    * STS-B dev through the Trainer's evaluation loop: `eval_pairs`' distinct sentences, sorted by token length, are
      the eval dataset (split across processes, `per_device_eval_batch_size` per batch), `prediction_step` returns
      their embeddings and `compute_metrics` the Spearman x 100 of the pairs' cosines (`eval_stsb_spearman`), so
      logging, callbacks and best-model selection are the Trainer's.
    * The Trainer never pushes: train.py gives it arguments without push_to_hub and without the token, and pushes the
      finished folder itself (simcse_hn.hub).
    """

    loss_is_scaled_for_ga = False  # the loss is a per-batch mean: the Trainer divides it by the accumulation steps

    def __init__(
        self,
        model,
        args,
        loss_fn: ContrastiveLoss,
        eval_pairs: STSPairs | None = None,
        eval_max_length: int | None = None,
        simcse_config: dict | None = None,
        **kwargs,
    ):
        model.loss_fn = loss_fn  # a submodule: learned loss parameters train, loss state is checkpointed
        self.eval_pairs = eval_pairs
        self.eval_max_length = eval_max_length
        if eval_pairs is not None:
            self._dev = DevSentences(eval_pairs, kwargs["processing_class"], eval_max_length)
            kwargs.setdefault("eval_dataset", self._dev.dataset)
            kwargs.setdefault("compute_metrics", self._dev.metrics)
        super().__init__(model=model, args=args, **kwargs)
        self.simcse_config = simcse_config or {}
        self.skipped_steps = 0
        self.trained_sentences = 0  # sentences of the batches this process trained on (resumed runs: since resuming)
        self.truncated_sentences = 0  # of those, how many were longer than max_seq_length
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_count = 0
        self.add_callback(_NonFiniteGradientGuard(self))
        self.add_callback(ClampWarningCallback())
        requested = args.sharding_engine()  # what the configuration asked for; accelerate decides what runs
        if requested and not (self.is_fsdp_enabled or self.is_deepspeed_enabled):
            logger.warning(
                "%s was requested, but accelerate runs it on GPUs (or other accelerators) only: this run on %s is "
                "plain data parallel (same results, unsharded memory)", requested, args.device.type
            )

    @property
    def gather_across_devices(self) -> bool:
        flag = self.args.gather_across_devices
        return distributed.world_size() > 1 if flag is None else flag

    def contrastive_loss(self, model, embeddings, head_inputs=None, text_ids=None) -> LossOutput:
        """Loss of local embeddings (2B, D) against the (gathered) candidates (`contrastive_loss` above)."""
        return contrastive_loss(
            self.accelerator.unwrap_model(model).loss_fn,
            embeddings,
            form=self.args.contrast_form,
            head_inputs=head_inputs,
            gather=self.gather_across_devices,
            step=self.state.global_step,
            max_steps=self.state.max_steps,
            text_ids=text_ids,
        )

    def _embed(self, model, inputs):
        """-> embeddings (2B, D), head inputs (2B, H) when the loss needs them, else None"""
        needs_features = getattr(self.accelerator.unwrap_model(model).loss_fn, "needs_head_inputs", False)
        output = model(**inputs, return_head_inputs=needs_features)
        return output.embeddings, output.head_inputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        truncated = inputs.pop("num_truncated", 0)  # the collator's count for this batch (an int: no host sync)
        text_ids = inputs.pop("text_ids", None)  # (2B,) for the duplicate diagnostics
        if model.training:
            self.trained_sentences += inputs["input_ids"].shape[0] // 2
            self.truncated_sentences += truncated
        sentences = self.args.cache_minibatch_size
        if model.training and sentences is not None and 2 * sentences < inputs["input_ids"].shape[0]:
            result = grad_cache.cached_loss(
                model,
                grad_cache.split_pairs(inputs, sentences),
                embed=self._embed,
                loss_fn=functools.partial(self.contrastive_loss, model, text_ids=text_ids),
                no_sync=functools.partial(self.accelerator.no_sync, model),
                autocast=self.compute_loss_context_manager,
                loss_parameters=list(self.accelerator.unwrap_model(model).loss_fn.parameters()),
            )
        else:
            result = self.contrastive_loss(model, *self._embed(model, inputs), text_ids=text_ids)
        if model.training:
            self._record_metrics(result.metrics)
        return (result.loss, result) if return_outputs else result.loss

    def _record_metrics(self, metrics: dict[str, torch.Tensor]) -> None:
        for key, value in metrics.items():  # tensors until log(): no host synchronisation in the step
            value = value.detach().float()
            self._metric_sums[key] = self._metric_sums[key] + value if key in self._metric_sums else value
        self._metric_count += 1

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metric_count:
            keys = sorted(self._metric_sums)
            # every process logs at the same steps: one all-reduce averages the window over processes too
            totals = distributed.all_reduce_sum(torch.stack([self._metric_sums[k] for k in keys]))
            counts = distributed.all_reduce_sum(torch.tensor(float(self._metric_count), device=totals.device))
            means = dict(zip(keys, (totals / counts).tolist()))
            pairs, total = means.pop("duplicate_pairs", 0.0), means.pop("duplicate_weight_total", 0.0)
            if pairs > 0:  # the mean weight of an anchor's exact duplicates, in the windows that had any
                means["duplicate_weight"] = total / pairs
            for key, value in means.items():
                logs[key] = round(value, 6)
            logs["skipped_steps"] = self.skipped_steps
            self._metric_sums.clear()
            self._metric_count = 0
        super().log(logs, start_time)

    def get_train_dataloader(self):
        """A streamed corpus (a datasets.IterableDataset, data.load_sentence_stream) is already this process's share
        (split_dataset_by_node): its batches on this process's device, without accelerate's re-sharding or its
        dispatching from process 0. Resuming, the Trainer skips the batches already trained on (read again, not
        trained on), so the run goes on with the sentences an uninterrupted run would see next."""
        if not isinstance(self.train_dataset, datasets.IterableDataset):
            return super().get_train_dataloader()
        from accelerate.data_loader import prepare_data_loader

        loader = torch.utils.data.DataLoader(
            self.train_dataset,
            batch_size=self._train_batch_size,
            collate_fn=self.data_collator,
            drop_last=self.args.dataloader_drop_last,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return prepare_data_loader(loader, self.args.device, num_processes=1, process_index=0, put_on_device=True,
                                   dispatch_batches=False)  # fmt: skip

    # --- evaluation: STS-B dev Spearman x 100, through the Trainer's loop ---

    def get_eval_dataloader(self, eval_dataset=None):
        """The dev sentences in order (already sorted by token length), every one of them: the training arguments'
        `dataloader_drop_last`, which the Trainer would apply here too, is for training batches only."""
        if self.eval_pairs is None or (eval_dataset is not None and eval_dataset is not self._dev.dataset):
            return super().get_eval_dataloader(eval_dataset)
        loader = torch.utils.data.DataLoader(
            self._dev.dataset,
            batch_size=self.args.eval_batch_size,
            collate_fn=self._dev.collate,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """-> (no loss, embeddings (b, D) float32, the sentences' indices (b,))"""
        if self.eval_pairs is None:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        index = inputs.pop("sentence_index")
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            embeddings = model(**inputs).embeddings.float()
        return None, embeddings, index.to(embeddings.device)

    # --- saving and loading: transformers + sentence-transformers folder, plus head and loss state ---

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's: under FSDP (FULL_STATE_DICT) and DeepSpeed it gathers the weights on the saving process and
        hands them to `_save`. With FSDP's SHARDED_STATE_DICT the Trainer writes no model (its checkpoints resume
        from pytorch_model_fsdp_0/): the weights are gathered here too, so every saved folder is a complete model.
        A model never prepared (a run that only finishes its save) is saved from its own, whole, parameters."""
        if not self._is_sharded():
            self._save(output_dir)
        elif self.is_fsdp_enabled and "FULL_STATE_DICT" not in str(self.accelerator.state.fsdp_plugin.state_dict_type):
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))  # every process joins
        else:
            super().save_model(output_dir, _internal_call)

    def _is_sharded(self) -> bool:
        """Whether FSDP or DeepSpeed holds the model's parameters now (the training loop wrapped the model)."""
        if self.is_deepspeed_enabled:
            return self.deepspeed is not None
        if self.is_fsdp_enabled:
            from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

            return isinstance(self.model, (FSDPModule, FullyShardedDataParallel))
        return False

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """`state_dict`: the whole model's weights as the Trainer gathered them (FSDP, DeepSpeed; on the saving
        process), or None: the model's own parameters."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        if state_dict is not None and not state_dict:  # the Trainer's ZeRO-3 fallback without gathered weights
            raise RuntimeError("no weights to save: DeepSpeed ZeRO-3 needs stage3_gather_16bit_weights_on_model_save")
        model = self.accelerator.unwrap_model(self.model)
        model.save_pretrained(
            output_dir, tokenizer=self.processing_class, extra_config=self.simcse_config, state_dict=state_dict
        )
        torch.save(self._args_for_disk(), os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _args_for_disk(self):
        """The arguments pickled into a saved folder (training_args.bin): never a token (train.py keeps the Hub token
        from the Trainer; this covers a Trainer built elsewhere), and the configured save_total_limit, which
        `_rotation_of_this_run` hides from the Trainer while a checkpoint is written."""
        args = copy.copy(self.args)
        args.save_total_limit = getattr(self, "_configured_save_total_limit", args.save_total_limit)
        for name in [f.name for f in dataclasses.fields(args) if f.name.endswith("_token")]:
            setattr(args, name, None)
        return args

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

    # --- checkpoints of this run family only (simcse_hn.checkpoints); resuming a run that already ended ---

    @property
    def run_id(self) -> str:
        """The run family recorded in every checkpoint (simcse_config.json); train.py passes the output folder's."""
        return self.simcse_config.setdefault("run_id", new_run_id())

    @contextlib.contextmanager
    def _rotation_of_this_run(self):
        """transformers deletes any `checkpoint-*` folder of output_dir beyond save_total_limit, whoever wrote it:
        hide the limit from it, and rotate this run family's checkpoints only."""
        limit = self._configured_save_total_limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            yield limit
        finally:
            self.args.save_total_limit = limit

    def _save_checkpoint(self, model, trial) -> None:
        run_id = self.run_id  # before the first save writes simcse_config.json
        with self._rotation_of_this_run() as limit:
            super()._save_checkpoint(model, trial)
        if self.args.should_save:
            run_dir = self._get_output_dir(trial)
            written = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            rotate_checkpoints(run_dir, run_id, limit, {written, self.state.best_model_checkpoint})

    def _finalize_training(self, trial, num_train_samples, start_time):
        with self._rotation_of_this_run() as limit:
            output = super()._finalize_training(trial, num_train_samples, start_time)
        self._keep_only_the_best(trial, limit)
        return output

    def _keep_only_the_best(self, trial, limit: int | None) -> None:
        """As transformers at the end of training: a save_total_limit of 1 keeps the best checkpoint only."""
        if self.args.should_save and limit == 1 and self.state.best_model_checkpoint is not None:
            rotate_checkpoints(self._get_output_dir(trial), self.run_id, 1, {self.state.best_model_checkpoint})

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        if isinstance(resume_from_checkpoint, str) and self._reached_max_steps(resume_from_checkpoint):
            return self._finish_from_checkpoint(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _reached_max_steps(self, checkpoint: str) -> bool:
        state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
        return state.global_step >= self.set_initial_training_values(self.args, self.get_train_dataloader())[-1]

    def _finish_from_checkpoint(self, checkpoint: str) -> TrainOutput:
        """A run killed after its last checkpoint (e.g. during the final save): the Trainer, which checks for the end
        only after a step, would train one step more. Take the checkpoint's weights and state and end as training
        ends (the best checkpoint's weights with load_best_model_at_end), without a step."""
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
        logger.info("%s already reached step %d: finishing the save only", checkpoint, self.state.global_step)
        self._load_from_checkpoint(checkpoint)
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and os.path.isdir(best):
            self._load_best_model()
        self._keep_only_the_best(None, self.args.save_total_limit)
        losses = [entry["loss"] for entry in self.state.log_history if "loss" in entry]
        return TrainOutput(self.state.global_step, losses[-1] if losses else float("nan"), {})


class DevSentences:
    """The STS-B dev pairs as an evaluation set: each distinct sentence once (a `datasets.Dataset` of token ids,
    longest first, so that batches need little padding), and the metric over the embeddings the evaluation loop
    gathers.

    `max_length` None: no truncation below the model's own limit (SimCSE evaluates without a length limit)."""

    def __init__(self, pairs: STSPairs, tokenizer, max_length: int | None):
        self.pairs, self.tokenizer = pairs, tokenizer
        self.sentences = list(dict.fromkeys(pairs.sentence1 + pairs.sentence2))
        encoded = tokenizer(self.sentences, truncation=True, max_length=max_length)
        order = sorted(range(len(self.sentences)), key=lambda i: -len(encoded["input_ids"][i]))
        columns = {key: [values[i] for i in order] for key, values in encoded.items()}
        self.dataset = datasets.Dataset.from_dict({**columns, "sentence_index": order})
        self.index = {sentence: i for i, sentence in enumerate(self.sentences)}

    def collate(self, features: list[dict]) -> dict[str, Tensor]:
        index = torch.tensor([f["sentence_index"] for f in features])
        batch = self.tokenizer.pad([{k: v for k, v in f.items() if k != "sentence_index"} for f in features],
                                   return_tensors="pt")  # fmt: skip
        return {**batch, "sentence_index": index}

    def metrics(self, prediction) -> dict[str, float]:
        """EvalPrediction(predictions (U, D) embeddings, label_ids (U,) sentence indices)
        -> {"stsb_spearman", "alignment", "uniformity"} (evaluation.sts_dev_metrics: cosines in float64, as the
        STS suite; alignment and uniformity under SimCSE's STS-B dev protocol)"""
        embeddings = torch.empty(prediction.predictions.shape)
        embeddings[torch.from_numpy(prediction.label_ids)] = torch.from_numpy(prediction.predictions)  # (U, D)
        return sts_dev_metrics(embeddings, self.index, self.pairs)
