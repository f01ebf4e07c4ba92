"""simcse-hn's losses, negative queue and topic batches inside sentence-transformers' own `SentenceTransformerTrainer`
(docs/hub.md): the trainer's side, `SimCSECallback`.

    loss = SimCSELoss(model, "hcl", beta=0.1, queue_size=4096, momentum=0.995)  # st_losses: the queue
    batches = TopicBatches(clusters=64, share=1.0, recluster_steps=500)           # st_topic: the sampler
    args = SentenceTransformerTrainingArguments(..., batch_sampler=batches)
    trainer = SentenceTransformerTrainer(..., loss=loss, callbacks=[SimCSECallback(loss, batches)])

`SimCSECallback(loss, batches)` (either may be None; `loss` may be a wrapper, e.g. MatryoshkaLoss, or a dict of
losses: it finds the SimCSELoss inside):
* tells each loss where the trainer is (`TrainerStep`: global_step, max_steps, the micro-batch), which schedules and
  the queue's one-set-of-entries-per-batch rule read; checks a loss's own max_steps against the trainer's;
* claims the training loader's topic samplers (one per dataset of a DatasetDict) and hands them the model, before
  the first step (clustering then, re-clustering on schedule); while the train runs, TopicBatches gives evaluation
  loaders sentence-transformers' default batches;
* makes the queue's momentum encoder at the start and advances the queue after each optimizer step;
* writes the queue and the topic schedule into each checkpoint and then its manifest, last (as simcse-hn's trainer
  commits a checkpoint: training.checkpoints.CheckpointCommit), and reads them back on resume from a whole checkpoint;
* adds the loss's diagnostics, `clamped_batches` and the batches' cluster share to the training logs;
* names itself, the queue and the topic batches in the model card (the loss's parameters and citations).
What cannot work is refused in one line before the first step.
"""

from __future__ import annotations

import logging
import math
import os

import torch
from torch import nn

from simcse_hn.configuration.training_arguments import sharding_engine
from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE
from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_queue import SentenceQueue, token_text_ids
from simcse_hn.export.st_topic import TopicBatches, TopicBatchesSampler, TopicSchedules, training_samplers
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import CheckpointCommit, checkpoint_path, manifest_problem
from simcse_hn.training.queue import QUEUE_FILE, resume_queue
from simcse_hn.training.step import window_means

__all__ = ["SimCSECallback", "TopicBatches", "resumed_checkpoint", "simcse_losses", "token_text_ids"]
logger = logging.getLogger(__name__)


def simcse_losses(loss) -> list[SimCSELoss]:
    """The SimCSELoss modules in `loss`: itself, inside a wrapper (MatryoshkaLoss, AdaptiveLayerLoss: submodules), or
    in a dict of losses (a DatasetDict's)."""
    if loss is None:
        return []
    found = []
    for value in loss.values() if isinstance(loss, dict) else [loss]:
        found += [module for module in value.modules() if isinstance(module, SimCSELoss) and module not in found]
    return found


def resumed_checkpoint(args, state, required: bool = True) -> str | None:
    """The checkpoint a run resumes from (its state says the step; the Trainer tells callbacks no path): the one of
    output_dir at that step; ConfigError when there is none and it is `required`."""
    if not state.global_step:
        return None
    folder = checkpoint_path(args.output_dir, state.global_step)
    if not os.path.isdir(folder) and not required:
        return None
    if not os.path.isdir(folder):
        raise ConfigError(
            f"SimCSECallback: resuming at step {state.global_step}, but output_dir has no "
            f"{os.path.basename(folder)}: resume from a checkpoint of output_dir"
        )
    return folder


