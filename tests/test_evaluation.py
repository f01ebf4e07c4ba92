"""The STS suite: scores against sentence-transformers' evaluator and SciPy, SentEval's aggregations, one encode
call over the distinct sentences, task files (local and Hub) and their one-line errors."""

from __future__ import annotations

import json
import random

import datasets
import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics.pairwise import paired_cosine_distances

from simcse_hn.data.sts import STS_FILES, STS_TASKS, load_sts_task, parse_tasks, read_sts_jsonl
from simcse_hn.errors import DataError
from simcse_hn.evaluation.encoding import (
    encoder_backend,
    load_encoder,
    sentence_transformers_encode_fn,
    simcse_encode_fn,
    token_length_batches,
)
from simcse_hn.evaluation.scoring import score_sts_tasks, sts_spearman
from simcse_hn.modeling.batching import iter_prepared_batches, length_cuts
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import TINY_LLAMA, build_tiny_bert

WORDS = (
    "a the man woman dog cat child plays runs eats reads sings guitar piano ball book food park street car "
    "quickly slowly red green big small happy old young river house tree bird flies swims under over near"
).split()

# file -> split -> sub-file -> pairs; a few pairs each, names as in shared/data/sts
LAYOUT = {
    "sts12.jsonl": {"test": {"MSRpar": 9, "MSRvid": 7, "SMTeuroparl": 6}},
    "sts13.jsonl": {"test": {"FNWN": 6, "headlines": 8, "OnWN": 5}},
    "sts14.jsonl": {"test": {"images": 7, "OnWN": 6}},
    "sts15.jsonl": {"test": {"belief": 6, "headlines": 7}},
    "sts16.jsonl": {"test": {"plagiarism": 6, "postediting": 5}},
    "stsb.jsonl": {"train": {"MSRvid": 5}, "dev": {"images": 4}, "test": {"MSRvid": 6, "images": 6}},
    "sickr.jsonl": {"train": {"SICK": 5}, "dev": {"SICK": 4}, "test": {"SICK": 10}},
}


def write_sts_data(root, seed: int = 0):
    """Task files in the shared-data layout: random sentences from a pool of 60, so many recur across tasks;
    no pair appears twice (a repeated pair would be an exact tie whose rank order depends on float noise)."""
    rng = random.Random(seed)
    pool = list(dict.fromkeys(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(60)))
    seen = set()
    root.mkdir(parents=True, exist_ok=True)
    for filename, splits in LAYOUT.items():
        with open(root / filename, "w", encoding="utf-8") as f:
            for split, subsets in splits.items():
                for subset, count in subsets.items():
                    for _ in range(count):
                        pair = tuple(rng.sample(pool, 2))
                        while pair in seen:
                            pair = tuple(rng.sample(pool, 2))
                        seen.add(pair)
                        row = {"sentence1": pair[0], "sentence2": pair[1], "score": rng.randint(0, 50) / 10}
                        f.write(json.dumps(row | {"split": split, "subset": subset}) + "\n")
    return root


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_sts_data(tmp_path_factory.mktemp("sts"))


@pytest.fixture(scope="module")
def tasks(data_dir):
    return [load_sts_task(name, str(data_dir)) for name in STS_TASKS]


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """A tiny random BERT + mean pooling saved as a sentence-transformers model (modules.json, no simcse_config)."""
    from sentence_transformers import SentenceTransformer, models

    path = str(tmp_path_factory.mktemp("st_model"))
    encoder, tokenizer = build_tiny_bert(seed=1, dropout=0.0)
    encoder.save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformer = models.Transformer(path)
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(path)
    return path


def st_evaluator():
    try:
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
    except ImportError:  # sentence-transformers 5
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    return EmbeddingSimilarityEvaluator


def st_spearman_x100(model, sentence1, sentence2, scores) -> float:
    evaluator = st_evaluator()(sentence1, sentence2, scores, batch_size=4, main_similarity="cosine", write_csv=False)
    return float(evaluator(model)[evaluator.primary_metric]) * 100


def scipy_spearman_x100(embed, sentence1, sentence2, scores) -> float:
    """Independent reference: each side embedded on its own, the cosine as MTEB's evaluator takes it (scikit-learn's
    paired cosine distance on the float32 embeddings), scipy.stats.spearmanr."""
    a, b = np.asarray(embed(sentence1), dtype=np.float32), np.asarray(embed(sentence2), dtype=np.float32)
    cosine = 1 - paired_cosine_distances(a, b)
    return float(spearmanr(cosine, scores).statistic) * 100


