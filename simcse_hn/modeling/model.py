"""SimCSEModel: any `AutoModel` encoder + a pooler + SimCSE's MLP head (used in training only by default)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
)

from simcse_hn.choices import POOLERS
from simcse_hn.files import (
    ADAPTER_DIR,
    HEAD_WEIGHTS,
    LOSS_STATE,
    SIMCSE_CONFIG,
    record_files,
    write_json,
)
from simcse_hn.modeling import lora
from simcse_hn.modeling.batching import (
    ENCODER_INPUTS,
    iter_prepared_batches,
    length_groups_of,
    map_batches,
    place_rows,
    restore_order,
)
from simcse_hn.modeling.loading import encoder_files, finish_tokenizer_config, is_decoder_only
from simcse_hn.modeling.packing import (
    Packing,
    pack_inputs,
    packed,
    packs,
    plan_packing,
    pool_packed,
    row_of_each_token,
)
from simcse_hn.modeling.st_format import head_as_encoder_pooler, write_sentence_transformers_files
from simcse_hn.run_record import RunRecord
from simcse_hn.testing.models import BUILTIN_MODELS, build_builtin

logger = logging.getLogger(__name__)


class MLPHead(nn.Module):
    """SimCSE's MLPLayer: dense + tanh over the CLS vector."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, features: Tensor) -> Tensor:
        return self.activation(self.dense(features))


@dataclass
class SimCSEOutput:
    embeddings: Tensor  # (B, D)
    head_inputs: Tensor | None = None  # (B, H): input of the MLP head's Linear, when the head ran and was asked for


