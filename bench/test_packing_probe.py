"""bench/packing_probe.py's packed forward: the embeddings its recorded timings stand for."""


import torch

from bench import packing_probe as probe
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert

SENTENCES = ["a b c", "the cat sat on the mat today", "x", "one two three four five six seven eight nine"]


def tiny_model():
    encoder, tokenizer = build_tiny_bert(seed=0)
    model = SimCSEModel(encoder, "cls", mlp_only_train=False).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].sum(1).unique().numel() > 2  # rows of different lengths: real padding
    return model, batch


def test_packed_forward_gives_each_sentence_alone():
    model, batch = tiny_model()
    probe.register()
    model.encoder.set_attn_implementation(probe.ATTENTION)
    with torch.no_grad():
        packed = probe.packed_embeddings(model, batch["input_ids"], batch["attention_mask"])
        model.encoder.set_attn_implementation("sdpa")
        alone = torch.cat([model(ids[None, : int(mask.sum())], mask[None, : int(mask.sum())]).embeddings
                           for ids, mask in zip(batch["input_ids"], batch["attention_mask"])])  # fmt: skip
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)


def test_padded_forward_under_the_probes_attention_keeps_its_mask():
    model, batch = tiny_model()
    probe.register()
    differences = probe.max_differences(model, batch)
    assert differences["packed"] < 1e-5
    assert differences["padded"] < 1e-5
    # without the mask function the padded rows would attend to their padding: the check above can fail
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    saved = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(probe.ATTENTION)
    try:
        model.encoder.set_attn_implementation(probe.ATTENTION)
        with torch.no_grad():
            unmasked = model(batch["input_ids"], batch["attention_mask"]).embeddings
            model.encoder.set_attn_implementation("sdpa")
            masked = model(batch["input_ids"], batch["attention_mask"]).embeddings
        assert (unmasked - masked).abs().max() > 1e-4
    finally:
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[probe.ATTENTION] = saved
