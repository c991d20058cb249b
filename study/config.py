"""The typed configuration of one run: every knob, its default, its allowed range.

This is the only place defaults live. Library code receives these objects and
reads attributes; it never does ``cfg.get(key, default)``.

Sections are split the way cramming splits them:
- *semantic* sections (corpus, tokenizer, objective, masking, model, train,
  finetune) change what is measured, so they enter the run hash;
- `impl` holds speed-only settings (device, precision, sparse head, attention
  kernel, threads, logging). Each of them is proven loss-neutral by a test, so it
  is excluded from the hash: the same run trained on a laptop or a GPU is the same
  folder.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from study.io import hash_obj


class Strict(BaseModel):
    """Unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


# --------------------------------------------------------------------------- corpus
class CorpusSource(Strict):
    """One text source. `kind` says how to read it.

    - embedded: the English Wikipedia sample shipped inside the gensim wheel
    - text: a .txt file or a folder of them; blank lines separate documents
    - wikitext: WikiText raw files (a file or a folder of *.raw / *.txt)
    - gutenberg: Project Gutenberg .txt books (a file or folder); header/footer stripped
    - hf: a Hugging Face dataset through `datasets.load_dataset(name, config, split)`;
      `name` may also be a local dataset folder (`save_to_disk` output or data files)
    """

    kind: Literal["embedded", "text", "wikitext", "gutenberg", "hf"]
    path: str | None = None
    name: str | None = None
    config: str | None = None
    split: str = "train"
    text_column: str = "text"
    max_documents: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        # "embedded", "wikitext:../shared/data/wikitext-2-raw", "hf:wikitext/wikitext-2-raw-v1:train"
        if isinstance(v, str):
            kind, _, rest = v.partition(":")
            if kind == "hf":
                name, _, split = rest.partition(":")
                name, _, config = name.partition("@")
                return {"kind": "hf", "name": name, "config": config or None, "split": split or "train"}
            if kind in ("text", "wikitext", "gutenberg"):
                return {"kind": kind, "path": rest}
            return {"kind": kind}
        return v

    @model_validator(mode="after")
    def _needs(self) -> "CorpusSource":
        if self.kind in ("text", "wikitext", "gutenberg") and not self.path:
            raise ValueError(f"a '{self.kind}' source needs `path`")
        if self.kind == "hf" and not self.name:
            raise ValueError("an 'hf' source needs `name` (hub id or local dataset folder)")
        return self


class CorpusConfig(Strict):
    sources: list[CorpusSource] = Field(default_factory=lambda: [CorpusSource(kind="embedded")], min_length=1)
    valid_fraction: float = Field(default=0.05, gt=0, lt=0.5)
    test_fraction: float = Field(default=0.05, ge=0, lt=0.5)
    split_seed: int = 0


class TokenizerConfig(Strict):
    vocab_size: int = Field(default=8192, ge=128, le=262144)
    lowercase: bool = True
    min_frequency: int = Field(default=2, ge=1)


# --------------------------------------------------------------------------- objective
class ObjectiveConfig(Strict):
    """How pre-training instances are cut from documents, and the sentence-level task.

    format: segment_pair (BERT), sentence_pair (RoBERTa SENTENCE-PAIR),
            full_sentences (may cross documents), doc_sentences (never crosses).
    sentence: nsp | sop | none. NSP/SOP need a pair format.
    """

    format: Literal["segment_pair", "sentence_pair", "full_sentences", "doc_sentences"] = "segment_pair"
    sentence: Literal["nsp", "sop", "none"] = "nsp"
    max_seq_len: int = Field(default=128, ge=8, le=4096)
    short_seq_prob: float = Field(default=0.1, ge=0, le=1)
    dupe_factor: int = Field(default=1, ge=1, le=100)

    @model_validator(mode="after")
    def _compatible(self) -> "ObjectiveConfig":
        if self.sentence != "none" and self.format not in ("segment_pair", "sentence_pair"):
            raise ValueError(
                f"sentence={self.sentence!r} needs format segment_pair or sentence_pair, got {self.format!r}")
        return self


class MaskingConfig(Strict):
    rate: float = Field(default=0.15, gt=0, lt=1)
    mask: float = Field(default=0.8, ge=0, le=1)
    random: float = Field(default=0.1, ge=0, le=1)
    keep: float = Field(default=0.1, ge=0, le=1)
    unit: Literal["token", "whole_word", "span"] = "token"
    count: Literal["exact", "bernoulli"] = "exact"
    max_predictions: int | None = Field(default=None, ge=1)
    span_p: float = Field(default=0.2, gt=0, le=1)
    span_max: int = Field(default=10, ge=1)
    dynamic: bool = True  # fresh masks per epoch; False = static masks, dupe_factor copies

    @model_validator(mode="after")
    def _sum_to_one(self) -> "MaskingConfig":
        total = self.mask + self.random + self.keep
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"mask + random + keep must sum to 1, got {self.mask} + {self.random} + {self.keep} = {total:g}")
        return self


