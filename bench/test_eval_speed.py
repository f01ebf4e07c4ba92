"""The same-scores check of bench/eval_speed.py on a tiny model: ours against sentence-transformers' evaluator, in
float32 and bfloat16 on the CPU, with pairs that tie in exact arithmetic (a sentence with itself, a repeated pair,
a pair and its swap)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.common import base_shaped_model
from bench.eval_speed import run_ours, run_sentence_transformers, same_scores
from simcse_hn.data.sts import STSPairs, STSTask
from simcse_hn.evaluation.encoding import sentence_transformers_encode_fn
from simcse_hn.evaluation.scoring import pair_cosines, tie_equal

WORDS = "the a cat dog sat ran on under red blue old mat sofa quickly slowly big".split()


def tasks_with_ties(seed: int = 0) -> list[STSTask]:
    rng = np.random.default_rng(seed)
    pool = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) for _ in range(60)]
    first, second = list(pool[:30]), list(pool[30:])
    first += pool[:6]  # six pairs of a sentence with itself (cosine 1 in exact arithmetic)
    second += pool[:6]
    first += [pool[0], pool[30], pool[1]]  # a repeated pair, a swapped pair, and a swapped repeat
    second += [pool[30], pool[0], pool[31]]
    first.append(pool[31])
    second.append(pool[1])
    scores = [float(x) for x in rng.uniform(0, 5, size=len(first))]
    return [STSTask("STS12", "test", {"part": STSPairs(first, second, scores)}, multi_file=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_scores_as_the_evaluator(tmp_path, dtype):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(base_shaped_model(tmp_path / "m", layers=2, hidden=64, heads=2, intermediate=128),
                                device="cpu").to(dtype)  # fmt: skip
    tasks = tasks_with_ties()
    ours, our_embeddings, _ = run_ours(sentence_transformers_encode_fn(model, 8, side_by_side=False), tasks)
    theirs, their_embeddings, _ = run_sentence_transformers(model, tasks, 16)
    noise = None
    if dtype == torch.bfloat16:
        from bench.eval_speed import evaluator_embeddings

        noise = evaluator_embeddings(model, tasks, 4)
    check = same_scores(ours, theirs, their_embeddings, tasks, noise, our_embeddings)
    entry = check["subfiles"]["STS12/part"]
    assert entry["tie_groups_pairs"] == 9  # 5 self-pairs join the first; (0, 30) and (1, 31) twice each
    assert check["passed"], check
    if dtype == torch.float32:
        assert entry["abs_diff"] <= 1e-9, entry  # the same embeddings up to float32's batch noise: the same ranks


def test_tie_equal_makes_exact_arithmetic_ties_equal():
    torch.manual_seed(0)
    embeddings = torch.randn(40, 16)
    index = {str(i): i for i in range(40)}
    names = [str(i) for i in range(40)]
    raw = F.cosine_similarity(embeddings.double(), embeddings.double(), dim=-1).numpy()
    assert len(np.unique(raw)) > 1  # float64 gives a sentence with itself cosines that differ in the last bit
    self_pairs = pair_cosines(embeddings, index, STSPairs(names, names, [0.0] * 40))
    assert len(np.unique(self_pairs)) == 1
    swapped = pair_cosines(embeddings, index, STSPairs(names[:20] + names[20:], names[20:] + names[:20], [0.0] * 40))
    assert np.array_equal(swapped[:20], swapped[20:])
    spread = np.array([0.5, 0.5 + 1e-9, 0.2])
    assert np.array_equal(tie_equal(spread), spread)  # values apart by more than float64's rounding stay apart


def test_texts_tokenised_alike_share_one_embedding(tmp_path):
    """An uncased tokenizer makes "Red cat" and "red cat" one input: ours encodes it once, so their cosines with any
    third sentence tie exactly, as in exact arithmetic."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(base_shaped_model(tmp_path / "m", layers=2, hidden=64, heads=2, intermediate=128),
                                device="cpu")  # fmt: skip
    sentences = ["red cat sat", "a dog", "Red cat sat", "the old mat", "RED CAT SAT", "a dog"]
    assert len(set(map(str, model.tokenizer(sentences)["input_ids"]))) == 3
    rows = []
    model.register_forward_pre_hook(lambda module, inputs: rows.append(inputs[0]["input_ids"].shape[0]))
    embeddings = sentence_transformers_encode_fn(model, 2, side_by_side=False)(sentences)
    assert sum(rows) == 3  # each input once, whichever batch its copies would have fallen in
    assert torch.equal(embeddings[0], embeddings[2]) and torch.equal(embeddings[0], embeddings[4])
    assert torch.equal(embeddings[1], embeddings[5])
    alone = model.encode(sentences[3:4], convert_to_tensor=True)[0]
    assert torch.allclose(embeddings[3], alone, atol=1e-5)  # the others are still computed
