"""SimCSETrainer: a `transformers.Trainer` whose step is one SimCSE forward over [a, a', b, b', ...] and a
contrastive loss. The only place besides distributed.py that knows about ranks."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
from collections import defaultdict

import datasets
import torch
from accelerate.utils import DistributedType
from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from simcse_hn import distributed, grad_cache
from simcse_hn.checkpoints import TRAINER_STATE, new_run_id, rotate_checkpoints
from simcse_hn.data import STSPairs, contrastive_targets
from simcse_hn.evaluation import simcse_encode_fn, sts_spearman
from simcse_hn.losses import ContrastiveLoss

logger = logging.getLogger(__name__)


class _NonFiniteGradientGuard(TrainerCallback):
    """Skips the optimizer step when any gradient is NaN/inf (e.g. an fp16 overflow in the encoder): gradients are
    dropped (`grad = None`, so the optimizer leaves those weights and their moments alone) and the skip is counted.
    Under DDP gradients are already all-reduced, so every process takes the same decision."""

    def __init__(self, trainer: SimCSETrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if getattr(self.trainer.accelerator, "scaler", None) is not None:
            return  # fp16 with a GradScaler: the scaler already skips non-finite steps (and needs the gradients)
        grads = [p.grad for p in self.trainer.model.parameters() if p.grad is not None]
        if not grads:
            return
        finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
        if not bool(finite):  # one host synchronisation per optimizer step, outside the loss
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

    compute_loss: embeddings (2B, D) -> candidates (gathered from every process with gradient when
    `gather_across_devices`) -> targets offset by rank -> loss. Each process averages over its own anchors and DDP
    averages gradients over processes, so W processes give exactly the gradient of one process on the global batch.
    With `cache_minibatch_size`, training_step is a GradCache step (grad_cache.py): same loss and gradient, the
    activation memory of one mini-batch.
    """

    loss_is_scaled_for_ga = False  # the loss is a per-batch mean: the Trainer divides it by the accumulation steps

    def __init__(
        self,
        model,
        args,
        loss_fn: ContrastiveLoss,
        eval_pairs: STSPairs | None = None,
        max_seq_length: int = 32,
        simcse_config: dict | None = None,
        **kwargs,
    ):
        model.loss_fn = loss_fn  # a submodule: learned loss parameters train, loss state is checkpointed
        if eval_pairs is not None and kwargs.get("eval_dataset") is None:  # Trainer checks that one exists
            kwargs["eval_dataset"] = datasets.Dataset.from_dict(dataclasses.asdict(eval_pairs))
        super().__init__(model=model, args=args, **kwargs)
        self.eval_pairs = eval_pairs
        self.max_seq_length = max_seq_length
        self.simcse_config = simcse_config or {}
        self.skipped_steps = 0
        self._metric_sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=args.device))
        self._metric_count = 0
        self.add_callback(_NonFiniteGradientGuard(self))
        if args.cache_minibatch_size is not None and (
            self.accelerator.distributed_type == DistributedType.DEEPSPEED or args.n_gpu > 1
        ):
            raise ValueError("cache_minibatch_size: not supported with DeepSpeed or DataParallel; use DDP")

    @property
    def gather_across_devices(self) -> bool:
        flag = self.args.gather_across_devices
        return distributed.world_size() > 1 if flag is None else flag

    def contrastive_loss(self, model, embeddings, head_inputs=None):
        """Loss of local embeddings (2B, D) against the (gathered) candidates. -> LossOutput"""
        unwrapped = self.accelerator.unwrap_model(model)
        num_rows = embeddings.shape[0]
        candidates, candidate_features, offset = embeddings, head_inputs, 0
        if self.gather_across_devices and distributed.world_size() > 1:
            candidates = distributed.all_gather_with_grad(embeddings)  # (2BW, D)
            if head_inputs is not None:
                candidate_features = distributed.all_gather_with_grad(head_inputs)
            offset = distributed.rank() * num_rows
        anchor_rows, positive_index, negative_mask = contrastive_targets(
            num_rows, self.args.contrast_form, offset, candidates.shape[0], device=embeddings.device
        )
        state = {"step": self.state.global_step, "max_steps": self.state.max_steps}
        if distributed.world_size() > 1:  # every process fits the same ProGCL mixture, from all processes' pairs
            state["all_reduce"] = distributed.all_reduce_sum
        every_row = self.args.contrast_form == "symmetric"  # anchors are all local rows: pass the tensor itself, so
        # a loss can recognise anchors == candidates (one process) and reuse the similarity matrix
        anchors = embeddings if every_row else embeddings[anchor_rows]
        if every_row:  # negative_mask is every candidate but the anchor and its positive (UnReMix uses the structure)
            state["standard_negatives"] = True
        if head_inputs is not None:
            anchor_features = head_inputs if every_row else head_inputs[anchor_rows]
            state.update(anchor_features=anchor_features, candidate_features=candidate_features)
        return unwrapped.loss_fn(anchors, candidates, positive_index, negative_mask, **state)

    def _embed(self, model, inputs):
        """-> embeddings (2B, D), head inputs (2B, H) when the loss needs them, else None"""
        needs_features = getattr(self.accelerator.unwrap_model(model).loss_fn, "needs_head_inputs", False)
        output = model(**inputs, return_head_inputs=needs_features)
        return output.embeddings, output.head_inputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result = self.contrastive_loss(model, *self._embed(model, inputs))
        self._record_metrics(result.metrics)
        return (result.loss, result) if return_outputs else result.loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        sentences = self.args.cache_minibatch_size
        if sentences is None or 2 * sentences >= inputs["input_ids"].shape[0]:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        result = grad_cache.cached_step(
            model,
            grad_cache.split_pairs(inputs, sentences),
            embed=self._embed,
            loss_fn=functools.partial(self.contrastive_loss, model),
            backward=lambda surrogate: self.accelerator.backward(surrogate / self.current_gradient_accumulation_steps),
            no_sync=functools.partial(self.accelerator.no_sync, model),
            autocast=self.compute_loss_context_manager,
            loss_parameters=list(self.accelerator.unwrap_model(model).loss_fn.parameters()),
        )
        self._record_metrics(result.metrics)
        return result.loss.detach() / self.current_gradient_accumulation_steps

    def _record_metrics(self, metrics: dict[str, torch.Tensor]) -> None:
        if not self.model.training:
            return
        for key, value in metrics.items():
            self._metric_sums[key] = self._metric_sums[key] + value.detach().float()
        self._metric_count += 1

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metric_count:
            for key, total in self._metric_sums.items():
                logs[key] = round(float(total) / self._metric_count, 6)
            logs["skipped_steps"] = self.skipped_steps
            self._metric_sums.clear()
            self._metric_count = 0
        super().log(logs, start_time)

    # --- evaluation: STS-B dev Spearman x 100 ---

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        if self.eval_pairs is None:
            return {}
        model = self.accelerator.unwrap_model(self.model)
        # batches of equal token length, as the STS suite: less padding than SimCSEModel.encode's character sort
        encode = simcse_encode_fn(
            model, self.processing_class, self.args.per_device_eval_batch_size * 16, self.max_seq_length
        )
        pairs = self.eval_pairs
        score = sts_spearman(encode, pairs.sentence1, pairs.sentence2, pairs.scores)
        metrics = {f"{metric_key_prefix}_stsb_spearman": score}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # --- saving and loading: transformers + sentence-transformers folder, plus head and loss state ---

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        model = self.accelerator.unwrap_model(self.model)
        model.save_pretrained(output_dir, tokenizer=self.processing_class, extra_config=self.simcse_config)
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
        (model or self.model).load_weights(resume_from_checkpoint)

    def _load_best_model(self) -> None:
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

    # --- the Hub: train.py pushes the finished folder once (simcse_hn.hub), the Trainer never pushes by itself ---

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        self.push_in_progress = None  # no repo at start-up: simcse_hn.hub.push_to_hub creates it at the end

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        pass  # checkpoints stay local

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call=True)  # no push here: the card and STS results come later

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs,
    ) -> str | None:
        """Upload `args.output_dir` as it is on disk to `args.hub_model_id` (simcse_hn.hub.push_to_hub)."""
        from simcse_hn import hub

        if not self.is_world_process_zero():
            return None
        return hub.push_to_hub(
            self.args.output_dir,
            self.args.hub_model_id,
            token=token if token is not None else self.args.hub_token,
            private=private if private is not None else self.args.hub_private_repo,
            commit_message=commit_message or "End of training",
        )
