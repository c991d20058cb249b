"""The model: BERT for pre-training (`build_model`), its loss with the sparse MLM head
(`pretraining_loss`) and its training FLOPs per token (`model_flops_per_token`), from study/model/bert.py;
`model.arch: pre_ln` builds the pre-LayerNorm encoder of study/model/preln.py behind the same surface.

Imported eagerly: the package's modules need torch and transformers anyway, and nothing light
(the CLI's parser, spec parsing, the report) imports it.
"""

from study.model.bert import build_model, model_flops_per_token, pretraining_loss

__all__ = ["build_model", "model_flops_per_token", "pretraining_loss"]