def unbatched(model, sentences, cache={}):  # noqa: B006 (a cache on purpose)
    missing = [s for s in dict.fromkeys(sentences) if (id(model), s) not in cache]
    for s, e in zip(missing, model.encode(missing, batch_size=1)):
        cache[(id(model), s)] = e
    return np.stack([cache[(id(model), s)] for s in sentences])


def concat(task):
    s1 = [s for p in task.subsets.values() for s in p.sentence1]
    s2 = [s for p in task.subsets.values() for s in p.sentence2]
    return s1, s2, [g for p in task.subsets.values() for g in p.scores]


def test_scores_equal_sentence_transformers_evaluator_and_scipy(st_folder, tasks):
    from sentence_transformers import SentenceTransformer

    encode, info = load_encoder(st_folder, device="cpu", batch_size=16)
    assert info["backend"] == "sentence-transformers" and info["pooler"] is None
    model = SentenceTransformer(st_folder, device="cpu")
    results = {agg: score_sts_tasks(encode, tasks, agg) for agg in ("all", "mean", "wmean")}
    for task in tasks:
        # per sub-file: ST's evaluator run on that sub-file alone, as a user would, and SciPy
        reference = {
            name: st_spearman_x100(model, p.sentence1, p.sentence2, p.scores) for name, p in task.subsets.items()
        }
        for agg in results:
            for name, value in reference.items():
                assert results[agg]["tasks"][task.name]["subsets"][name]["spearman"] == pytest.approx(value, abs=1e-6)
        pairs = [p.scores.__len__() for p in task.subsets.values()]
        s1, s2, gold = concat(task)
        pooled_st = st_spearman_x100(model, s1, s2, gold)
        pooled_scipy = scipy_spearman_x100(lambda s: unbatched(model, s), s1, s2, gold)
        assert pooled_st == pytest.approx(pooled_scipy, abs=1e-6)
        assert results["all"]["tasks"][task.name]["spearman"] == pytest.approx(pooled_st, abs=1e-6)
        if task.multi_file:  # SentEval's mean and wmean over ST's per-sub-file scores
            mean = np.mean(list(reference.values()))
            wmean = np.average(list(reference.values()), weights=pairs)
            assert results["mean"]["tasks"][task.name]["spearman"] == pytest.approx(mean, abs=1e-6)
            assert results["wmean"]["tasks"][task.name]["spearman"] == pytest.approx(wmean, abs=1e-6)
            assert abs(mean - pooled_st) > 1e-3  # the aggregations really differ on this fixture
        else:  # STS-B, SICK-R: one file, one correlation whatever the aggregation
            assert results["mean"]["tasks"][task.name]["spearman"] == pytest.approx(pooled_st, abs=1e-6)
            assert results["wmean"]["tasks"][task.name]["spearman"] == pytest.approx(pooled_st, abs=1e-6)
    for agg, scored in results.items():
        assert scored["aggregation"] == agg
        assert scored["average"] == pytest.approx(np.mean([t["spearman"] for t in scored["tasks"].values()]))


@pytest.mark.parametrize("pooler", ["avg", "cls", "avg_first_last"])
def test_simcse_model_scores_equal_scipy_on_unbatched_embeddings(tasks, pooler):
    encoder, tokenizer = build_tiny_bert(seed=2)
    model = SimCSEModel(encoder, pooler=pooler).eval()

    cache = {}

    def one_by_one(sentences):  # no batching, no padding, no sorting
        with torch.no_grad():
            for s in sentences:
                if s not in cache:
                    cache[s] = model(**tokenizer([s], return_tensors="pt")).embeddings[0]
        return torch.stack([cache[s] for s in sentences]).numpy()

    scored = score_sts_tasks(simcse_encode_fn(model, tokenizer, batch_size=7), tasks, "all")
    for task in tasks:
        assert scored["tasks"][task.name]["spearman"] == pytest.approx(
            scipy_spearman_x100(one_by_one, *concat(task)), abs=1e-6
        )
        for name, p in task.subsets.items():
            expected = scipy_spearman_x100(one_by_one, p.sentence1, p.sentence2, p.scores)
            assert scored["tasks"][task.name]["subsets"][name]["spearman"] == pytest.approx(expected, abs=1e-6)


