"""The typed configuration of one run: every knob, its default, its allowed range.

This is the only place defaults live. Library code receives these objects and
reads attributes; it never does ``cfg.get(key, default)``.

Sections are split the way cramming splits them:
- *semantic* sections (corpus, tokenizer, objective, masking, model, train)
  change what is measured, so they enter the run hash; `finetune` is semantic
  for the fine-tuning results only (`finetune_hash()`), not for pre-training;
- `impl` holds speed-only settings (device, precision, sparse head, attention
  kernel, threads, logging). Each of them is proven loss-neutral by a test, so it
  is excluded from the hash: the same run trained on a laptop or a GPU is the same
  folder.

What every schema shares (the strict base, the seed rule, the cross-field error) is in study/schema.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from study.io import hash_obj
from study.schema import Seed, SeedList, Strict, cross_field_error
from study.zeroshot_config import ZeroshotConfig, zeroshot_hashes


# --------------------------------------------------------------------------- corpus
class CorpusSource(Strict):
    """One text source. `kind` says how to read it.

    - embedded: the English Wikipedia sample shipped inside the gensim wheel
    - text: a .txt file or a folder of them; blank lines separate documents
    - wikitext: WikiText raw files (a file or a folder of *.raw / *.txt)
    - gutenberg: Project Gutenberg .txt books (a file or folder); header/footer stripped
    - hf: a Hugging Face dataset through `datasets.load_dataset(name, config, split, revision=revision)`;
      `name` may also be a local dataset folder (`save_to_disk` output or data files). `rows` says what
      a row is: `document` (one document per row), `lines` (rows are lines; blank rows separate
      documents) or `wikitext` (rows are WikiText lines: one document per article, detokenized, as the
      wikitext kind reads files). Unset, it is `wikitext` for a name containing "wikitext", else `document`.
    """

    kind: Literal["embedded", "text", "wikitext", "gutenberg", "hf"]
    path: str | None = None
    name: str | None = None
    config: str | None = None
    split: str = "train"
    # hf hub: a commit/tag/branch, in the run hash. None = what the local hub cache holds, hashed as "unpinned"
    # (the commit read is recorded in the data folder's stats.json)
    revision: str | None = None
    text_column: str = "text"
    max_documents: int | None = Field(default=None, ge=1)
    # hf only. Chosen by the config, never by the rows (one blank row must not turn a dataset of books into
    # paragraph documents), and resolved below so that it is in the run hash; None (other kinds) is left out
    # of the dump, which keeps their hashes what they were before the field existed.
    rows: Literal["document", "lines", "wikitext"] | None = Field(
        default=None, exclude_if=lambda v: v is None
    )

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
    def _needs(self) -> CorpusSource:
        if self.kind in ("text", "wikitext", "gutenberg") and not self.path:
            raise ValueError(f"a '{self.kind}' source needs `path`")
        if self.kind == "hf" and not self.name:
            raise ValueError("an 'hf' source needs `name` (hub id or local dataset folder)")
        if self.kind != "hf" and self.rows is not None:
            raise ValueError(f"`rows` is for 'hf' sources; a '{self.kind}' source is read by its kind")
        if self.kind == "hf" and self.rows is None:
            # WikiText on the hub is one row per line with a blank row around every heading and paragraph
            self.rows = "wikitext" if "wikitext" in self.name.lower() else "document"
        return self


class CorpusConfig(Strict):
    sources: list[CorpusSource] = Field(default_factory=lambda: [CorpusSource(kind="embedded")], min_length=1)
    valid_fraction: float = Field(default=0.05, gt=0, lt=0.5)
    test_fraction: float = Field(default=0.05, ge=0, lt=0.5)
    split_seed: Seed = 0
    # What the sources contain (sizes + sha256 of every file read; a hub dataset's name/config/split and its
    # pinned revision, or "unpinned": never the commit the local cache happens to hold), so that an edited
    # corpus is a new data_hash and new run hashes. Resolved, never written by hand:
    # study.data.corpus.with_fingerprint fills it where a config enters (spec runs, search trials, the
    # trainer's driver) and checks a value already there against the files; a spec that sets it is an error.
    # None only in configs built in code (tests, library calls): prepare_data still refuses stale data then.
    fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")


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
    def _compatible(self) -> ObjectiveConfig:
        if self.sentence != "none" and self.format not in ("segment_pair", "sentence_pair"):
            raise ValueError(
                f"sentence={self.sentence!r} needs format segment_pair or sentence_pair, got {self.format!r}"
            )
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
    # The random function that draws the masks (study/data/masking.py): the same rule, other masks, so it
    # is hashed, always (never left out of the dump), and a folder trained before this field existed is
    # never resumed with other masks. counter: a hash of (seed, instance, epoch, position) in int64 torch
    # ops (study/data/counter.py), bitwise the same on CPU and CUDA, made where the instances live. numpy:
    # one torch generator per row seeded by numpy's SeedSequence, the masks of every earlier run.
    generator: Literal["counter", "numpy"] = "counter"

    @model_validator(mode="after")
    def _sum_to_one(self) -> MaskingConfig:
        total = self.mask + self.random + self.keep
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"mask + random + keep must sum to 1, got {self.mask} + {self.random} + {self.keep} = {total:g}"
            )
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
    # Where the LayerNorms sit. post_ln: BERT (HF BertForPreTraining); pre_ln: a LayerNorm before attention and
    # FFN and one after the last layer (HF RobertaPreLayerNorm*, study/model/preln.py), as cramming trains.
    # The default is left out of the dump, so every post-LN run keeps the run hash it had before this field.
    arch: Literal["post_ln", "pre_ln"] = Field(default="post_ln", exclude_if=lambda v: v == "post_ln")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden % self.heads:
            raise cross_field_error(
                "model.heads",
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads})",
                f"a divisor of model.hidden ({self.hidden})",
            )
        return self


class TrainConfig(Strict):
    # "seconds" trains for wall-clock time: how many steps that is depends on the machine, its load and
    # the `impl` speed settings, none of which enter the run hash, so two folders of one hash may hold
    # different models and a resume is not bitwise (meta.json: bitwise_resume false). For a fixed-cost
    # comparison on one machine only; the shipped specs use steps.
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
    # Sequence-length warmup (BERT's own recipe trained 90% of its steps at 128, then 512): the first
    # `short_fraction` of the budget trains on rows of `short_len` tokens (RunConfig.short_phase), the rest
    # at objective.max_seq_len. Short rows let a small model leave the unigram plateau (near-uniform
    # attention over many positions) in far fewer steps (docs/RESULTS.md "the copy plateau"). Both left out
    # of the hash while unset, so no existing run changes identity; short_fraction 0 means no warmup.
    short_len: int | None = Field(default=None, ge=8, exclude_if=lambda v: v is None)
    short_fraction: float = Field(default=0.0, ge=0, lt=1, exclude_if=lambda v: v == 0)

    @model_validator(mode="before")
    @classmethod
    def _no_short_len_without_fraction(cls, data):
        # no warmup (short_fraction 0, e.g. a factor level): one identity whatever short_len says
        if isinstance(data, dict) and not data.get("short_fraction") and data.get("short_len") is not None:
            data = {k: v for k, v in data.items() if k != "short_len"}
        return data

    @model_validator(mode="after")
    def _short_first(self) -> TrainConfig:
        if self.short_fraction > 0 and self.short_len is None:
            raise cross_field_error(
                "train.short_len",
                f"train.short_fraction {self.short_fraction} needs the length of the short rows",
                "an integer >= 8, below objective.max_seq_len",
            )
        return self

    @model_validator(mode="after")
    def _whole_steps(self) -> TrainConfig:
        # A step count is whole: the schedule, `study plan`, the search and the figures rounded 2.5 steps
        # four ways (ceil, as is, floor, times the fraction).
        if self.budget == "steps" and self.amount != int(self.amount):
            raise cross_field_error("train.amount", f"{self.amount} steps", "a whole number of steps")
        return self

    @model_validator(mode="after")
    def _micro_batches(self) -> TrainConfig:
        # Equal micro-batches on one process; the trainer checks the split across processes (world size).
        if self.batch_size % self.grad_accum:
            raise cross_field_error(
                "train.batch_size",
                f"batch size {self.batch_size} does not split into "
                f"grad_accum ({self.grad_accum}) equal micro-batches",
                f"a positive multiple of train.grad_accum ({self.grad_accum})",
            )
        return self


# The GLUE tasks study/downstream/tasks.py reads; named here so a spec with a typo fails at validation time.
GLUE_TASKS = ("SST-2", "CoLA", "MRPC", "QNLI", "RTE", "STS-B", "MNLI", "WNLI")


class FinetuneConfig(Strict):
    """One recipe for every task (cramming's "GLUE-sane" idea)."""

    tasks: list[Literal[GLUE_TASKS]] = Field(default_factory=lambda: ["SST-2"])  # type: ignore[valid-type]
    glue_dir: str = "../shared/data/glue"
    seeds: SeedList = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    epochs: float = Field(default=2, gt=0)
    lr: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=32, ge=1)
    max_length: int = Field(default=128, ge=8)
    warmup: float = Field(default=0.1, ge=0, lt=1)
    weight_decay: float = Field(default=0.01, ge=0)
    max_train_examples: int | None = Field(default=2000, ge=1)
    max_eval_examples: int | None = Field(default=None, ge=1)
    probe: bool = True  # feature-based probe on the frozen encoder too
    probe_layers: int = Field(default=1, ge=1)  # concatenate the last k layers' [CLS] (or means: pooling)
    baseline: bool = True  # random-init model, same recipe
    # Length-grouped batches (HF's group_by_length): each run of k batches of an epoch's shuffle sorted by row
    # length, longest first, so a batch pads less. The same rows per epoch, other batches: semantic, hence
    # hashed; 0 (off, random batches) is left out of the dump so existing recipes keep their finetune_hash.
    length_groups: int = Field(default=0, ge=0, exclude_if=lambda v: v == 0)
    # What the classifier (and the probe) reads: "cls", the pooled [CLS] (BERT's pooler, tanh(W h_[CLS])), or
    # "mean", the mean of the last layer over the row's tokens (padding excluded). Semantic, hence hashed;
    # "cls" is left out of the dump so existing recipes keep their finetune_hash. docs/RESULTS.md
    # "Fine-tuning: [CLS] against mean pooling" for why the cpu recipe reads the mean.
    pooling: Literal["cls", "mean"] = Field(default="cls", exclude_if=lambda v: v == "cls")


