"""Two-process FSDP worker for tests/test_fsdp.py, started by accelerate with the shipped FSDP config:
`accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 --mixed_precision no
tests/fsdp_worker.py OUT_DIR` (CPU, gloo: tests/fsdp_cpu.py).

Every run is `SimCSETrainer.train()` under accelerate's FSDP2 (each encoder layer its own shard group) on the float64
tiny BERT of dist_worker_common, dropout off, 4 sentences per process per step, then `trainer.save_model(folder)`:
* OUT/<case>/final for every case of CASES (2 AdamW steps): the parent compares the folder with one process trained on
  the global batch (the same 8 sentences per step);
* OUT/resume/{straight,stopped,resumed}: 4 steps with checkpoints at 2 and 4; the same run stopped after step 3
  (an exception raised on both processes at the same step) and resumed from its checkpoint-2; again with the
  plugin's SHARDED_STATE_DICT (OUT/resume/sharded_*).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # simcse_hn when started from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_cpu import allow_fsdp_on_cpu  # noqa: E402

allow_fsdp_on_cpu()  # before the first Accelerator

import datasets  # noqa: E402
import torch  # noqa: E402
from dist_worker_common import CACHE_SENTENCES, global_texts, make_loss, make_model, make_trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from simcse_hn.data import SimCSECollator  # noqa: E402
from simcse_hn.modeling import build_tiny_bert  # noqa: E402

# (case, loss, contrast form, trainer overrides); "lora" adds LoRA adapters (rank 4) to the encoder
CASES = [
    ("hcl", "hcl", "symmetric", {}),
    ("hcl_cached", "hcl", "symmetric", {"cache_minibatch_size": CACHE_SENTENCES}),
    ("infonce_simcse", "infonce", "simcse", {}),
    ("progcl", "progcl", "symmetric", {}),
    ("unremix_learned", "unremix", "symmetric", {}),
    ("unremix_learned_cached", "unremix", "symmetric", {"cache_minibatch_size": CACHE_SENTENCES}),
    ("lora", "hcl", "symmetric", {}),
]


def build(case: str, loss: str, form: str, out_dir, **overrides):
    """The trainer of one case, as the worker and the one-process reference build it."""
    model = make_model()
    if case.startswith("lora"):
        torch.manual_seed(0)  # the adapters' random A matrices, the same in every process and in the reference
        model.add_lora(r=4, alpha=8)
    tokenizer = build_tiny_bert()[1]
    settings = {"max_steps": 2, "learning_rate": 1e-3, "seed": 0, "logging_steps": 1, **overrides}
    # float64 like the model: FSDP2 shards a group of parameters (the root's: head and loss) of one dtype only
    loss_fn = make_loss(case.removesuffix("_cached"), loss).double()
    return make_trainer(
        model,
        loss_fn,
        out_dir,
        form,
        train_dataset=datasets.Dataset.from_dict({"text": global_texts() * 2}),  # 32 sentences: 4 steps per epoch
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


def resume_runs(out: Path, prefix: str) -> None:
    checkpoints = {"save_strategy": "steps", "save_steps": 2, "max_steps": 4, "save_total_limit": None}
    straight = build("hcl", "hcl", "symmetric", out / f"{prefix}straight", **checkpoints)
    kind = str(straight.accelerator.state.fsdp_plugin.state_dict_type)
    assert ("SHARDED" in kind) == bool(prefix), kind
    straight.train()
    straight.save_model(str(out / f"{prefix}straight" / "final"))

    stopped = build("hcl", "hcl", "symmetric", out / f"{prefix}stopped", **checkpoints)
    stopped.add_callback(StopAt(3))
    try:
        stopped.train()
        raise AssertionError("the run did not stop")
    except Stopped:
        pass
    resumed = build("hcl", "hcl", "symmetric", out / f"{prefix}stopped", **checkpoints)
    resumed.train(resume_from_checkpoint=str(out / f"{prefix}stopped" / "checkpoint-2"))
    resumed.save_model(str(out / f"{prefix}stopped" / "final"))


def main(out_dir: str) -> None:
    out = Path(out_dir)
    for case, loss, form, overrides in CASES:
        trainer = build(case, loss, form, out / case, **overrides)
        assert trainer.is_fsdp_enabled, "accelerate did not enable FSDP"
        trainer.train()
        assert trainer._is_sharded(), type(trainer.model)
        trainer.save_model(str(out / case / "final"))
    resume_runs(out / "resume", "")
    os.environ["FSDP_STATE_DICT_TYPE"] = "SHARDED_STATE_DICT"  # what each Trainer's FSDP plugin reads from the launch
    resume_runs(out / "resume", "sharded_")
    torch.distributed.barrier()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1])