def test_simcse_avg_pooler_on_a_sentence_transformers_folder_matches_its_mean_pooling(st_folder, tasks):
    assert encoder_backend(st_folder, pooler="avg") == "simcse"
    simcse, info = load_encoder(st_folder, pooler="avg", device="cpu")
    assert info == {"backend": "simcse", "pooler": "avg", "modules": None, "device": "cpu", "max_seq_length": 128}
    st, st_info = load_encoder(st_folder, device="cpu")
    assert st_info["max_seq_length"] == 128  # both backends at the folder's own length
    a, b = score_sts_tasks(simcse, tasks, "wmean"), score_sts_tasks(st, tasks, "wmean")
    for name in a["tasks"]:
        assert a["tasks"][name]["spearman"] == pytest.approx(b["tasks"][name]["spearman"], abs=1e-6)


def test_each_distinct_sentence_is_encoded_once_in_one_call(tasks):
    calls = []

    def encode(sentences):
        calls.append(list(sentences))
        return torch.randn(len(sentences), 8, generator=torch.Generator().manual_seed(0))

    score_sts_tasks(encode, tasks, "all")
    every = [s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2]
    assert len(calls) == 1
    assert calls[0] == list(dict.fromkeys(every))  # each distinct sentence once, in first-seen order
    assert len(every) > len(calls[0])  # the fixture does repeat sentences, within and across tasks


def test_token_length_batches_group_equal_lengths_and_restore_order(tasks):
    _, tokenizer = build_tiny_bert()
    sentences = list(dict.fromkeys(s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2))
    batches = []

    def encode_batch(batch):  # one row per sentence: its token count and its index in `sentences`
        batches.append(batch)
        return torch.tensor([[len(tokenizer(s)["input_ids"]), sentences.index(s)] for s in batch], dtype=torch.float)

    out = token_length_batches(encode_batch, tokenizer, batch_size=16)(sentences)
    assert out[:, 1].tolist() == list(range(len(sentences)))  # order restored
    assert all(0 < len(b) <= 16 for b in batches)
    lengths = [len(tokenizer(s)["input_ids"]) for b in batches for s in b]
    assert lengths == sorted(lengths, reverse=True)  # longest first, so each batch pads to almost nothing
    cuts = [(sum(map(len, batches[:k])), sum(map(len, batches[: k + 1]))) for k in range(len(batches))]
    assert cuts == length_cuts(lengths, 16)


