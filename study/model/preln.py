"""The pre-LayerNorm encoder (`model.arch: pre_ln`), as a stock transformers RoBERTa-PreLayerNorm.

Each layer normalises its input before attention and before the FFN, and one LayerNorm follows the last
layer (cramming found this decisive at short budgets: post-LN collapses at the learning rates that escape
the unigram plateau on CPU budgets). The weights are laid out as HF's `RobertaPreLayerNorm*` classes name
them, so a saved folder loads without custom code:

- `AutoModelForMaskedLM.from_pretrained(dir)` -> RobertaPreLayerNormForMaskedLM, the same MLM logits;
- `AutoModel.from_pretrained(dir)` -> RobertaPreLayerNormModel with our pooler, the same `pooler_output`.

What the MLM classes do not have is reported by transformers as UNEXPECTED keys, exactly as for a BERT
checkpoint: `roberta_prelayernorm.pooler.*` and `seq_relationship.*` (the NSP/SOP head) for the masked-LM
class, `lm_head.*` and `seq_relationship.*` for the bare encoder. One file, nothing missing on any load.
transformers has no pre-training class for this model type: `AutoModelForPreTraining` gives the masked-LM
class, so the sentence head comes back only through `study.model.load.load_pretrained`.

`PreLNForPreTraining` gives the trainer, evaluation and fine-tuning the surface of BertForPreTraining:
`.bert` (the encoder with pooler: `out[0]`, `out[1]` / `pooler_output`), `.cls.predictions` (the MLM
head) and `.cls.seq_relationship` (the sentence head on the pooled [CLS]). Quirks of the HF class:
- position ids count non-[PAD] tokens from pad_token_id + 1 (fairseq), so max_position_embeddings is
  max_positions + pad_id + 1 and pad_token_id must be the tokenizer's [PAD] id (row pad_id is zero and
  frozen, as RoBERTa's);
- the MLM head's transform is always GELU (RobertaLMHead); `model.activation` sets the FFN's;
- `hidden_states[-1]` (output_hidden_states) is the last layer's output before the final LayerNorm;
  `last_hidden_state` is after it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import RobertaPreLayerNormConfig
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput
from transformers.models.roberta_prelayernorm.modeling_roberta_prelayernorm import (
    RobertaPreLayerNormLMHead,
    RobertaPreLayerNormModel,
    RobertaPreLayerNormPreTrainedModel,
    gelu,
)

from study.config import ImplConfig, ModelConfig

MODEL_TYPE = "roberta-prelayernorm"  # config.json's model_type: what the Auto classes dispatch on
MASKED_LM = "RobertaPreLayerNormForMaskedLM"  # the stock class config.json names in `architectures`


def encoder_fields(cfg: ModelConfig, vocab_size: int) -> dict:
    """The config fields both architectures (bert.py's post-LN, this pre-LN) read from model.*: one mapping,
    so the two cannot size or regularise a model differently."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=cfg.intermediate,
        hidden_act=cfg.activation,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attention_dropout,
        type_vocab_size=2,
        initializer_range=cfg.init_range,
    )


def preln_config(
    cfg: ModelConfig, vocab_size: int, impl: ImplConfig, pad_id: int = 0
) -> RobertaPreLayerNormConfig:
    conf = RobertaPreLayerNormConfig(
        **encoder_fields(cfg, vocab_size),
        max_position_embeddings=cfg.max_positions + pad_id + 1,
        layer_norm_eps=1e-12,
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=None,
        architectures=[MASKED_LM],
    )
    conf._attn_implementation = impl.attention
    return conf


def lm_head_features(lm_head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RobertaPreLayerNormLMHead.forward up to its decoder (dense, gelu, LayerNorm): what the chunked MLM
    loss projects (study/model/xent.py). Checked against the head's own forward in tests/test_model.py."""
    return lm_head.layer_norm(gelu(lm_head.dense(x)))


class PreTrainingHeads:
    """BertPreTrainingHeads' surface over the modules PreLNForPreTraining owns (not a module itself:
    the parameters stay where HF's checkpoint layout puts them)."""

    __slots__ = ("predictions", "seq_relationship")

    def __init__(self, predictions: nn.Module, seq_relationship: nn.Module):
        self.predictions, self.seq_relationship = predictions, seq_relationship


class PreLNForPreTraining(RobertaPreLayerNormPreTrainedModel):
    """RobertaPreLayerNormForMaskedLM's modules (same names, same tying) + the pooler inside the encoder +
    a 2-way sentence head on the pooled [CLS], initialised like every Linear (normal(0, init_range))."""

    _tied_weights_keys = {
        "lm_head.decoder.weight": "roberta_prelayernorm.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }

    def __init__(self, config: RobertaPreLayerNormConfig):
        super().__init__(config)
        self.roberta_prelayernorm = RobertaPreLayerNormModel(config, add_pooling_layer=True)
        self.lm_head = RobertaPreLayerNormLMHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)
        self.post_init()

    # ---- the BertForPreTraining surface (study.model.bert.pretraining_loss, fine-tuning's `.bert`)
    @property
    def bert(self) -> RobertaPreLayerNormModel:
        return self.roberta_prelayernorm

    @property
    def cls(self) -> PreTrainingHeads:
        return PreTrainingHeads(self.lm_head, self.seq_relationship)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> BertForPreTrainingOutput:
        """MLM logits over every position and sentence logits, as BertForPreTraining returns them."""
        out = self.roberta_prelayernorm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
            **kwargs,
        )
        return BertForPreTrainingOutput(
            prediction_logits=self.lm_head(out.last_hidden_state),
            seq_relationship_logits=self.seq_relationship(out.pooler_output),
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def save_pretrained(self, save_directory, *args, **kwargs):
        """HF's save_pretrained, with config.json naming the stock class that loads it (`architectures` is
        informational for the Auto classes, which dispatch on model_type, but tools read it)."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if (Path(save_directory) / "config.json").is_file():
            self.config.architectures = [MASKED_LM]
            self.config.save_pretrained(save_directory)
        return out
