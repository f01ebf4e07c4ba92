# An `evaluate` metric script: `evaluate.load(simcse_hn.evaluation.scoring.STS_METRIC)` (the path of this file) copies
# and
# imports it on its own, so it imports only `evaluate`, `datasets` and SciPy, never simcse_hn.
"""The STS metric of simcse-hn: Spearman correlation x 100 between predicted similarities and gold scores."""

from __future__ import annotations

import datasets
import evaluate

_DESCRIPTION = """\
Semantic textual similarity (STS) as SentEval and SimCSE score it: the Spearman rank correlation between the
similarity a model predicts for each sentence pair (in simcse-hn the cosine similarity of the two sentence
embeddings) and the gold similarity scores, multiplied by 100. Ties get average ranks (scipy.stats.spearmanr).
The predictions are kept as given (float64; simcse-hn passes cosines computed as MTEB's evaluator computes them, in
float32, so that its numbers are MTEB's). How the sub-files of STS12-16 are combined (SimCSE's pooled `all`,
SentEval's `mean` / `wmean`) is decided by the caller (simcse_hn.evaluation.scoring.score_sts_tasks), which calls
this metric once per correlation.
"""

_KWARGS_DESCRIPTION = """\
Args:
    predictions (list of float): predicted similarity of each pair, e.g. cosine similarities.
    references (list of float): gold similarity scores of the same pairs (any scale: only ranks matter).
    Or, for large inputs, lists of such lists (e.g. `[cosines]`, `[gold]` with NumPy arrays): each list is one
    row, which `evaluate` converts at once rather than value by value; the rows' pairs are pooled.
Returns:
    spearman (float): Spearman correlation x 100, in [-100, 100]; NaN when either side is constant.
Examples:
    >>> import evaluate
    >>> from simcse_hn.evaluation.scoring import STS_METRIC
    >>> metric = evaluate.load(STS_METRIC, keep_in_memory=True)
    >>> metric.compute(predictions=[0.1, 0.4, 0.35, 0.8], references=[0.0, 2.5, 3.0, 5.0])
    {'spearman': 80.0}
"""

_CITATION = """\
@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of EMNLP},
  year = {2021}
}
@inproceedings{conneau2018senteval,
  title = {{SentEval}: An Evaluation Toolkit for Universal Sentence Representations},
  author = {Conneau, Alexis and Kiela, Douwe},
  booktitle = {Proceedings of LREC},
  year = {2018}
}
"""


class STSMetric(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}),
                datasets.Features(  # one row per array: the suite's 20,000 pairs without a Python loop per value
                    {
                        "predictions": datasets.Sequence(datasets.Value("float64")),
                        "references": datasets.Sequence(datasets.Value("float64")),
                    }
                ),
            ],
            reference_urls=["https://github.com/princeton-nlp/SimCSE", "https://github.com/facebookresearch/SentEval"],
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        import numpy as np  # imported when evaluate runs this script's metric
        from scipy.stats import spearmanr

        if len(predictions) and isinstance(predictions[0], (list, np.ndarray)):  # rows of pairs: pooled
            predictions, references = np.concatenate(predictions), np.concatenate(references)
        return {"spearman": float(spearmanr(predictions, references).statistic) * 100}
