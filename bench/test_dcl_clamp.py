"""bench/dcl_clamp.py's dropout views: the embeddings its clamp counts are made of."""

import torch

from bench import dcl_clamp
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert


def test_the_benches_dropout_views_run_the_encoder_on_a_collated_batch():
    encoder, tokenizer = build_tiny_bert()
    model = SimCSEModel(encoder, pooler="cls")
    z = dcl_clamp.dropout_views(model, tokenizer, ["one sentence", "another one", "a third"])
    assert z.shape[0] == 6 and not torch.allclose(z[0], z[1])  # two dropout views of each sentence
