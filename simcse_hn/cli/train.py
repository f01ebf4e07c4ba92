"""Train a SimCSE sentence encoder.

python train.py --config configs/debug_tiny.yaml
accelerate launch train.py --config configs/unsup_bert_base_hcl.yaml --hcl_beta 0.2
"""

from __future__ import annotations

import sys

from simcse_hn.cli.answers import answer_train
from simcse_hn.cli.run_builder import RunBuilder
from simcse_hn.errors import UserError
from simcse_hn.export.hub import HubError
from simcse_hn.training.process_exit import finish
from simcse_hn.training.trainer import SimCSETrainer


def run(argv: list[str] | None = None) -> SimCSETrainer:
    """One training run (cli/run_builder.py: each part one screen). Raises UserError (one line) for what the user can
    fix: a setting, the data, the folder (another run holds it; a resume would change the run), a full disk."""
    builder = RunBuilder(argv)
    with builder.guarded():  # the folder's lock for the run's life; a write the disk refuses as one line
        builder.check_settings()
        builder.prepare_folder()
        builder.load_data()
        builder.record_run()
        builder.load_model()
        builder.build_trainer()
        builder.train()
        builder.finish()
    return builder.trainer


def main(argv: list[str] | None = None) -> int:
    """The run, after the front's answer (--help, or one error line for what is known before torch is imported)."""
    code = answer_train(argv)
    if code is not None:
        return code
    try:
        run(argv)
    except (UserError, HubError) as e:  # a HubError comes after the model is saved
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
