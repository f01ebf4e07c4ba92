"""Where a run starts from, in the encoder's own terms: a sentence-transformers base model (all-MiniLM-L6-v2, say) is
already trained for sentence similarity through its own pooling, while SimCSE's recipe trains another vector (the CLS
token's). The trainer's step-0 evaluation scores the vector it trains; `own_pooling_start` scores the encoder as its
own modules pool, and `start_summary` puts both beside the trained score, with what the comparison means."""

from __future__ import annotations

import logging
import os

import torch

from simcse_hn.data.sts import STSPairs
from simcse_hn.evaluation.encoding import encoder_backend, load_encoder
from simcse_hn.evaluation.reports import model_label, pooling_name
from simcse_hn.evaluation.scoring import sts_dev_metrics
from simcse_hn.files import portable_name

logger = logging.getLogger(__name__)

SAME_POOLING = {"avg": "mean"}  # a pooler of SimCSEModel -> the sentence-transformers pooling that computes the same


def own_pooling_start(
    path: str, name: str, pairs: STSPairs, max_length: int, device: str, batch_size: int
) -> tuple[str, float] | None:
    """A sentence-transformers model (modules.json, no simcse_config.json) scored on STS-B dev `pairs` through its
    own modules, with the trainer's input length `max_length`. -> ("NAME's own POOLING pooling", Spearman x 100), or
    None for any other model (a raw encoder has no pooling of its own; a SimCSE folder's is the one it trains)."""
    if encoder_backend(path) != "sentence-transformers":
        return None
    bar = f"STS-B dev before training: encoding with {short_name(name)}'s own pooling"  # 10-70 s on a 2-core CPU
    with torch.random.fork_rng(devices=[]):  # the run's random stream is the same with or without this score
        settings = {"device": device, "batch_size": batch_size, "max_seq_length": max_length}
        encode, info = load_encoder(path, **settings, show_progress_bar=bar)
        sentences = list(dict.fromkeys(pairs.sentence1 + pairs.sentence2))
        score = sts_dev_metrics(encode(sentences), {s: i for i, s in enumerate(sentences)}, pairs)["stsb_spearman"]
    label = f"{short_name(name)}'s {pooling_name(path, info)}"
    logger.info("STS-B dev Spearman x 100 before training, with %s: %.2f", label, score)
    return label, score


def short_name(name: str) -> str:
    """A model's name without its owner or a builtin's prefix: all-MiniLM-L6-v2."""
    return model_label(portable_name(name)).rsplit("/", 1)[-1]


def start_summary(
    pooler: str, trained: float, before: float | None, own: tuple[str, float] | None, output_dir: str,
    base_model: str, eval_file: str | None = None,
) -> list[str]:
    """The end of a run's log: the saved model's STS-B dev score beside where it started, in the vector it trains
    (`before`, the step-0 evaluation) and, for a sentence-transformers base model, in the encoder's own pooling
    (`own`, from own_pooling_start); then what unsupervised SimCSE can be expected to do from such an encoder, and
    the command that scores both on the whole STS suite (with --data_dir when `eval_file` sits in a local copy of
    the suite's files)."""
    starts = [f"{before:.2f} with the {pooler} pooler this run trains"] if before is not None else []
    starts += [f"{own[1]:.2f} with {own[0]}"] if own is not None else []
    lines = [f"STS-B dev Spearman x 100 of the saved model ({pooler} pooler): {trained:.2f}"
             + (f" (before training: {'; '.join(starts)})" if starts else "")]  # fmt: skip
    if before is None and own is not None:  # the one start there is is another vector's: not this one's from-to
        lines[0] = (
            f"STS-B dev Spearman x 100 of the saved model ({pooler} pooler): {trained:.2f}; the {pooler} "
            f"pooler before training: not scored (--eval_on_start true scores it); another vector, "
            f"{own[0]} before training: {own[1]:.2f}"
        )
    if own is not None:
        data = os.path.dirname(eval_file) if eval_file and os.path.isfile(eval_file) else None
        data_dir = f" --data_dir {data}" if data and os.path.isfile(os.path.join(data, "sts12.jsonl")) else ""
        command = f"python eval/sts.py --model {output_dir}{data_dir} --baseline {base_model}"
        tuned = f"{short_name(base_model)} is a sentence-transformers model, already trained for sentence similarity"
        if own[0].endswith(f"own {SAME_POOLING.get(pooler)} pooling"):  # the run trains the encoder's own pooling
            lines.append(f"{tuned}, and this run trains its own pooling: SimCSE's unsupervised recipe, made for raw "
                         "pretrained encoders, can only nudge it here, up or down. STS-B dev is one set; the whole "
                         f"STS suite beside the start, in one table: {command}")  # fmt: skip
        else:
            lines.append(f"{tuned} through {own[0].split(' own ')[-1]}; SimCSE's unsupervised recipe, made for raw "
                         f"pretrained encoders, can raise the {pooler} vector it trains toward that pooling, not be "
                         "expected to pass it. STS-B dev is one set; the whole STS suite beside the start in both "
                         f"poolings, in one table: {command} --baseline {base_model}:{pooler}")  # fmt: skip
    return lines
