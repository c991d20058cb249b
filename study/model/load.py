"""Loading a saved run's model back (pre-training's rescore, fine-tuning): the class is the folder's own."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import BertForPreTraining

from study.errors import StudyError
from study.model.preln import MODEL_TYPE, PreLNForPreTraining
from study.runtime import transformers_quiet


def load_pretrained(model_dir: Path | str, attention: str, quiet: bool = True) -> torch.nn.Module:
    """A saved run's model (CPU). The full pre-training class: loading BertModel alone would report the
    MLM/NSP heads as "unexpected keys" on every call; fine-tuning keeps `.bert`.

    Which class is the saved config.json's model_type: "bert" (model.arch post_ln) is BertForPreTraining;
    "roberta-prelayernorm" (pre_ln) is study.model.preln.PreLNForPreTraining, the same `.bert` / `.cls`
    surface."""
    config = Path(model_dir) / "config.json"
    model_type = json.loads(config.read_text()).get("model_type", "bert") if config.is_file() else "bert"
    cls = BertForPreTraining
    if model_type != "bert":
        if model_type != MODEL_TYPE:
            raise StudyError(
                f"model_type {model_type!r} is not a model this code trains",
                field="model.arch",
                allowed=f"bert (post_ln), {MODEL_TYPE} (pre_ln)",
                source=str(config),
            )
        cls = PreLNForPreTraining
    with transformers_quiet(quiet):
        return cls.from_pretrained(str(model_dir), attn_implementation=attention)
