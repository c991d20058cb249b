"""The model: BERT for pre-training (`build_model`), its loss with the sparse MLM head
(`pretraining_loss`) and its training FLOPs per token (`model_flops_per_token`), from study/model/bert.py.

Imported eagerly: the package's only module needs torch and transformers anyway, and nothing light
(the CLI's parser, spec parsing, the report) imports it.
"""
from study.model.bert import build_model, model_flops_per_token, pretraining_loss

__all__ = ["build_model", "model_flops_per_token", "pretraining_loss"]