def test_length_cuts_close_a_batch_where_the_length_drops_once_it_holds_a_quarter():
    lengths = [9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8, 7, 7, 3, 2, 2, 2, 1]
    assert length_cuts(lengths, 8) == [(0, 3), (3, 11), (11, 13), (13, 15), (15, 17), (17, 18)]
    assert length_cuts([5] * 10, 4) == [(0, 4), (4, 8), (8, 10)]  # one length: whole batches
    assert length_cuts([4, 3, 2, 1], 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert length_cuts([], 8) == []
    padding = lambda cuts: sum(lengths[a] * (b - a) - sum(lengths[a:b]) for a, b in cuts)  # noqa: E731
    assert padding(length_cuts(lengths, 8)) < padding([(k, min(k + 8, len(lengths))) for k in range(0, 18, 8)])


def prepared_batches(prepare, sentences, batch_size, group_size):
    """iter_prepared_batches all at once -> (the sentence index of each row, batch after batch; features)"""
    order, batches = [], []
    for indices, features in iter_prepared_batches(prepare, sentences, batch_size, group_size):
        order += indices
        batches.append(features)
    return order, batches


@pytest.mark.parametrize("side", ["right", "left"])
def test_prepared_batches_equal_the_models_own_features_for_each_batch(st_folder, side):
    """Each text tokenised once, in groups; every batch cut out of its group is exactly what the model's own
    `preprocess` gives for that batch's texts alone, on either padding side, and the batches are of equal token
    length within a group."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(st_folder, device="cpu")
    st.tokenizer.padding_side = side
    prepare = getattr(st, "preprocess", None) or st.tokenize
    rng = random.Random(3)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, 14))) for _ in range(53)] + ["", "a"]
    calls = []

    def counted(texts):
        calls.append(len(texts))
        return prepare(texts)

    order, batches = prepared_batches(counted, sentences, batch_size=4, group_size=13)
    assert sorted(order) == list(range(len(sentences)))
    assert calls == [8, 12, 12, 12, 11]  # once each: a first group of two batches, then 12 at a time
    start = 0
    for features in batches:
        texts = [sentences[i] for i in order[start : start + len(features["input_ids"])]]
        start += len(texts)
        alone = prepare(texts)
        assert set(features) == set(alone)
        for key, value in alone.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(features[key], value), key
            else:
                assert features[key] == value, key
    assert start == len(sentences)
    lengths = [int(features["attention_mask"].sum(1).min()) for features in batches]
    widths = [features["attention_mask"].shape[1] for features in batches]
    assert len(set(widths)) > 3  # the groups do differ in length, and each batch is cut to its own
    group = [features["attention_mask"].sum(1).tolist() for features in batches[:3]]
    flat = [n for rows in group for n in rows]
    assert flat == sorted(flat, reverse=True) and min(lengths) >= 1  # sorted by token count within a group


def test_prepared_batches_prepare_a_group_again_when_its_mask_cannot_be_cut():
    """A mask with a hole (or none) is not padding on one side: that group goes to `prepare` batch by batch."""
    sentences = [f"s{i}" * (i + 1) for i in range(10)]
    calls = []

    def prepare(texts):
        calls.append(list(texts))
        mask = torch.ones(len(texts), 5, dtype=torch.long)
        mask[:, 1] = 0  # a hole
        return {"input_ids": torch.arange(len(texts) * 5).view(len(texts), 5), "attention_mask": mask}

    order, batches = prepared_batches(prepare, sentences, batch_size=3, group_size=6)
    by_chars = sorted(range(10), key=lambda i: -len(sentences[i]))
    assert order == by_chars
    assert [len(c) for c in calls] == [6, 3, 3, 4, 3, 1]  # each group once, then again batch by batch
    assert [b["input_ids"].shape[0] for b in batches] == [3, 3, 3, 1]


@pytest.mark.parametrize("pooler", ["cls", "avg", "avg_top2"])
def test_encode_equals_a_forward_per_sentence_in_the_callers_order(pooler):
    """Tokenised once, batches of equal token length, one copy at the end: each row is that sentence's own forward
    (no padding), whatever its length and wherever the sort put it."""
    encoder, tokenizer = build_tiny_bert(seed=4)
    model = SimCSEModel(encoder, pooler=pooler, mlp_only_train=False)  # the head too, at evaluation
    rng = random.Random(1)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, 16))) for _ in range(23)] + ["", "a"]
    model.train()
    out = model.encode(sentences, tokenizer, batch_size=4)
    assert model.training  # the caller's mode is restored
    model.eval()
    with torch.no_grad():
        single = [tokenizer([s], truncation=True, return_tensors="pt") for s in sentences]
        expected = torch.stack([model(**features).embeddings[0] for features in single])
    assert out.dtype == torch.float32 and out.device.type == "cpu" and out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    lengths = {len(tokenizer(s)["input_ids"]) for s in sentences}
    assert len(lengths) > 10  # the lengths do vary, so the sort moved rows


@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_of_a_decoder_with_last_token_pooling_equals_a_forward_per_sentence(side):
    """builtin:tiny-llama, pooler `last`: the tokenizer pads the equal-length batches on its own side, and the pooler
    finds each sentence's last token from the mask."""
    model = SimCSEModel.from_pretrained(TINY_LLAMA, pooler="last")
    tokenizer = load_tokenizer(TINY_LLAMA)
    tokenizer.padding_side = side
    rng = random.Random(2)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(13)]
    out = model.encode(sentences, tokenizer, batch_size=4)
    with torch.no_grad():
        model.eval()
        expected = torch.cat([model(**tokenizer([s], return_tensors="pt")).embeddings for s in sentences])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def counted_rows(module: torch.nn.Module) -> list[int]:
    """A list to which each forward of `module` appends its batch's rows (features as keywords or one dict)."""
    rows: list[int] = []

    def hook(module, args, kwargs, output):
        features = kwargs if "input_ids" in kwargs else args[0]
        rows.append(features["input_ids"].shape[0])

    module.register_forward_hook(hook, with_kwargs=True)
    return rows


