"""SimCSETrainer: a `transformers.Trainer` whose step is one SimCSE forward over [a, a', b, b', ...] and a
contrastive loss. The only place besides distributed.py that knows about ranks."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
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
from simcse_hn.data import GUIDE_PREFIX, STSPairs
from simcse_hn.dev_sentences import DevSentences
from simcse_hn.evaluation import load_encoder, simcse_encode_fn
from simcse_hn.guide import SELF, Guide, load_guide
from simcse_hn.losses import ContrastiveLoss, LossOutput
from simcse_hn.sampling import NoDuplicatesSampler
from simcse_hn.step import contrastive_loss
from simcse_hn.topic_batches import InForce, TopicBatchSampler, cluster_corpus

logger = logging.getLogger(__name__)

TOPIC_CLUSTERS_FILE = "topic_clusters.pt"  # a checkpoint's assignments in force: a resume draws the same batches


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
        norm, self.trainer.step_grad_norm = getattr(self.trainer, "step_grad_norm", None), None
        if norm is not None and not sharded and math.isfinite(float(norm)):
            return  # the step's total 2-norm is finite, so is every gradient: a NaN/inf anywhere makes it NaN/inf
        grads = [p.grad for p in self.trainer.model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if not grads and not sharded:
            return
        # no total norm, a sharded one, or a non-finite one (NaN/inf, or a finite gradient whose square overflows):
        # each gradient decides. It holds a NaN/inf iff its largest magnitude is NaN/inf: one reduction per gradient
        # (isfinite + any per gradient took 3-4 % of a MiniLM step on a CPU, bench/results/step_profile.md)
        largest = torch.stack(torch._foreach_norm(grads, math.inf)) if grads else torch.zeros(0)
        bad = ~torch.isfinite(largest).all()
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


class _SamplerEpoch(TrainerCallback):
    """Tells the no-duplicates sampler the epoch at its start. accelerate's `set_epoch` does not reach a sampler under
    the batch-skipping wrapper of a resumed multi-process run; the Trainer's state says the epoch in every case
    (a resumed run's state.epoch is the checkpoint's, e.g. 1.5 -> epoch 1)."""

    def __init__(self, trainer: SimCSETrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        for sampler in (self.trainer._no_duplicates_sampler, self.trainer._topic_sampler):
            if sampler is not None:
                sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))


class _Recluster(TrainerCallback):
    """Topic batches with `topic_recluster_steps` K: after every K-th optimizer step (but the last), the corpus is
    re-encoded by the model as it is and re-clustered (SimCSETrainer.recluster_topics), on every process together."""

    def __init__(self, trainer: SimCSETrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        every = args.topic_recluster_steps
        if every and state.global_step % every == 0 and state.global_step < state.max_steps:
            self.trainer.recluster_topics(state.global_step)


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
    * Paired data: `group_size` (default: the collator's, simcse_hn.pairs.PairCollator) says that rows come as
      [a, p, n_1..n_k] per example; `args.hard_negative_weight` applies. `args.guide_model` ("self", or a model that
      `guide` holds, loaded from the id when not given) removes the guide's false negatives each step.
    * `args.no_duplicates` (default: on for paired data): batches drawn by simcse_hn.sampling.NoDuplicatesSampler, no
      text twice in one gathered batch.
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
        group_size: int | None = None,
        guide: Guide | None = None,
        **kwargs,
    ):
        model.loss_fn = loss_fn  # a submodule: learned loss parameters train, loss state is checkpointed
        collated = getattr(kwargs.get("data_collator"), "group_size", None)
        if group_size is not None and collated is not None and group_size != collated:
            raise ValueError(f"group_size {group_size} differs from the collator's {collated}")
        self.group_size = group_size if group_size is not None else collated
        self.eval_pairs = eval_pairs
        self.eval_max_length = eval_max_length
        if eval_pairs is not None:
            self._dev = DevSentences(eval_pairs, kwargs["processing_class"], eval_max_length)
            kwargs.setdefault("eval_dataset", self._dev.dataset)
            kwargs.setdefault("compute_metrics", self._dev.metrics)
        super().__init__(model=model, args=args, **kwargs)
        self.simcse_config = simcse_config or {}
        self.skipped_steps = 0
        self.step_grad_norm = None  # the total gradient norm of the step about to be taken (`_get_grad_norm`)
        self.trained_sentences = 0  # sentences of the batches this process trained on (resumed runs: since resuming)
        self.truncated_sentences = 0  # of those, how many were longer than max_seq_length
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_count = 0
        self.add_callback(_NonFiniteGradientGuard(self))
        self.add_callback(ClampWarningCallback())
        self.add_callback(_SamplerEpoch(self))
        if args.topic_batches and args.topic_recluster_steps:
            self.add_callback(_Recluster(self))
        self._no_duplicates_sampler: NoDuplicatesSampler | None = None
        self._topic_sampler: TopicBatchSampler | None = None
        self._topic_assignment: Tensor | None = None  # (n,) int64: each example's cluster, first made
        self._topic_schedule: list[InForce] | None = None  # a resumed run's: the checkpoint's assignments in force
        self.guide = None
        if args.guide_model not in (None, SELF):
            self.guide = (guide if guide is not None else load_guide(args.guide_model)).to(args.device)
        if hasattr(self.model, "length_groups"):  # a SimCSEModel (tests may train other modules)
            self.model.length_groups = self.length_groups
        requested = args.sharding_engine()  # what the configuration asked for; accelerate decides what runs
        if requested and not (self.is_fsdp_enabled or self.is_deepspeed_enabled):
            logger.warning(
                "%s was requested, but accelerate runs it on GPUs (or other accelerators) only: this run on %s is "
                "plain data parallel (same results, unsharded memory)", requested, args.device.type
            )

    @property
    def length_groups(self) -> int:
        """Length groups of the training forward (SimCSEModel.length_groups): the argument, or by default 8 on a
        CPU without sharding or compilation, else 1 (bench/results/train_throughput_versus.md measures it)."""
        if self.args.length_groups is not None:
            return self.args.length_groups
        plain = not (self.args.sharding_engine() or self.args.torch_compile)
        return 8 if plain and self.args.device.type == "cpu" else 1

    @property
    def gather_across_devices(self) -> bool:
        flag = self.args.gather_across_devices
        return distributed.world_size() > 1 if flag is None else flag

    @property
    def no_duplicates(self) -> bool:
        flag = self.args.no_duplicates
        return self.group_size is not None if flag is None else flag

    def contrastive_loss(
        self, model, embeddings, head_inputs=None, text_ids=None, guide_embeddings=None
    ) -> LossOutput:
        """Loss of local embeddings (R, D) against the (gathered) candidates (simcse_hn.step.contrastive_loss). With
        `guide_model: self` the guide's embeddings are these, detached; an external guide's (R, E) are passed in."""
        if self.args.guide_model == SELF:
            guide_embeddings = embeddings.detach()
        return contrastive_loss(
            self.accelerator.unwrap_model(model).loss_fn,
            embeddings,
            form=self.args.contrast_form,
            group_size=self.group_size,
            hard_negative_weight=self.args.hard_negative_weight,
            guide_embeddings=guide_embeddings,
            guide_margin=self.args.guide_margin,
            head_inputs=head_inputs,
            gather=self.gather_across_devices,
            step=self.state.global_step,
            max_steps=self.state.max_steps,
            text_ids=text_ids,
        )

    def _guide_embeddings(self, guide_inputs: dict[str, Tensor], rows: int) -> Tensor | None:
        """The external guide's embeddings of the batch's rows (R, E), without gradient: the collator tokenised each
        text once for the guide (`guide_*` keys), and single-sentence rows [a, a', ...] repeat each text twice."""
        if self.guide is None:
            return None
        if not guide_inputs:
            raise ValueError("guide_model: the batch has no guide_* features; give the collator guide_tokenize")
        features = {key[len(GUIDE_PREFIX) :]: value for key, value in guide_inputs.items()}
        embeddings = self.guide(features)  # (texts, E)
        return embeddings if embeddings.shape[0] == rows else embeddings.repeat_interleave(2, dim=0)

    def _embed(self, model, inputs):
        """-> embeddings (2B, D), head inputs (2B, H) when the loss needs them, else None"""
        loss_fn: ContrastiveLoss = self.accelerator.unwrap_model(model).loss_fn
        output = model(**inputs, return_head_inputs=loss_fn.needs_head_inputs)
        return output.embeddings, output.head_inputs

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's total gradient norm of each optimizer step (computed anyway, for clipping and logging), kept
        for the non-finite guard: a finite norm spares it a pass over every gradient (1 % of a MiniLM step on a CPU,
        bench/results/step_profile.md). A Trainer that stops calling this leaves the guard its own pass."""
        self.step_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        return self.step_grad_norm

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        truncated = inputs.pop("num_truncated", 0)  # the collator's count for this batch (an int: no host sync)
        text_ids = inputs.pop("text_ids", None)  # (R,) for the duplicate diagnostics
        guide_inputs = {key: inputs[key] for key in inputs if key.startswith(GUIDE_PREFIX)}
        inputs = {key: value for key, value in inputs.items() if key not in guide_inputs}
        rows, group = inputs["input_ids"].shape[0], self.group_size or 2
        if model.training:  # texts: a sentence is two rows [a, a'], a paired example's rows are its texts
            self.trained_sentences += rows // 2 if self.group_size is None else rows
            self.truncated_sentences += truncated
        guide_embeddings = self._guide_embeddings(guide_inputs, rows) if model.training else None
        sentences = self.args.cache_minibatch_size  # examples (sentences, or groups of paired rows) per mini-batch
        if model.training and sentences is not None and group * sentences < rows:
            result = grad_cache.cached_loss(
                model,
                grad_cache.split_groups(inputs, sentences, group),
                embed=self._embed,
                loss_fn=functools.partial(self.contrastive_loss, model, text_ids=text_ids,
                                          guide_embeddings=guide_embeddings),  # fmt: skip
                no_sync=functools.partial(self.accelerator.no_sync, model),
                autocast=self.compute_loss_context_manager,
                loss_parameters=list(self.accelerator.unwrap_model(model).loss_fn.parameters()),
            )
        else:
            result = self.contrastive_loss(model, *self._embed(model, inputs), text_ids=text_ids,
                                           guide_embeddings=guide_embeddings)  # fmt: skip
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

    # --- batches without duplicates: the Trainer's sampler hook ---

    def _get_train_sampler(self, train_dataset=None):
        """With `no_duplicates`, a sampler whose every window of one gathered batch (per-device batch x processes, in
        the order accelerate shards batches) holds no text twice; seeded by data_seed (or seed) and the epoch, so
        every process draws the same order and a resumed run the same batches. Otherwise the Trainer's."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        in_memory = dataset is not None and isinstance(dataset, datasets.Dataset)
        if self.args.topic_batches and not in_memory:
            raise ValueError("topic_batches: needs a corpus in memory (a stream cannot be clustered up front)")
        if not (self.no_duplicates or self.args.topic_batches) or not in_memory:
            return super()._get_train_sampler(train_dataset)
        window = self.args.per_device_train_batch_size * (self.args.world_size if self.gather_across_devices else 1)
        columns = [c for c in dataset.column_names if c == "text" or c in ("anchor", "positive")
                   or c.startswith("negative_")]  # fmt: skip
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        if self.args.topic_batches:
            self._topic_sampler = TopicBatchSampler(
                self.topic_assignment(dataset), window, self.args.topic_share, seed=seed,
                rows=list(zip(*(dataset[c] for c in columns))), no_duplicates=self.no_duplicates,
            )  # fmt: skip
            if self._topic_schedule is not None:
                self._topic_sampler.load_schedule(self._topic_schedule)
            return self._topic_sampler
        self._no_duplicates_sampler = NoDuplicatesSampler(
            list(zip(*(dataset[c] for c in columns))), window, seed=seed, drop_last=self.args.dataloader_drop_last
        )
        return self._no_duplicates_sampler

    def topic_assignment(self, dataset: datasets.Dataset) -> Tensor:
        """The cluster of each example (anchor column for pairs): made once per run, by `topic_encoder` or the model
        before its first step, on process 0 and broadcast, so every process holds the same; a resumed run reads its
        checkpoint's (TOPIC_CLUSTERS_FILE), so it draws the batches of the uninterrupted run."""
        if self._topic_assignment is None:
            self._topic_assignment = self._cluster(dataset, encoder=self.args.topic_encoder)
        if len(self._topic_assignment) != len(dataset):
            raise ValueError(f"topic_batches: {len(self._topic_assignment)} cluster assignments (from the "
                             f"checkpoint) for {len(dataset)} training examples")  # fmt: skip
        return self._topic_assignment

    def _cluster(self, dataset: datasets.Dataset, encoder: str | None) -> Tensor:
        """The corpus (anchors for pairs) embedded by `encoder` (None: the model as it is now) and clustered, on
        process 0; every process returns process 0's assignment."""
        assignment = None
        if distributed.rank() == 0:
            texts = dataset["anchor" if "anchor" in dataset.column_names else "text"]
            if encoder is not None:
                encode = load_encoder(encoder, device=str(self.args.device))[0]
            else:
                tokenizer = self.processing_class or getattr(self.data_collator, "tokenizer", None)
                encode = simcse_encode_fn(self.accelerator.unwrap_model(self.model), tokenizer,
                                          max_length=getattr(self.data_collator, "max_length", None))  # fmt: skip
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            assignment = cluster_corpus(encode, texts, self.args.topic_clusters, seed=seed)
        return distributed.broadcast_object(assignment)

    def recluster_topics(self, step: int) -> None:
        """Re-cluster with the model after `step` optimizer steps. The loader has already drawn the next step's
        batches (and one more mini-batch), so the new assignment draws from the step after it: window (s + 1) x GA of
        the epoch, s the steps done in it, or the next epoch's start. A function of the step only, so an uninterrupted
        and a resumed run re-cluster at the same windows."""
        sampler = self._topic_sampler
        accumulation, full = self.args.gradient_accumulation_steps, sampler.size // sampler.window
        per_epoch = max(full // accumulation + int(full % accumulation > 0), 1)
        epoch, done = divmod(step, per_epoch)
        window = (done + 1) * accumulation if done else 0
        if window >= full:
            epoch, window = epoch + 1, 0
        sampler.recluster(self._cluster(self.train_dataset, encoder=None), epoch, window, step)

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
            if self._topic_sampler is not None:
                schedule = [entry.as_dict() for entry in self._topic_sampler.schedule]
                torch.save(schedule, os.path.join(written, TOPIC_CLUSTERS_FILE))
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
        clusters = os.path.join(resume_from_checkpoint, TOPIC_CLUSTERS_FILE) if isinstance(
            resume_from_checkpoint, str) else None  # fmt: skip
        if self.args.topic_batches and clusters is not None and os.path.isfile(clusters):
            self._topic_schedule = [InForce(**entry) for entry in torch.load(clusters)]
            self._topic_assignment = self._topic_schedule[0].assignment
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