class SimCSECallback(CheckpointCommit):
    """The trainer's side of the SimCSE losses, their queue and TopicBatches: see the module's docstring. It commits
    each checkpoint as simcse-hn's trainer does, so it goes after any other callback that writes into checkpoints."""

    def __init__(self, loss: nn.Module | dict | None = None, batches: TopicBatches | None = None):
        super().__init__()
        self.loss, self.batches = loss, batches
        self.losses = simcse_losses(loss)
        queues = [found.queue for found in self.losses if found.queue is not None]
        if len(queues) > 1:
            raise ConfigError(f"SimCSECallback: {len(queues)} losses with a queue; one trainer keeps one queue")
        self.queue: SentenceQueue | None = queues[0] if queues else None
        self.samplers: list[TopicBatchesSampler] = []
        self.topic: TopicSchedules | None = None
        self.logged_memory = False
        for found in self.losses:
            found.card_notes["callback"] = "simcse_hn.export.st_training.SimCSECallback"
            if batches is not None:
                found.card_notes["batch_sampler"] = repr(batches)
                found.card_citations = [batches.citation]

    def on_init_end(self, args, state, control, **kwargs):
        if self.batches is not None:
            self.batches.bound = True

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        for found in self.losses:
            self._check_budget(found, args, state)
            found.trainer_step.set(state.global_step, state.max_steps)
        if self.queue is not None:
            engine = sharding_engine(args)  # accelerate launch's config included, not only --fsdp / --deepspeed
            if self.queue.momentum > 0 and engine:
                raise ConfigError(
                    f"SimCSELoss: momentum with FSDP or DeepSpeed is not available ({engine}: the momentum encoder "
                    "would be a whole copy of a sharded model); use momentum=0, a memory bank"
                )
        if self.batches is not None:
            self.samplers = self._claim(args, model, train_dataloader)
            self.topic = TopicSchedules(self.samplers)
        self.parts = [part for part in (self.queue, self.topic) if part is not None]
        if args.save_total_limit == 1 and (self.queue is not None or self.samplers):
            logger.warning(
                "save_total_limit 1: transformers deletes the last whole checkpoint before the new one's manifest "
                "is written; keep 2 or more so a run killed while saving can resume"
            )
        checkpoint = resumed_checkpoint(args, state, required=self.queue is not None or bool(self.samplers))
        if checkpoint is not None:
            self.load_state(checkpoint, args.device)
        for sampler in self.samplers:
            if sampler.topic is None:
                sampler.start(sampler.cluster())
        if self.queue is not None:
            self.queue.start(model)

    def _check_budget(self, loss: SimCSELoss, args, state) -> None:
        """A loss's own max_steps and gradient_accumulation_steps (given before the trainer counted them) must be the
        trainer's: a schedule over another length would be silently another run."""
        accumulation = (
            "gradient_accumulation_steps",
            loss.gradient_accumulation_steps,
            args.gradient_accumulation_steps,
        )
        for name, given, trainer in (("max_steps", loss.max_steps, state.max_steps), accumulation):
            if given is not None and given != trainer:
                raise ConfigError(
                    f"SimCSELoss({loss.objective_name!r}): {name}={given}, but the trainer runs {trainer}; leave "
                    f"{name} out (the loss reads the trainer's)"
                )

    def _claim(self, args, model, loader) -> list[TopicBatchesSampler]:
        """The training loader's topic samplers, claimed for training: one line when there are none (the training
        set is an IterableDataset, which takes no batch sampler) or what they need cannot be."""
        assert self.batches is not None
        samplers = [s for s in training_samplers(loader) if isinstance(s, TopicBatchesSampler)]
        if not samplers:
            raise ConfigError(
                "TopicBatches: the training loader has no topic sampler: pass the same TopicBatches as "
                "SentenceTransformerTrainingArguments(batch_sampler=...), with a Dataset or DatasetDict (an "
                "IterableDataset takes no batch sampler)"
            )
        if len(samplers) > 1 and distributed.world_size() > 1:
            raise ConfigError(
                "TopicBatches with a DatasetDict trains on one process: the multi-dataset sampler deals each process "
                "batches of other datasets, so no gathered batch could be one cluster"
            )
        if len(samplers) > 1 and self.batches.recluster_steps:
            raise ConfigError(
                "TopicBatches: recluster_steps with a DatasetDict is not available (how many batches each dataset "
                "gave by a step is the multi-dataset sampler's draw); use recluster_steps=0"
            )
        for sampler in samplers:
            sampler.claim(model)
        self.batches.bound = self.batches.in_training = True
        return samplers

    def on_train_end(self, args, state, control, **kwargs):
        if self.batches is not None:
            self.batches.in_training = False

    def on_epoch_begin(self, args, state, control, **kwargs):
        for sampler in self.samplers:
            sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))

    def on_step_begin(self, args, state, control, **kwargs):
        for found in self.losses:
            found.trainer_step.set(state.global_step, state.max_steps)

    def on_substep_end(self, args, state, control, **kwargs):
        for found in self.losses:
            found.trainer_step.batch += 1

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.queue is not None:
            self.queue.step_end(model)
            if not self.logged_memory and state.is_world_process_zero:
                self.queue.log_memory()
                self.logged_memory = True
        every = self.batches.recluster_steps if self.batches is not None else 0
        if every and state.global_step % every == 0 and state.global_step < state.max_steps:
            self.samplers[0].recluster(state.global_step, args.gradient_accumulation_steps)

    def load_state(self, folder: str, device: torch.device | str = "cpu") -> None:
        """What save_state wrote into `folder`, once the folder is a whole checkpoint (its manifest), compared with
        this run's settings (one-line ConfigError)."""
        problem = manifest_problem(folder)
        if problem:
            raise ConfigError(
                f"SimCSECallback: {os.path.basename(folder)} is not a whole checkpoint ({problem}); resume from an "
                "earlier one"
            )
        if self.queue is not None or os.path.isfile(os.path.join(folder, QUEUE_FILE)):
            resume_queue(self.queue, folder, device)  # type: ignore[arg-type]  # SentenceQueue: restore() alike
        if self.topic is not None:
            self.topic.load_state(folder)
        elif os.path.isfile(os.path.join(folder, TOPIC_CLUSTERS_FILE)):  # a resume never switches batch orders
            raise ConfigError(
                f"SimCSECallback: {os.path.basename(folder)} was trained with TopicBatches ({TOPIC_CLUSTERS_FILE}); "
                "pass them again to resume it"
            )

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The losses' diagnostics over the logging window, their clamped batches and the batches' mean cluster
        share, into the logs (and the run's log history); reporting callbacks placed before this one do not see
        them."""
        if logs is None or "loss" not in logs:
            return
        added: dict[str, float] = {}
        for found in self.losses:
            if found.metric_sums and found.metric_count:
                added.update(window_means(found.metric_sums, found.metric_count))
                found.metric_sums.clear()
                found.metric_count = 0
            if found.clamped.setting is not None:
                added["clamped_batches"] = added.get("clamped_batches", 0) + found.clamped.count
        shares = [share for sampler in self.samplers for share in sampler.shares]
        if shares:
            added["topic_cluster_share"] = round(sum(shares) / len(shares), 6)
            for sampler in self.samplers:
                sampler.shares.clear()
        logs.update(added)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(added)
