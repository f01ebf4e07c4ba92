"""SimCSETrainer: a `transformers.Trainer` whose step is one SimCSE forward over [a, a', b, b', ...] and a
contrastive loss. The only place besides distributed.py that knows about ranks."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections import defaultdict

import datasets
import torch
from accelerate.utils import DistributedType
from torch import Tensor
from transformers import Trainer, TrainerCallback
from transformers.trainer import TRAINING_ARGS_NAME

from simcse_hn import distributed, grad_cache
from simcse_hn.data import STSPairs
from simcse_hn.evaluation import simcse_encode_fn, sts_spearman
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
) -> LossOutput:
    """One SimCSE step's loss: local rows [a, a', b, b', ...] (2B, D) -> candidates gathered from every process with
    gradient (when `gather` and there is more than one process), targets offset by rank, the loss context.

    Each process averages over its own anchors and DDP averages gradients over processes, so W processes give exactly
    the gradient of one process on the global batch. head_inputs (2B, H): the MLP head's inputs (UnReMix).
    """
    candidates, candidate_features, offset = embeddings, head_inputs, 0
    several = distributed.world_size() > 1
    if gather and several:
        candidates = distributed.all_gather_with_grad(embeddings)  # (2BW, D)
        if head_inputs is not None:
            candidate_features = distributed.all_gather_with_grad(head_inputs)  # (2BW, H)
        offset = distributed.rank() * embeddings.shape[0]
    targets = build_targets(embeddings.shape[0], form, offset, candidates.shape[0], embeddings.device)
    context = LossContext(
        step=step,
        max_steps=max_steps,
        # every process fits the same ProGCL mixture, from all processes' pairs
        all_reduce=distributed.all_reduce_sum if several else None,
        candidate_features=candidate_features,
    )
    return loss_fn.compute(candidates, targets, context)


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

    def contrastive_loss(self, model, embeddings, head_inputs=None) -> LossOutput:
        """Loss of local embeddings (2B, D) against the (gathered) candidates (`contrastive_loss` below)."""
        return contrastive_loss(
            self.accelerator.unwrap_model(model).loss_fn,
            embeddings,
            form=self.args.contrast_form,
            head_inputs=head_inputs,
            gather=self.gather_across_devices,
            step=self.state.global_step,
            max_steps=self.state.max_steps,
        )

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
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        (model or self.model).load_weights(resume_from_checkpoint)

    def _load_best_model(self) -> None:
        logger.info("loading best model from %s (score %s)", self.state.best_model_checkpoint, self.state.best_metric)
        self.accelerator.unwrap_model(self.model).load_weights(self.state.best_model_checkpoint)

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