class ImplConfig(Strict):
    """Speed-only settings. Excluded from the run hash; each is loss-neutral by test. Where dropout is on,
    several of them (attention, compile, pad_to, dropout_masks) may draw its masks from another stream: the
    same distribution, not bitwise the same model, as a different thread count or GPU is not either."""

    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere
    sparse_head: bool = True
    # The training step's MLM projection and cross-entropy: "chunked" computes them a few rows at a time, the
    # logits never whole (study/model/xent.py; on a CPU at 60% masking 1.9x faster for that part); "torch"
    # is F.cross_entropy over the whole logits. The same loss within float rounding (tests/test_model.py,
    # tests/test_train.py). "auto": chunked on a CPU in fp32, torch elsewhere (not measured on a GPU).
    mlm_loss: Literal["auto", "torch", "chunked"] = "auto"
    attention: Literal["eager", "sdpa"] = "eager"
    # torch.compile of the training step's encoder (model.bert) with static shapes: needs pad_to="max"
    # (one shape per run, so one graph); evaluation stays eager. Loss-neutral within float rounding
    # without dropout (tests/test_train.py, slow); with dropout the compiled kernels draw another stream.
    compile: bool = False
    # "batch": each micro-batch trimmed to its longest row (fewest positions computed). "max": every batch
    # padded to objective.max_seq_len (static shapes for torch.compile / CUDA graphs; padding is masked out
    # of attention and loss, so the loss is the same within float rounding without dropout, tests/test_train.py;
    # with dropout the padded positions draw masks too: another stream).
    pad_to: Literal["batch", "max"] = "batch"
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
    # Steps per history line; also the one host<->device sync of the training loop (losses, grad norms and
    # the divergence check are read then), so a non-finite loss stops the run within log_every steps.
    log_every: int = Field(default=10, ge=1)
    eval_every: int = Field(default=0, ge=0)  # 0: only at the end
    # Checkpoints: every `checkpoint_every` steps (None: no step rule) and whenever `checkpoint_minutes` of
    # wall time passed since the last one (0: no time rule), whichever comes first; always at the end and on
    # SIGTERM. Under DDP the time rule and SIGTERM act at the next log step, where the ranks agree.
    checkpoint_every: int | None = Field(default=None, ge=1)
    checkpoint_minutes: float = Field(default=10.0, ge=0)
    progress: bool = True
    # Live curves: each history line also logged with dvclive into the run's live/ folder, for `dvc plots`
    # and the DVC VS Code extension while it trains (study/pretrain/live.py). Logging only.
    live: bool = False
    # Fine-tune all of a task's seeds as one stacked model (torch.func vmap, study/downstream/batched.py): one
    # step of K x batch rows instead of K steps. Each seed keeps its head init, batches, AdamW and clipping;
    # without dropout (model.dropout and attention_dropout 0) the same results within float rounding
    # (tests/test_finetune_batched.py). With dropout, each seed's masks come from its own generator (seeded by
    # seed and step): another random stream than the sequential loop's, like dropout_masks. Off by default and
    # in every shipped profile (the gpu profile trains with dropout 0.1).
    finetune_batched_seeds: bool = False

    @model_validator(mode="after")
    def _static_shapes(self) -> ImplConfig:
        if self.compile and self.pad_to != "max":
            raise cross_field_error(
                "impl.compile",
                "torch.compile needs static shapes: set impl.pad_to to max",
                "false, or true with impl.pad_to=max",
            )
        return self