# --------------------------------------------------------------------------- model / train
class ModelConfig(Strict):
    layers: int = Field(default=2, ge=1, le=48)
    hidden: int = Field(default=128, ge=8)
    heads: int = Field(default=2, ge=1)
    intermediate: int = Field(default=512, ge=8)
    activation: Literal["gelu", "relu", "gelu_new", "silu"] = "gelu"
    dropout: float = Field(default=0.1, ge=0, lt=1)
    attention_dropout: float = Field(default=0.1, ge=0, lt=1)
    max_positions: int = Field(default=512, ge=8)
    init_range: float = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        return self


class TrainConfig(Strict):
    budget: Literal["steps", "tokens", "seconds"] = "steps"
    amount: float = Field(default=200, gt=0)  # steps, tokens or wall-clock seconds, per `budget`
    batch_size: int = Field(default=32, ge=1)  # global batch, sequences per optimizer step
    grad_accum: int = Field(default=1, ge=1)
    lr: float = Field(default=1e-3, gt=0, le=1)
    warmup: float = Field(default=0.06, ge=0, lt=1)  # fraction of the budget
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    weight_decay: float = Field(default=0.01, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.98, ge=0, lt=1)
    eps: float = Field(default=1e-6, gt=0)
    clip: float = Field(default=1.0, ge=0)  # 0 disables clipping
    eval_sequences: int = Field(default=512, ge=1)  # validation sequences in the fixed-reference eval


# The GLUE tasks study/downstream/tasks.py reads; named here so a spec with a typo fails at validation time.
GLUE_TASKS = ("SST-2", "CoLA", "MRPC", "QNLI", "RTE", "STS-B", "MNLI", "WNLI")


class FinetuneConfig(Strict):
    """One recipe for every task (cramming's "GLUE-sane" idea)."""

    tasks: list[Literal[GLUE_TASKS]] = Field(default_factory=lambda: ["SST-2"])  # type: ignore[valid-type]
    glue_dir: str = "../shared/data/glue"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    epochs: float = Field(default=2, gt=0)
    lr: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=32, ge=1)
    max_length: int = Field(default=128, ge=8)
    warmup: float = Field(default=0.1, ge=0, lt=1)
    weight_decay: float = Field(default=0.01, ge=0)
    max_train_examples: int | None = Field(default=2000, ge=1)
    max_eval_examples: int | None = Field(default=None, ge=1)
    probe: bool = True          # feature-based probe on the frozen encoder too
    probe_layers: int = Field(default=1, ge=1)  # concatenate the last k layers' [CLS]
    baseline: bool = True       # random-init model, same recipe


class ImplConfig(Strict):
    """Speed-only settings. Excluded from the run hash; each is loss-neutral by test."""

    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere
    sparse_head: bool = True
    attention: Literal["eager", "sdpa"] = "eager"
    compile: bool = False
    # One fused AdamW kernel (and one foreach gradient-norm) instead of a loop over parameter tensors:
    # transformers' Trainer default too. The same update within float rounding (tests/test_train.py).
    fused_optimizer: bool = True
    # How training dropout draws its keep masks. "bits": 32 random bits per element read from whole
    # 64-bit words (study.model.bert.bits_dropout); on CPU torch's bernoulli_ took ~11 ns per element here and
    # random_ ~7 ns per 64-bit word, and bernoulli_ was 22% of a bf16 step of config b. Same Bernoulli(1-p)
    # masks and arithmetic, another random stream (tests/test_model.py, tests/test_train.py).
    # "auto": bits on CPU, torch's kernel elsewhere (not measured off CPU).
    dropout_masks: Literal["auto", "torch", "bits"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    workers: int = Field(default=0, ge=0)
    log_every: int = Field(default=10, ge=1)
    eval_every: int = Field(default=0, ge=0)  # 0: only at the end
    checkpoint_every: int = Field(default=50, ge=1)
    progress: bool = True


SEMANTIC_SECTIONS = ("corpus", "tokenizer", "objective", "masking", "model", "train")


class RunConfig(Strict):
    """Everything one pre-training run needs, fully resolved."""

    seed: int = 0
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    impl: ImplConfig = Field(default_factory=ImplConfig)

    @model_validator(mode="after")
    def _cross(self) -> "RunConfig":
        if self.objective.max_seq_len > self.model.max_positions:
            raise ValueError(
                f"objective.max_seq_len ({self.objective.max_seq_len}) exceeds model.max_positions ({self.model.max_positions})")
        return self

    # ---- identities -------------------------------------------------------------
    def semantic(self) -> dict:
        """What the pre-trained weights depend on (fine-tuning is hashed separately)."""
        d = self.model_dump(mode="json")
        return {"seed": d["seed"], **{k: d[k] for k in SEMANTIC_SECTIONS}}

    def run_hash(self) -> str:
        return hash_obj(self.semantic())

    def data_hash(self) -> str:
        """Corpus + split + tokenizer: what the tokenizer and tokenized corpus depend on."""
        d = self.model_dump(mode="json")
        return hash_obj({"corpus": d["corpus"], "tokenizer": d["tokenizer"]})

    def finetune_hash(self) -> str:
        d = self.finetune.model_dump(mode="json")
        d.pop("seeds")      # each seed is its own result file
        d.pop("tasks")      # each task is its own result file
        d.pop("glue_dir")   # where the data lies is not what it is
        return hash_obj(d)
