"""The model and data arguments (`ModelArguments`, `DataArguments`): each field with its help text, each checked in
`__post_init__` with a one-line `ConfigError` naming the field."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields

from simcse_hn.choices import DATA_FORMATS, POOLERS, require_peft
from simcse_hn.data.sts import STS_DATA_HINT
from simcse_hn.errors import ConfigError
from simcse_hn.files import is_hub_id


def check_field(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def check_finite(arguments) -> None:
    """Every float setting must be a finite number: an `inf` or `nan` temperature, tilt, prior or learning rate
    passes every range check and then silently disables the objective (or the training)."""
    for f in fields(arguments):
        value = getattr(arguments, f.name, None)
        if isinstance(value, float):
            check_field(math.isfinite(value), f.name, f"must be a finite number, got {value}")


@dataclass
class ModelArguments:
    _argument_group_name = "model"  # HfArgumentParser's --help group (a class attribute, not a field)
    model_name_or_path: str = field(
        default="bert-base-uncased",
        metadata={
            "help": "Hub id or local folder of the encoder; 'builtin:tiny-bert' builds a tiny random BERT "
            "with a character tokenizer in code (tests, offline smoke runs)."
        },
    )
    pooler: str = field(
        default="cls",
        metadata={
            "help": f"Sentence embedding pooler, one of {POOLERS}. 'cls' adds SimCSE's MLP head (dense+tanh).",
            "choices": POOLERS,
        },
    )
    mlp_only_train: bool = field(
        default=True,
        metadata={
            "help": "Use the MLP head only in training and evaluate with the CLS vector before it "
            "(SimCSE's unsupervised recipe)."
        },
    )
    inference_max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Token limit saved for inference (sentence-transformers' max_seq_length). Default: the base "
            "model's own (a sentence-transformers model's max_seq_length, else the encoder's position limit), not "
            "the training max_seq_length."
        },
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "Override the encoder's hidden and attention dropout (the two views differ only by "
            "dropout; SimCSE keeps BERT's 0.1)."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Hub id or local folder of the tokenizer, when model_name_or_path has none (default: it)."},
    )
    lora_r: int | None = field(
        default=None,
        metadata={
            "help": "Train LoRA adapters of this rank (peft; pip install 'simcse-hn[lora]') instead of the encoder's "
            "weights; the saved folder holds the merged weights, and the adapter in adapter/."
        },
    )
    lora_alpha: float = field(default=8, metadata={"help": "LoRA scaling numerator: updates are alpha / r x B A."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch's input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Module names to adapt (e.g. query value, or q_proj k_proj v_proj o_proj). Default: peft's "
            "choice for the architecture (BERT: query, value; Llama, Qwen2: q_proj, v_proj)."
        },
    )

    def __post_init__(self):
        check_finite(self)
        check_field(self.pooler in POOLERS, "pooler", f"must be one of {', '.join(POOLERS)}, got {self.pooler!r}")
        check_field(self.dropout is None or 0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        check_field(
            self.inference_max_seq_length is None or self.inference_max_seq_length >= 2,
            "inference_max_seq_length",
            f"must be >= 2, got {self.inference_max_seq_length}",
        )
        if self.lora_r is None:
            check_field(
                self.lora_target_modules is None, "lora_target_modules", "needs lora_r (LoRA is off without it)"
            )
        else:
            check_field(self.lora_r >= 1, "lora_r", f"must be >= 1, got {self.lora_r}")
            check_field(self.lora_alpha > 0, "lora_alpha", f"must be > 0, got {self.lora_alpha}")
            check_field(0 <= self.lora_dropout < 1, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
            require_peft()


@dataclass
class DataArguments:
    _argument_group_name = "data"
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training sentences from a local file: .txt (one per line), or .jsonl/.csv/.tsv with "
            "`text_column`. (A Hub dataset id here still works; --dataset_name is the usual route.)"
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Training sentences from a Hub dataset, read through `datasets` (instead of train_file)."},
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "The dataset's configuration (subset) name, when it has several."}
    )
    dataset_split: str = field(default="train", metadata={"help": "The dataset's split to train on."})
    train_data_files: str | None = field(
        default=None,
        metadata={"help": "With a Hub dataset: the file(s) inside the repo (e.g. wiki1m_for_simcse.txt)."},
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the sentence in jsonl/csv/Hub data."})
    data_format: str = field(
        default="auto",
        metadata={
            "help": "'sentences' (unsupervised SimCSE), 'pairs' (anchor, positive, optional negatives) or 'auto': a "
            ".txt file holds sentences, a table with text_column sentences, one with anchor/positive or "
            "sent0/sent1 columns (or any column flag) pairs; anything else is an error asking for this flag.",
            "choices": DATA_FORMATS,
        },
    )
    anchor_column: str | None = field(
        default=None, metadata={"help": "Pairs: the anchor column (default: 'anchor', 'sent0', else the first)."}
    )
    positive_column: str | None = field(
        default=None, metadata={"help": "Pairs: the positive column (default: 'positive', 'sent1', else the next)."}
    )
    negative_columns: list[str] | None = field(
        default=None,
        metadata={
            "help": "Pairs: the explicit negative columns, in order ('none': no negatives). Default: the columns "
            "named negative, negative_1..k or hard_neg, else (columns by order) every further text column."
        },
    )
    max_seq_length: int = field(default=32, metadata={"help": "Token limit per sentence (SimCSE: 32)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N sentences."})
    drop_duplicates: bool = field(default=False, metadata={"help": "Remove repeated sentences (always counted)."})
    word_repetition: float = field(
        default=0.0,
        metadata={
            "help": "ESimCSE's word repetition at this rate (e.g. 0.3; 0: off): each sentence's second view repeats "
            "k of its subword tokens in place, k uniform below min(10, rate x its token count, 1 + its tokens but "
            "the special ones), drawn from the seed "
            "and the sentence. Single sentences only (paired data has its own positives)."
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read train_file as a stream (datasets' streaming, local files too) instead of into memory: "
            "memory stays flat whatever the corpus size; needs max_steps; each process reads its share."
        },
    )
    streaming_shuffle_buffer: int = field(
        default=10_000,
        metadata={"help": "With streaming: sentences held in the shuffle buffer (0: the corpus's own order)."},
    )
    eval_file: str | None = field(
        default=None,
        metadata={
            "help": "STS-B dev pairs for model selection: JSON Lines with sentence1, sentence2, score "
            "(and optional split), or a Hub dataset id such as sentence-transformers/stsb."
        },
    )
    eval_split: str = field(
        default="dev",
        metadata={"help": "Split of eval_file to score ('dev' and 'validation' name one split, local or Hub)."},
    )
    eval_optional: bool = field(
        default=False,
        metadata={
            "help": "When eval_file is a Hub dataset that cannot be had here (offline, or no network, and not in the "
            "datasets cache), train without the STS-B dev evaluation instead of stopping; the run's last line "
            "says how to get the STS data."
        },
    )
    eval_max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Token limit of the STS-B dev evaluation. Default: the model's own limit (SimCSE trains at 32 "
            "tokens and evaluates without truncation)."
        },
    )

    def __post_init__(self):
        check_finite(self)
        check_field(self.max_seq_length >= 2, "max_seq_length", f"must be >= 2, got {self.max_seq_length}")
        check_field(
            self.eval_max_seq_length is None or self.eval_max_seq_length >= 2,
            "eval_max_seq_length",
            f"must be >= 2, got {self.eval_max_seq_length}",
        )
        check_field(self.max_train_samples is None or self.max_train_samples > 0, "max_train_samples", "must be > 0")
        check_field(
            0 <= self.word_repetition <= 1, "word_repetition", f"must be in [0, 1], got {self.word_repetition}"
        )
        check_field(
            self.data_format in DATA_FORMATS,
            "data_format",
            f"must be one of {', '.join(DATA_FORMATS)}, got {self.data_format!r}",
        )
        check_field(self.streaming_shuffle_buffer >= 0, "streaming_shuffle_buffer", "must be >= 0")
        for name in ("train_file", "eval_file"):
            path = getattr(self, name)
            if path is not None and not is_hub_id(path):
                hint = f" ({STS_DATA_HINT})" if name == "eval_file" else ""
                inside = f" (an STS folder's: {os.path.join(path, 'stsb.jsonl')})" if name == "eval_file" else ""
                check_field(not os.path.isdir(path), name, f"{path} is a folder; give a file{inside}")
                check_field(os.path.isfile(path), name, f"file not found: {path}{hint}")
        check_field(
            self.train_file is None or self.dataset_name is None,
            "dataset_name",
            f"give train_file or dataset_name, not both (got {self.train_file!r} and {self.dataset_name!r})",
        )
        check_field(
            self.dataset_name is None or is_hub_id(self.dataset_name),
            "dataset_name",
            f"{self.dataset_name!r} is not a Hub dataset id ('owner/name'); a local file goes in train_file",
        )

    @property
    def train_source(self) -> str | None:
        """Where the training sentences come from: the Hub dataset, else the file (or the Hub id in train_file)."""
        return self.dataset_name or self.train_file

    @property
    def train_source_field(self) -> str:
        """The flag that names `train_source`, for its errors."""
        return "dataset_name" if self.dataset_name else "train_file"

    @property
    def column_flags(self) -> bool:
        """Whether any pair column flag is set (they mean paired data)."""
        return any(v is not None for v in (self.anchor_column, self.positive_column, self.negative_columns))