def test_a_sentence_tokenised_as_another_is_encoded_once_and_gets_its_embedding(st_folder):
    """Under an uncased tokenizer "The cat" and "the cat" are one input: both encoders run it once and give both
    sentences that one row (their cosines tie exactly, as in exact arithmetic), in the caller's order."""
    from sentence_transformers import SentenceTransformer

    rng = random.Random(5)
    base = [" ".join(rng.choices(WORDS, k=rng.randint(2, 9))) for _ in range(17)]
    sentences = base + [base[3].upper(), base[0].capitalize(), base[3].title()]
    encoder, tokenizer = build_tiny_bert(seed=2)
    model = SimCSEModel(encoder, pooler="avg")
    st = SentenceTransformer(st_folder, device="cpu")
    for name, encode, forward_of in [
        ("simcse", lambda s: model.encode(s, tokenizer, batch_size=4), model),
        ("sentence-transformers", sentence_transformers_encode_fn(st, batch_size=4), st),
    ]:
        rows = counted_rows(forward_of)
        out = encode(sentences)
        assert sum(rows) == len(base), name  # the three copies were not run
        for copy, first in [(17, 3), (18, 0), (19, 3)]:
            assert torch.equal(out[copy], out[first]), name
        alone = encode(base)
        torch.testing.assert_close(out[: len(base)], alone, rtol=0, atol=1e-6)


def test_encode_of_nothing_is_an_empty_matrix():
    encoder, tokenizer = build_tiny_bert()
    model = SimCSEModel(encoder, pooler="avg")
    assert model.encode([], tokenizer).shape == (0, encoder.config.hidden_size)
    assert simcse_encode_fn(model, tokenizer)([]).shape == (0, encoder.config.hidden_size)


def test_token_length_batched_encoders_equal_the_plain_ones(st_folder, tasks):
    from sentence_transformers import SentenceTransformer

    sentences = list(dict.fromkeys(s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2))
    st = SentenceTransformer(st_folder, device="cpu")
    expected = st.encode(sentences, batch_size=len(sentences), convert_to_tensor=True)
    assert torch.allclose(sentence_transformers_encode_fn(st, batch_size=5)(sentences), expected, atol=1e-5)
    encoder, tokenizer = build_tiny_bert(seed=5)
    model = SimCSEModel(encoder, pooler="avg_top2")
    expected = model.encode(sentences, tokenizer, batch_size=len(sentences))
    assert torch.allclose(simcse_encode_fn(model, tokenizer, batch_size=5)(sentences), expected, atol=1e-5)


def test_aggregations_on_fixed_embeddings(tasks):
    """SentEval's definitions, by hand: all = one correlation over the pooled pairs, mean and wmean over sub-files."""
    vectors = {}

    def encode(sentences):
        for s in sentences:
            if s not in vectors:
                vectors[s] = torch.randn(6, generator=torch.Generator().manual_seed(len(vectors)))
        return torch.stack([vectors[s] for s in sentences])

    scored = {agg: score_sts_tasks(encode, tasks, agg) for agg in ("all", "mean", "wmean")}
    sts12 = tasks[0]

    def cos(p):
        a = torch.stack([vectors[s] for s in p.sentence1]).double()
        b = torch.stack([vectors[s] for s in p.sentence2]).double()
        return torch.nn.functional.cosine_similarity(a, b).numpy()

    per_file = [spearmanr(cos(p), p.scores).statistic * 100 for p in sts12.subsets.values()]
    weights = [len(p.scores) for p in sts12.subsets.values()]
    pooled = spearmanr(np.concatenate([cos(p) for p in sts12.subsets.values()]), concat(sts12)[2]).statistic * 100
    assert scored["all"]["tasks"]["STS12"]["spearman"] == pytest.approx(pooled, abs=1e-9)
    assert scored["mean"]["tasks"]["STS12"]["spearman"] == pytest.approx(np.mean(per_file), abs=1e-9)
    assert scored["wmean"]["tasks"]["STS12"]["spearman"] == pytest.approx(np.average(per_file, weights=weights))
    assert scored["all"]["tasks"]["STS12"]["pairs"] == sum(weights) == 22


def test_sts_spearman_for_the_trainer_equals_scipy(tasks):
    encoder, tokenizer = build_tiny_bert(seed=3)
    model = SimCSEModel(encoder, pooler="avg")
    p = tasks[5].subsets["test"]
    expected = scipy_spearman_x100(lambda s: model.encode(s, tokenizer).numpy(), p.sentence1, p.sentence2, p.scores)
    encode = simcse_encode_fn(model, tokenizer, batch_size=3)
    assert sts_spearman(encode, p.sentence1, p.sentence2, p.scores) == pytest.approx(expected, abs=1e-6)