SEMANTIC_SECTIONS = ("corpus", "tokenizer", "objective", "masking", "model", "train")


class RunConfig(Strict):
    """Everything one pre-training run needs, fully resolved."""

    seed: Seed = 0
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    zeroshot: ZeroshotConfig = Field(default_factory=ZeroshotConfig)
    impl: ImplConfig = Field(default_factory=ImplConfig)

    @model_validator(mode="after")
    def _cross(self) -> RunConfig:
        """Rules between sections, checked when a spec is validated rather than when training or
        fine-tuning reaches them. (Rules that need the data or the world size stay in the trainer.)"""
        positions = self.model.max_positions
        if self.objective.max_seq_len > positions:
            raise cross_field_error(
                "objective.max_seq_len",
                f"{self.objective.max_seq_len} exceeds model.max_positions ({positions})",
                f"<= model.max_positions ({positions})",
            )
        short = self.train.short_len
        if short is not None and short >= self.objective.max_seq_len:
            raise cross_field_error(
                "train.short_len",
                f"{short} is not shorter than objective.max_seq_len ({self.objective.max_seq_len})",
                f"8..{self.objective.max_seq_len - 1}",
            )
        if self.finetune.max_length > positions:
            raise cross_field_error(
                "finetune.max_length",
                f"{self.finetune.max_length} exceeds model.max_positions ({positions})",
                f"8..{positions}",
            )
        return self

    def short_phase(self) -> RunConfig | None:
        """The config the sequence-length warmup's batches are built from (None without one): rows of
        train.short_len tokens, as many token slots per step as a full batch, i.e. batch_size x
        (max_seq_len // short_len) rows (measured: a small batch of short rows leaves the plateau later per
        token, docs/RESULTS.md); a multiple of batch_size, so grad_accum and the world size still split it."""
        t = self.train
        if t.short_len is None:
            return None
        out = self.model_copy(deep=True)
        out.objective.max_seq_len = t.short_len
        out.train.batch_size = t.batch_size * (self.objective.max_seq_len // t.short_len)
        return out

    # ---- identities -------------------------------------------------------------
    def semantic(self) -> dict:
        """What the pre-trained weights depend on (fine-tuning is hashed separately)."""
        d = self.model_dump(mode="json")
        return {"seed": d["seed"], **{k: d[k] for k in SEMANTIC_SECTIONS}}

    def run_hash(self) -> str:
        return hash_obj(self.semantic())

    def data_hash(self) -> str:
        """Corpus (its settings and, once resolved, its contents' fingerprint) + split + tokenizer: what the
        tokenizer and tokenized corpus depend on."""
        d = self.model_dump(mode="json")
        return hash_obj({"corpus": d["corpus"], "tokenizer": d["tokenizer"]})

    def baseline_key(self) -> str:
        """Run key of the random-init baseline: what a random model depends on, nothing else.

        The architecture (model section), the tokenizer/vocabulary (data_hash) and the init seed. Runs
        that differ only in objective, masking or training share one baseline.
        """
        return "random-" + hash_obj(
            {"model": self.model.model_dump(mode="json"), "data": self.data_hash(), "seed": self.seed}
        )

    def finetune_hash(self) -> str:
        d = self.finetune.model_dump(mode="json")
        d.pop("seeds")  # each seed is its own result file
        d.pop("tasks")  # each task is its own result file
        d.pop("glue_dir")  # where the data lies is not what it is
        return hash_obj(d)

    def zeroshot_hashes(self) -> dict[str, str]:
        """{evaluation: the identity of its results} (study/zeroshot_config.py)."""
        return zeroshot_hashes(self)
