"""Two-process worker for tests/test_sharded.py, started by accelerate with a shipped config:
`accelerate launch --config_file configs/accelerate/{fsdp,deepspeed_zero2,deepspeed_zero3}.yaml --num_processes 2
--mixed_precision no tests/sharded_worker.py OUT_DIR` (CPU, gloo: simcse_hn/testing/sharded_cpu.py).

Every run is `SimCSETrainer.train()` under that engine on the tiny BERT of dist_worker_common (float64 under FSDP;
float32 under DeepSpeed, which trains nothing wider), dropout off, 4 sentences per process per step, then
`trainer.save_model(folder)`:
* OUT/<case>/final for every case of `cases(engine)` (2 SGD steps): the parent compares the folder with one process
  trained on the global batch (the same 8 sentences per step);
* OUT/stream/rank{r}.pt: the batches each process trained on in 3 steps on a streamed corpus;
* OUT/resume/{straight,stopped}: 4 steps with checkpoints at 2 and 4; the same run stopped after step 3 (an exception
  raised on both processes at the same step) and resumed from its checkpoint-2; under FSDP again with the plugin's
  SHARDED_STATE_DICT (OUT/resume/sharded_*).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simcse_hn.testing.sharded_cpu import allow_sharding_on_cpu, requested, use_cpu  # noqa: E402

allow_sharding_on_cpu()  # before the first Accelerator

import datasets  # noqa: E402
import torch  # noqa: E402
from dist_worker_common import CACHE_SENTENCES, global_texts, make_loss, make_model, make_trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from simcse_hn.data.collator import SimCSECollator  # noqa: E402
from simcse_hn.data.sentences import load_sentence_stream  # noqa: E402
from simcse_hn.testing.models import build_tiny_bert  # noqa: E402
from simcse_hn.training import distributed  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "fixtures" / "tiny_corpus.txt"


def engine() -> str:
    """'fsdp', 'zero2' or 'zero3': what the launch's accelerate config asked for."""
    if requested("DEEPSPEED"):
        return f"zero{os.environ['ACCELERATE_DEEPSPEED_ZERO_STAGE']}"
    return "fsdp"


def cases(name: str) -> list[tuple[str, str, str, dict]]:
    """(case, loss, contrast form, trainer overrides) run under engine `name`; "lora" adds LoRA adapters (rank 4).
    Not: GradCache under DeepSpeed, the learned UnReMix mixture under ZeRO-3 (ConfigErrors, tests/test_sharded.py)."""
    cached = {"cache_minibatch_size": CACHE_SENTENCES}
    out = [
        ("hcl", "hcl", "symmetric", {}),
        ("infonce_simcse", "infonce", "simcse", {}),
        ("progcl", "progcl", "symmetric", {}),
        ("unremix_learned", "unremix", "symmetric", {}),
        ("lora", "hcl", "symmetric", {}),
        ("hcl_cached", "hcl", "symmetric", cached),
        ("unremix_learned_cached", "unremix", "symmetric", cached),
        # a memory bank (the queue without a momentum encoder): step 2 contrasts with step 1's embeddings
        ("hcl_queue", "hcl", "symmetric", {"queue_size": 16}),
    ]
    if name != "fsdp":
        out = [case for case in out if "cache_minibatch_size" not in case[3]]
    if name == "zero3":
        out = [case for case in out if case[0] != "unremix_learned"]
    return out


def build(case: str, loss: str, form: str, out_dir, name: str, train_dataset=None, **overrides):
    """The trainer of one case under engine `name`, as the worker and the one-process reference build it (by default
    on 32 sentences: 4 steps per epoch)."""
    dtype = torch.float64 if name == "fsdp" else torch.float32
    model = make_model().to(dtype)
    if case.startswith("lora"):
        torch.manual_seed(0)  # the adapters' random A matrices, the same in every process and in the reference
        model.add_lora(r=4, alpha=8)
        model.to(dtype)
    # the model's dtype for the loss's own parameter: FSDP2 shards a group (the root's: head, loss) of one dtype
    loss_fn = make_loss(case.removesuffix("_cached"), loss).to(dtype)
    tokenizer = build_tiny_bert()[1]
    # plain SGD without clipping: the update is the gradient itself (AdamW and clipping would hide its scale)
    settings = {"max_steps": 2, "optim": "sgd", "learning_rate": 0.5, "max_grad_norm": 0.0, "seed": 0,
                "logging_steps": 1, **overrides}  # fmt: skip
    return make_trainer(
        model,
        loss_fn,
        out_dir,
        form,
        train_dataset=train_dataset or datasets.Dataset.from_dict({"text": global_texts() * 2}),
        data_collator=SimCSECollator(tokenizer, max_length=24),
        processing_class=tokenizer,
        **settings,
    )