def test_task_files_select_test_pairs_and_sub_files(data_dir):
    sts12 = load_sts_task("STS12", str(data_dir))
    assert list(sts12.subsets) == ["MSRpar", "MSRvid", "SMTeuroparl"] and sts12.multi_file and sts12.labelled
    stsb = load_sts_task("STS-B", str(data_dir))
    assert list(stsb.subsets) == ["test"] and stsb.pairs == 12 and not stsb.multi_file
    assert load_sts_task("SICK-R", str(data_dir)).pairs == 10
    sickr_all = load_sts_task("SICK-R", str(data_dir), sickr_all=True)
    assert list(sickr_all.subsets) == ["train", "dev", "test"] and sickr_all.pairs == 19


def test_sickr_all_scores_every_pair_as_one_correlation(data_dir):
    task = load_sts_task("SICK-R", str(data_dir), sickr_all=True)
    vectors = {}

    def encode(sentences):
        return torch.stack([vectors.setdefault(s, torch.randn(5)) for s in sentences])

    scored = score_sts_tasks(encode, [task], "mean")["tasks"]["SICK-R"]
    s1, s2, gold = concat(task)
    cosine = torch.nn.functional.cosine_similarity(
        torch.stack([vectors[s] for s in s1]).double(), torch.stack([vectors[s] for s in s2]).double()
    )
    assert scored["pairs"] == 19 and set(scored["subsets"]) == {"train", "dev", "test"}
    assert scored["spearman"] == pytest.approx(spearmanr(cosine.numpy(), gold).statistic * 100, abs=1e-9)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"sentence1": "a", "sentence2": "b", "score": 1', "malformed JSON"),
        ('{"sentence1": "a", "sentence2": "b", "score": "high"}', "field 'score' is not a number: 'high'"),
        ('{"sentence1": "a", "sentence2": "b", "score": NaN}', "field 'score' is not a finite number"),
        ('{"sentence1": "a", "sentence2": "b", "score": true}', "field 'score' is not a number: True"),
        ('{"sentence1": "a", "score": 2.0}', "missing field 'sentence2'"),
        ('{"sentence1": "a", "sentence2": 5, "score": 2.0}', "field 'sentence2' is not a string: 5"),
        ('["a", "b", 2.0]', "expected a JSON object, got list"),
    ],
)
def test_bad_task_file_raises_one_line_error_naming_file_and_line(tmp_path, line, message):
    write_sts_data(tmp_path)
    path = tmp_path / "sts13.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = line
    path.write_text("\n".join(lines) + "\n")
    for call in (lambda: read_sts_jsonl(str(path)), lambda: load_sts_task("STS13", str(tmp_path))):
        with pytest.raises(DataError) as error:
            call()
        assert str(error.value).startswith(f"{path}:3: ") and message in str(error.value)
        assert "\n" not in str(error.value)


def test_missing_task_file_names_file_and_task(tmp_path):
    write_sts_data(tmp_path)
    (tmp_path / "sts15.jsonl").unlink()
    with pytest.raises(DataError, match=r"sts15\.jsonl: file not found \(STS15 expects sts15\.jsonl"):
        load_sts_task("STS15", str(tmp_path))