def last_token(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The hidden state of each row's last token with attention_mask 1, whichever side the padding is on (a row
    without any: its last position, as sentence-transformers' `lasttoken`). hidden (B, T, H), mask (B, T) -> (B, H)"""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (T,)
    last = torch.where(attention_mask.bool(), positions, -1).amax(dim=1)  # (B,)
    last = torch.where(last < 0, attention_mask.shape[1] - 1, last)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class SimCSEModel(nn.Module):
    """Encoder + pooler (`cls`, `cls_before_pooler`, `avg`, `avg_first_last`, `avg_top2`, `last`) + MLP head.

    `cls` runs the MLP head in training; at evaluation it runs only when `mlp_only_train` is False (SimCSE).
    `last` (the last non-padding token) is for decoder-only encoders (Llama, Qwen2, ...), whose last token has seen
    the whole sentence. The encoder's own pooler layer, if it has one, is frozen: it is unused, and DDP must not wait
    for its gradients. The encoder may be a peft model (LoRA, `add_lora`).

    `length_groups` > 1, in training: a batch runs as that many sub-batches of rows of similar token length, each
    cut to its own longest row (`length_groups_of`); the embeddings come back in the batch's order. The encoder then
    computes fewer padding positions (on the wiki corpus at batch 64 and max length 32, 29 % of a batch's positions are
    padding). A BERT encoder runs packed instead (simcse_hn.modeling.packing): the batch's tokens without padding in
    one row, attention in the length groups. The embeddings are the same up to float rounding (padding keys are
    masked out, the poolers read the mask); with dropout on, each row's dropout draw differs from the one-forward
    draw, equally random and equally seeded. The trainer sets it (`SimCSETrainingArguments.length_groups`); 1 (one
    forward) by default. Evaluation always runs one forward (`encode` and the dev loop already batch sentences of
    equal length).
    """

    def __init__(self, encoder: nn.Module, pooler: str = "cls", mlp_only_train: bool = True):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"pooler must be one of {POOLERS}, got {pooler!r}")
        self.encoder = encoder
        self.pooler = pooler
        self.mlp_only_train = mlp_only_train
        self.mlp = MLPHead(encoder.config.hidden_size) if pooler == "cls" else None
        self.length_groups = 1
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler.requires_grad_(False)

    @property
    def config(self):
        return self.encoder.config

    @property
    def _no_split_modules(self) -> list[str] | None:
        """The encoder's layer classes: what accelerate's FSDP TRANSFORMER_BASED_WRAP shards one by one."""
        return getattr(self.encoder, "_no_split_modules", None)

    def add_lora(self, r: int, alpha: float, dropout: float = 0.0, target_modules: list[str] | None = None) -> None:
        """Train LoRA adapters instead of the encoder's weights (lora.add_lora); the MLP head still trains."""
        frozen_pooler = getattr(self.encoder, "pooler", None)
        self.encoder = lora.add_lora(self.encoder, r, alpha, dropout, target_modules)
        if frozen_pooler is not None:
            frozen_pooler.requires_grad_(False)

    @property
    def uses_head(self) -> bool:
        return self.mlp is not None and (self.training or not self.mlp_only_train)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        return_head_inputs: bool = False,
    ) -> SimCSEOutput:
        if self.training and self.length_groups > 1 and packs(self.encoder):
            plan = plan_packing(attention_mask, self.length_groups)
            if plan is not None:
                return self._packed_forward(plan, input_ids, token_type_ids, return_head_inputs)
        groups = length_groups_of(attention_mask, self.length_groups) if self.training else None
        if groups is None:
            return self._forward(input_ids, None, attention_mask, token_type_ids, return_head_inputs)
        # the token embeddings are looked up once for the whole batch: one backward through the embedding matrix
        # (each lookup's backward fills a vocabulary-sized gradient: 47 MB for MiniLM, 7 % of a step at 8 groups)
        embeds = self.encoder.get_input_embeddings()(input_ids)  # (B, T, H)
        outputs = [
            self._forward(
                None,
                embeds[rows, :width],
                attention_mask[rows, :width],
                None if token_type_ids is None else token_type_ids[rows, :width],
                return_head_inputs,
            )
            for rows, width in groups
        ]
        order = torch.cat([rows for rows, _ in groups])  # row k of the concatenation is the batch's row order[k]
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        embeddings = torch.cat([output.embeddings for output in outputs])[inverse]
        if outputs[0].head_inputs is None:
            return SimCSEOutput(embeddings)
        return SimCSEOutput(embeddings, torch.cat([output.head_inputs for output in outputs])[inverse])

    def _packed_forward(
        self, plan: Packing, input_ids: Tensor, token_type_ids: Tensor | None, return_head_inputs: bool
    ) -> SimCSEOutput:
        """One encoder forward over the batch's tokens alone (simcse_hn.modeling.packing), pooled per row and put
        back in the batch's order, + the head."""
        needs_layers = self.pooler in ("avg_first_last", "avg_top2")
        with packed(self.encoder, plan):
            outputs = self.encoder(
                **pack_inputs(plan, input_ids, token_type_ids), output_hidden_states=needs_layers, return_dict=True
            )
        token_rows = row_of_each_token(plan) if self.pooler.startswith("avg") else None
        pooled = pool_packed(self._pooled_layers(outputs)[0], plan, self.pooler, token_rows)  # (B, H), packed order
        return self._with_head(restore_order(pooled, plan.order), return_head_inputs)

    def _pooled_layers(self, outputs) -> Tensor:
        """The hidden states the pooler reads: the last layer's, or the mean of two layers' (`avg_first_last`,
        `avg_top2`). -> (B, T, H)"""
        if self.pooler == "avg_first_last":
            return (outputs.hidden_states[1] + outputs.hidden_states[-1]) / 2
        if self.pooler == "avg_top2":
            return (outputs.hidden_states[-2] + outputs.hidden_states[-1]) / 2
        return outputs.last_hidden_state

    def _with_head(self, pooled: Tensor, return_head_inputs: bool) -> SimCSEOutput:
        """The pooled rows (B, H) through the MLP head where it runs."""
        if self.uses_head:
            return SimCSEOutput(self.mlp(pooled), pooled if return_head_inputs else None)
        return SimCSEOutput(pooled)

    def _forward(
        self,
        input_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        attention_mask: Tensor,
        token_type_ids: Tensor | None,
        return_head_inputs: bool,
    ) -> SimCSEOutput:
        """One encoder forward over token ids or their embeddings (B, T[, H]) + the pooler (+ the head)."""
        needs_layers = self.pooler in ("avg_first_last", "avg_top2")
        inputs = {"attention_mask": attention_mask}
        if input_ids is not None:
            inputs["input_ids"] = input_ids
        else:
            inputs["inputs_embeds"] = inputs_embeds
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if is_decoder_only(self.config):  # no generation: no key/value cache to build
            inputs["use_cache"] = False
        outputs = self.encoder(**inputs, output_hidden_states=needs_layers, return_dict=True)
        mask = attention_mask.unsqueeze(-1).to(outputs.last_hidden_state.dtype)  # (B, T, 1)

        def mean(hidden: Tensor) -> Tensor:  # (B, T, H) -> (B, H)
            return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)

        if self.pooler in ("cls", "cls_before_pooler"):
            pooled = outputs.last_hidden_state[:, 0]
        elif self.pooler == "last":
            pooled = last_token(outputs.last_hidden_state, attention_mask)
        else:
            pooled = mean(self._pooled_layers(outputs))
        return self._with_head(pooled, return_head_inputs)

    @torch.inference_mode()
    def encode(
        self,
        sentences: list[str],
        tokenizer,
        batch_size: int = 128,
        max_length: int | None = None,
        show_progress_bar: bool | str = False,
    ) -> Tensor:
        """Embeddings (n, D), float32 on the CPU, in eval mode, in the order of `sentences`.

        The sentences are tokenised once, in groups, and fed in batches of equal token length, longest first
        (`iter_prepared_batches`): batches sorted by character count leave a third of a batch's tokens as padding on
        the STS suite (MiniLM's tokenizer, batch 32), these under 1 %; a sentence whose token ids equal another's in
        its group is encoded once. On a CPU the batches run side by side on the cores (`map_batches`) while the next
        groups are tokenised. The embeddings stay on the device until the end: one copy to the CPU."""
        if not sentences:
            return torch.empty(0, self.config.hidden_size)
        device = next(self.parameters()).device
        order: list[int] = []
        copies: dict[int, int] = {}  # a sentence tokenised as an earlier one: that one's embedding

        def prepare(texts: list[str]) -> dict:  # on the tokenizer's padding side: the poolers read the mask
            return tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")

        def batches():  # tokenised in the caller's thread while the first batches already run
            for indices, features in iter_prepared_batches(prepare, sentences, batch_size, copies=copies):
                order.extend(indices)
                yield features

        def forward(batch) -> Tensor:
            with torch.inference_mode():  # a worker thread does not inherit the caller's mode
                return self(**{k: v.to(device) for k, v in batch.items() if k in ENCODER_INPUTS}).embeddings

        was_training = self.training
        self.eval()
        try:
            pieces = map_batches(forward, batches(), device, show_progress_bar)
        finally:
            self.train(was_training)
        return place_rows(torch.cat(pieces).float().cpu(), order, copies, len(sentences))  # (n, D)

    # --- saving and loading ---

    def split_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        """This model's state dict -> {"encoder", "mlp", "loss_fn"}: each part's own keys (prefix removed)."""
        parts: dict[str, dict[str, Tensor]] = {"encoder": {}, "mlp": {}, "loss_fn": {}}
        for key, value in state_dict.items():
            part, _, rest = key.partition(".")
            if part not in parts:
                raise ValueError(f"unexpected key {key!r} in a SimCSEModel state dict")
            parts[part][rest] = value
        return parts

    def save_pretrained(
        self,
        output_dir: str,
        tokenizer=None,
        extra_config: dict | None = None,
        state_dict: dict[str, Tensor] | None = None,
    ) -> list[str]:
        """Encoder (transformers format), tokenizer, MLP head, hard-negative loss state, simcse_config.json and the
        sentence-transformers files (st_format.py), so `AutoModel` and `SentenceTransformer` both load the folder;
        the encoder's weights are written once. `extra_config` goes into simcse_config.json; its
        `inference_max_seq_length`, when given, is the length both libraries truncate to (sentence-transformers'
        max_seq_length and the tokenizer's model_max_length); otherwise the tokenizer's own limit holds. The files
        written are recorded in the folder's manifest (simcse_files.json: what a push uploads).

        `state_dict`: this model's weights as the Trainer hands them over (gathered on the saving process under FSDP
        or DeepSpeed ZeRO-3, where the modules' own parameters are shards); default: the modules' own. Nothing is
        read from the parameters then, only the modules' structure. With LoRA the adapters are merged into the
        encoder's weights (a plain model) and the adapter is written beside them in `adapter/` (peft's format).
        -> those files, relative to output_dir."""
        os.makedirs(output_dir, exist_ok=True)
        config = {"pooler": self.pooler, "mlp_only_train": self.mlp_only_train, **(extra_config or {})}
        parts = self.split_state_dict(self.state_dict() if state_dict is None else state_dict)
        encoder_state, head_state = parts["encoder"], parts["mlp"]
        base, adapter_state = self.encoder, None
        if lora.is_lora(self.encoder):
            encoder_state, adapter_state = lora.split_lora(self.encoder, encoder_state)
            base = self.encoder.get_base_model()
        if self.pooler == "cls" and not self.mlp_only_train:  # AutoModel's pooler_output is then the embedding
            encoder_state.update(head_as_encoder_pooler(base, encoder_state, head_state))
        base.save_pretrained(output_dir, state_dict={k: v.contiguous() for k, v in encoder_state.items()})
        written = sorted(encoder_files(output_dir))
        record = RunRecord.from_json(config).model  # the run's record of the model: its lengths, its base model
        length = record.inference_max_seq_length
        if tokenizer is not None:
            saved = tokenizer.save_pretrained(output_dir)
            written += [os.path.relpath(path, output_dir) for path in saved if os.path.isfile(path)]
            finish_tokenizer_config(output_dir, length)
        if self.mlp is not None:
            state = {k: v.detach().contiguous() for k, v in head_state.items()}
            save_file(state, os.path.join(output_dir, HEAD_WEIGHTS))
            written.append(HEAD_WEIGHTS)
        if parts["loss_fn"]:
            state = {k: v.detach().contiguous() for k, v in parts["loss_fn"].items()}
            save_file(state, os.path.join(output_dir, LOSS_STATE))
            written.append(LOSS_STATE)
        if adapter_state is not None:
            base_name = record.base_model.name if record.base_model else None  # never a path of this machine
            files = lora.save_adapter(self.encoder, adapter_state, os.path.join(output_dir, ADAPTER_DIR), base_name)
            written += [f"{ADAPTER_DIR}/{name}" for name in files]
        write_json(os.path.join(output_dir, SIMCSE_CONFIG), config)
        written.append(SIMCSE_CONFIG)
        if tokenizer is not None:
            written += write_sentence_transformers_files(output_dir, self, length, head_state)
        else:
            logger.warning("no tokenizer given: sentence-transformers files not written to %s", output_dir)
        record_files(output_dir, written, replace=True)
        return written

    def load_weights(self, path: str) -> None:
        """Load encoder (with LoRA: the adapter), head and loss state saved by `save_pretrained` into this model
        (checkpoint resume, best model); the modules' own parameters, so not under FSDP or DeepSpeed (the Trainer's
        loaders read their checkpoints there)."""
        if lora.is_lora(self.encoder):
            lora.load_adapter(self.encoder, os.path.join(path, ADAPTER_DIR))
        else:
            encoder = type(self.encoder).from_pretrained(path, config=self.encoder.config)
            self.encoder.load_state_dict(encoder.state_dict())
        if self.mlp is not None and os.path.isfile(os.path.join(path, HEAD_WEIGHTS)):
            self.mlp.load_state_dict(load_file(os.path.join(path, HEAD_WEIGHTS)))
        loss_fn = getattr(self, "loss_fn", None)
        if loss_fn is not None and os.path.isfile(os.path.join(path, LOSS_STATE)):
            loss_fn.load_state_dict(load_file(os.path.join(path, LOSS_STATE)))

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler: str | None = None,
        mlp_only_train: bool | None = None,
        dropout: float | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> SimCSEModel:
        """A Hub id, a local folder (a saved SimCSEModel restores its pooler and head), or a builtin
        (`builtin:tiny-bert`, `builtin:tiny-llama`). `dtype`: the encoder's weights (default: transformers' "auto",
        the checkpoint's own; training passes float32, the master weights mixed precision expects)."""
        if name_or_path in BUILTIN_MODELS:
            encoder = build_builtin(name_or_path, dropout=0.1 if dropout is None else dropout)[0]
            saved = {}
        else:
            config = AutoConfig.from_pretrained(name_or_path)
            if dropout is not None:
                for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
                    if hasattr(config, name):
                        setattr(config, name, dropout)
            encoder = AutoModel.from_pretrained(name_or_path, config=config, dtype=dtype or "auto")
            saved = {}
            config_path = os.path.join(name_or_path, SIMCSE_CONFIG)
            if os.path.isfile(config_path):
                with open(config_path, encoding="utf-8") as f:
                    saved = json.load(f)
        model = cls(
            encoder,
            pooler=pooler or saved.get("pooler", "cls"),
            mlp_only_train=saved.get("mlp_only_train", True) if mlp_only_train is None else mlp_only_train,
        )
        head_path = os.path.join(name_or_path, HEAD_WEIGHTS)
        if model.mlp is not None and os.path.isfile(head_path):
            model.mlp.load_state_dict(load_file(head_path))
        return model.eval()  # as transformers' from_pretrained; the Trainer switches to train mode