class Stopped(Exception):
    pass


class StopAt(TrainerCallback):
    """Raise after step `step`, on every process at once (no collective is left half-done)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Stopped


def resume_runs(out: Path, prefix: str, name: str) -> None:
    # AdamW: its state must come back too
    checkpoints = {"save_strategy": "steps", "save_steps": 2, "max_steps": 4, "save_total_limit": None,
                   "use_cpu": use_cpu(), "optim": "adamw_torch", "learning_rate": 1e-3}  # fmt: skip
    straight = build("hcl", "hcl", "symmetric", out / f"{prefix}straight", name, **checkpoints)
    if name == "fsdp":
        kind = str(straight.accelerator.state.fsdp_plugin.state_dict_type)
        assert ("SHARDED" in kind) == bool(prefix), kind
    straight.train()
    straight.save_model(str(out / f"{prefix}straight" / "final"))

    stopped = build("hcl", "hcl", "symmetric", out / f"{prefix}stopped", name, **checkpoints)
    stopped.add_callback(StopAt(3))
    try:
        stopped.train()
        raise AssertionError("the run did not stop")
    except Stopped:
        pass
    resumed = build("hcl", "hcl", "symmetric", out / f"{prefix}stopped", name, **checkpoints)
    resumed.train(resume_from_checkpoint=str(out / f"{prefix}stopped" / "checkpoint-2"))
    resumed.save_model(str(out / f"{prefix}stopped" / "final"))


STREAM = {"shuffle_buffer": 32, "seed": 5, "min_sentences": 8}  # the parent rebuilds each process's stream
STREAM_STEPS = 3


def stream_run(out: Path, name: str) -> None:
    """Three steps on a streamed corpus; OUT/stream/rank{r}.pt: the token ids of the batches process r trained on."""
    stream = load_sentence_stream(str(CORPUS), rank=distributed.rank(), world_size=distributed.world_size(), **STREAM)
    trainer = build("hcl", "hcl", "symmetric", out / "stream", name, train_dataset=stream, use_cpu=use_cpu(),
                    max_steps=STREAM_STEPS)  # fmt: skip
    seen, step = [], trainer.training_step

    def recording_step(model, inputs, *args, **kwargs):
        seen.append(inputs["input_ids"].cpu().clone())
        return step(model, inputs, *args, **kwargs)

    trainer.training_step = recording_step
    trainer.train()
    torch.save(seen, out / "stream" / f"rank{distributed.rank()}.pt")


def main(out_dir: str) -> None:
    out, name = Path(out_dir), engine()
    for case, loss, form, overrides in cases(name):
        trainer = build(case, loss, form, out / case, name, use_cpu=use_cpu(), **overrides)
        assert trainer.is_fsdp_enabled == (name == "fsdp") and trainer.is_deepspeed_enabled == (name != "fsdp")
        trainer.train()
        assert trainer._is_sharded(), type(trainer.model)
        trainer.save_model(str(out / case / "final"))
    stream_run(out, name)
    resume_runs(out / "resume", "", name)
    if name == "fsdp":
        os.environ["FSDP_STATE_DICT_TYPE"] = "SHARDED_STATE_DICT"  # what each Trainer's FSDP plugin reads
        resume_runs(out / "resume", "sharded_", name)
    torch.distributed.barrier()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1])
    from simcse_hn.training.process_exit import finish

    finish(0)  # see simcse_hn/training/process_exit.py