def fake_hub(monkeypatch, data_dir, sickr_split_column: bool):
    """datasets.load_dataset replaced by the fixture's rows in the shape of the Hub copies (MTEB: no subset
    column; its SICK-R 'test' split holds every pair)."""
    calls = []
    by_id = {}
    from simcse_hn.data.sts import STS_HUB

    for task, hub_id in STS_HUB.items():
        rows = [json.loads(line) for line in (data_dir / STS_FILES[task]).read_text().splitlines()]
        if task != "SICK-R":
            rows = [r for r in rows if r["split"] == "test"]
        keep = ("sentence1", "sentence2", "score") + (("split",) if task == "SICK-R" and sickr_split_column else ())
        by_id[hub_id] = [{k: r[k] for k in keep} for r in rows]

    def load_dataset(path, split=None, **kwargs):
        calls.append((path, split))
        if path not in by_id:
            raise FileNotFoundError(f"Dataset '{path}' doesn't exist on the Hub")
        return datasets.Dataset.from_list(by_id[path])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_without_data_dir_tasks_come_from_the_hub(monkeypatch, data_dir):
    calls = fake_hub(monkeypatch, data_dir, sickr_split_column=False)
    local = [load_sts_task(name, str(data_dir)) for name in STS_TASKS[:6]]
    assert calls == []  # a data folder never touches the Hub
    hub = [load_sts_task(name) for name in STS_TASKS[:6]]
    assert calls == [(f"mteb/sts1{k}-sts", "test") for k in range(2, 7)] + [("sentence-transformers/stsb", "test")]
    assert [t.source for t in hub] == [c[0] for c in calls]
    assert hub[0].subsets.keys() == {"all"} and not hub[0].labelled
    encode = lambda s: torch.stack([torch.randn(4, generator=torch.Generator().manual_seed(len(x))) for x in s])  # noqa: E731
    a, b = score_sts_tasks(encode, hub, "all"), score_sts_tasks(encode, local, "all")
    for name in a["tasks"]:  # same pairs, same pooled correlation
        assert a["tasks"][name]["spearman"] == pytest.approx(b["tasks"][name]["spearman"], abs=1e-9)
    with pytest.raises(DataError, match="mteb/sts12-sts: STS12 pairs carry no 'subset'.*--aggregation mean"):
        score_sts_tasks(encode, hub, "mean")


def test_hub_sickr_needs_sickr_all_unless_it_has_splits(monkeypatch, data_dir):
    fake_hub(monkeypatch, data_dir, sickr_split_column=False)
    with pytest.raises(DataError, match="mteb/sickr-sts: no 'split' field.*--sickr_all"):
        load_sts_task("SICK-R")
    assert load_sts_task("SICK-R", sickr_all=True).pairs == 19
    fake_hub(monkeypatch, data_dir, sickr_split_column=True)
    assert load_sts_task("SICK-R").pairs == 10


def test_hub_failure_is_a_one_line_error(monkeypatch):
    def load_dataset(path, split=None, **kwargs):
        raise ConnectionError("Couldn't reach the Hub\n(long traceback text)")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(DataError) as error:  # unreachable: the line names the command that builds a local copy
        load_sts_task("STS14")
    assert str(error.value) == (
        "mteb/sts14-sts: could not reach the Hub and the datasets cache has no copy (Couldn't reach the Hub); online "
        "it is read from the Hub, or `simcse-hn-sts-data --output DIR` builds the STS folder once for --data_dir / "
        "eval_file")

    def missing(path, split=None, **kwargs):
        raise FileNotFoundError(f"Dataset '{path}' doesn't exist on the Hub\n(more)")

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(DataError, match=r"^mteb/sts14-sts: could not load dataset \(FileNotFoundError: Dataset"):
        load_sts_task("STS14")


def test_parse_tasks():
    assert parse_tasks("all") == list(STS_TASKS)
    assert parse_tasks("sickr, STS-B,sts12,stsb") == ["STS12", "STS-B", "SICK-R"]
    with pytest.raises(ValueError, match="unknown STS task 'sts17'"):
        parse_tasks("sts12,sts17")


def test_encoder_backend(tmp_path, st_folder, monkeypatch):
    assert encoder_backend(st_folder) == "sentence-transformers"
    assert encoder_backend(st_folder, pooler="cls") == "simcse"
    assert encoder_backend("builtin:tiny-bert") == "simcse"
    encoder, tokenizer = build_tiny_bert()
    SimCSEModel(encoder, pooler="avg_top2").save_pretrained(str(tmp_path / "simcse"), tokenizer)
    assert encoder_backend(str(tmp_path / "simcse")) == "simcse"  # it has modules.json too; its own pooler wins
    # Hub ids: decided by which files the repo has
    import huggingface_hub

    def hf_hub_download(repo_id, filename, **kwargs):
        if (repo_id, filename) != ("user/st-model", "modules.json"):
            raise huggingface_hub.errors.EntryNotFoundError(f"{filename} not in {repo_id}")
        return "/cache/modules.json"

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    assert encoder_backend("user/st-model") == "sentence-transformers"
    assert encoder_backend("princeton-nlp/unsup-simcse-bert-base-uncased") == "simcse"


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_map_batches_runs_batches_side_by_side_on_a_cpu_and_restores_the_thread_count(two_threads):
    import threading

    from simcse_hn.modeling.batching import map_batches

    barrier = threading.Barrier(2, timeout=30)  # passes only when two batches run at the same time
    seen = []

    def fn(batch):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        barrier.wait()
        return batch * 2

    assert map_batches(fn, list(range(6)), "cpu") == [0, 2, 4, 6, 8, 10]  # in order
    assert len({ident for ident, _ in seen}) == 2 and {threads for _, threads in seen} == {1}
    assert torch.get_num_threads() == 2
    seen.clear()
    assert map_batches(lambda b: (seen.append(threading.get_ident()), b)[1], [1, 2, 3], None) == [1, 2, 3]
    assert set(seen) == {threading.get_ident()}  # device None: one after the other, in the caller's thread


