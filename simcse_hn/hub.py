"""What a saved model folder holds besides the encoder: sentence-transformers files, model card, Hub upload."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

ST_POOLING = {"cls": "cls", "cls_before_pooler": "cls", "avg": "mean"}


def write_sentence_transformers_files(output_dir: str, model, tokenizer, max_seq_length: int | None = None) -> None:
    """modules.json, the pooling config matching the evaluation pooler, sentence_bert_config.json (and a Dense
    tanh module when `cls` keeps the MLP head at inference), written by sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer, models
    from torch import nn

    if model.pooler not in ST_POOLING:
        logger.warning("pooler %r has no sentence-transformers equivalent; skipping its files", model.pooler)
        return
    transformer = models.Transformer(output_dir, max_seq_length=max_seq_length)
    modules = [
        transformer,
        models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=ST_POOLING[model.pooler]),
    ]
    if model.pooler == "cls" and not model.mlp_only_train:
        size = model.mlp.dense.in_features
        dense = models.Dense(size, model.mlp.dense.out_features, activation_function=nn.Tanh())
        dense.linear.load_state_dict(model.mlp.dense.state_dict())
        modules.append(dense)
    SentenceTransformer(modules=modules, device="cpu").save(output_dir)
