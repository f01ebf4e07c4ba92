"""The STS-B dev pairs as the Trainer's evaluation set (SimCSETrainer evaluates through the Trainer's loop)."""

from __future__ import annotations

import datasets
import torch
from torch import Tensor

from simcse_hn.data.sts import STSPairs
from simcse_hn.evaluation.scoring import sts_dev_metrics


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

    def loader(self, batch_size: int, num_workers: int = 0, pin_memory: bool = False) -> torch.utils.data.DataLoader:
        """Every sentence in order (already sorted by token length): the training arguments' `dataloader_drop_last`,
        which the Trainer would apply to its evaluation loader too, is for training batches only."""
        return torch.utils.data.DataLoader(self.dataset, batch_size=batch_size, collate_fn=self.collate,
                                           num_workers=num_workers, pin_memory=pin_memory)  # fmt: skip

    def collate(self, features: list[dict]) -> dict[str, Tensor]:
        index = torch.tensor([f["sentence_index"] for f in features])
        batch = self.tokenizer.pad([{k: v for k, v in f.items() if k != "sentence_index"} for f in features],
                                   return_tensors="pt")  # fmt: skip
        return {**batch, "sentence_index": index}

    def metrics(self, prediction) -> dict[str, float]:
        """EvalPrediction(predictions (U, D) embeddings, label_ids (U,) sentence indices)
        -> {"stsb_spearman", "alignment", "uniformity"} (evaluation.sts_dev_metrics: cosines as MTEB takes them, as the
        STS suite; alignment and uniformity under SimCSE's STS-B dev protocol)"""
        embeddings = torch.empty(prediction.predictions.shape)
        embeddings[torch.from_numpy(prediction.label_ids)] = torch.from_numpy(prediction.predictions)  # (U, D)
        return sts_dev_metrics(embeddings, self.index, self.pairs)