def test_map_batches_runs_the_first_batches_while_an_iterator_still_yields(two_threads):
    import threading

    from simcse_hn.modeling.batching import map_batches

    started = threading.Event()

    def batches():  # what the encoders pass: features made in the caller's thread, one batch at a time
        yield 0
        yield 1
        assert started.wait(timeout=10), "no batch ran before the iterator was drawn to its end"
        yield 2

    def fn(batch):
        started.set()
        return batch * 2

    assert map_batches(fn, batches(), "cpu", total=3) == [0, 2, 4]
    assert torch.get_num_threads() == 2


def test_map_batches_restores_the_thread_count_when_a_batch_fails(two_threads):
    from simcse_hn.modeling.batching import map_batches

    def fn(batch):
        if batch == 3:
            raise ValueError("batch 3")
        return batch

    with pytest.raises(ValueError, match="batch 3"):
        map_batches(fn, [1, 2, 3, 4], "cpu")
    assert torch.get_num_threads() == 2


def test_encoders_side_by_side_equal_one_batch_after_the_other(st_folder, tasks, two_threads):
    """Both backends on two threads (batches side by side) give what they give on one thread (one after the other),
    in the caller's order."""
    from sentence_transformers import SentenceTransformer

    sentences = list(dict.fromkeys(s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2))
    from simcse_hn.evaluation.encoding import _plain_sentence_transformer

    st = SentenceTransformer(st_folder, device="cpu")
    assert _plain_sentence_transformer(st)  # its forward on features made beforehand: the side-by-side path
    encoder, tokenizer = build_tiny_bert(seed=6)
    model = SimCSEModel(encoder, pooler="cls", mlp_only_train=False)
    encoders = {"st": sentence_transformers_encode_fn(st, 4), "simcse": simcse_encode_fn(model, tokenizer, 4)}
    side_by_side = {name: encode(sentences) for name, encode in encoders.items()}
    torch.set_num_threads(1)
    for name, encode in encoders.items():
        torch.testing.assert_close(side_by_side[name], encode(sentences), rtol=0, atol=1e-6, msg=name)
    expected = st.encode(sentences, batch_size=len(sentences), convert_to_tensor=True)
    torch.testing.assert_close(side_by_side["st"], expected, rtol=0, atol=1e-5)


def test_a_sentence_transformer_with_a_default_prompt_keeps_its_own_encode(st_folder, tasks):
    """A default prompt or a truncated dimension changes what `encode` gives: such a model goes through its own
    `encode`, batch after batch, and gets the prompt (the dimension)."""
    from sentence_transformers import SentenceTransformer

    from simcse_hn.evaluation.encoding import _plain_sentence_transformer

    sentences = ["a man plays a guitar", "the cat sat", "x"]
    st = SentenceTransformer(st_folder, device="cpu", prompts={"query": "query: "}, default_prompt_name="query")
    assert not _plain_sentence_transformer(st)
    expected = st.encode(sentences, convert_to_tensor=True)
    unprompted = st.encode(sentences, convert_to_tensor=True, prompt="")
    assert not torch.allclose(expected, unprompted, atol=1e-4)  # the prompt does change the embeddings
    got = sentence_transformers_encode_fn(st, batch_size=2)(sentences)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    for truncated in (SentenceTransformer(st_folder, device="cpu", truncate_dim=8),):
        assert not _plain_sentence_transformer(truncated)
        got = sentence_transformers_encode_fn(truncated, batch_size=2)(sentences)
        assert got.shape == (3, 8)
        torch.testing.assert_close(got, truncated.encode(sentences, convert_to_tensor=True), rtol=0, atol=1e-5)
