"""The pre-training trainer on a tiny synthetic corpus: run folder, skip-if-done, schedule, bitwise resume
after SIGKILL and SIGTERM, checkpoints by steps and by time, damaged checkpoints, divergence found at the
log-window sync, loss-neutral impl settings (static shapes, compile: slow), config errors, DDP (slow)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from study.config import RunConfig
from study.cpu import THREADS_ENV
from study.data.corpus import with_fingerprint
from study.errors import EXIT_INTERRUPTED, Diverged, Interrupted, StudyError
from study.paths import Layout
from study.pretrain.__main__ import main
from study.pretrain.checkpoint import read_checkpoint
from study.pretrain.evaluate import short_reference_set
from study.pretrain.loop import NAN_ENV
from study.pretrain.schedule import lr_curve
from study.pretrain.trainer import train_run
from study.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# metrics that depend only on the config (not on timing): these must be bitwise equal across resumes
EXACT = (
    "ref_mlm_loss",
    "ref_mlm_acc",
    "ref_ppl",
    "sentence_acc",
    "tokens_seen",
    "steps",
    "params",
    "positions_computed",
    "masked_seen",
    "final_loss",
    "ref_sequences",
    "ref_masked",
)


def _corpus_text(n_docs: int = 60, seed: int = 0) -> str:
    """Documents from a small grammar over ~350 made-up words: learnable, and a WordPiece vocab of ~400."""
    rng = np.random.default_rng(seed)
    syl = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = sorted({"".join(rng.choice(syl, size=int(rng.integers(1, 4)))) for _ in range(600)})[:360]
    det, adj, noun, verb = words[:10], words[10:80], words[80:240], words[240:]
    docs = []
    for _ in range(n_docs):
        topic = rng.choice(noun, size=8)  # each document keeps returning to a few nouns
        sents = []
        for _ in range(int(rng.integers(6, 12))):
            n1 = topic[rng.integers(8)] if rng.random() < 0.6 else rng.choice(noun)
            s = [rng.choice(det), rng.choice(adj), n1, rng.choice(verb), rng.choice(det), rng.choice(noun)]
            sents.append(" ".join(s).capitalize() + ".")
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    f.write_text(_corpus_text(), encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def data_dir(corpus, tmp_path_factory) -> Path:
    """One prepared data folder shared by every run of this module.

    Runs that are compared must see the same token ids; WordPiece training in `tokenizers` assigns
    the ids of equal-count alphabet pieces in hash-map order, which differs between calls, so two
    separate prepare_data calls would not give the same ids (reported to the tokenizer owner).
    """
    from study.data.prepare import prepare_data

    cfg = make_cfg(corpus)
    return prepare_data(cfg, Layout(root=tmp_path_factory.mktemp("data")), progress=False).dir


@pytest.fixture
def layout(data_dir, tmp_path):
    """layout("name") -> a fresh Layout under tmp_path holding a copy of the shared data folder."""

    def make(name: str) -> Layout:
        lay = Layout(root=tmp_path / name)
        shutil.copytree(data_dir, lay.data_dir(data_dir.name))
        return lay

    return make


def make_cfg(corpus: Path, **over) -> RunConfig:
    d = {
        "corpus": {"sources": [{"kind": "text", "path": str(corpus)}], "valid_fraction": 0.15},
        "tokenizer": {"vocab_size": 400},
        "objective": {"format": "segment_pair", "sentence": "nsp", "max_seq_len": 32},
        "model": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 64},
        "train": {"amount": 30, "batch_size": 8, "lr": 2e-3, "eval_sequences": 32},
        "finetune": {
            "max_length": 64
        },  # within model.max_positions (RunConfig checks it); not in the run hash
        "impl": {"threads": 1, "log_every": 1, "checkpoint_every": 10, "progress": False},
    }
    for key, value in over.items():
        section, _, name = key.partition("__")
        d.setdefault(section, {})[name] = value
    # resolved as a spec's runs are (the corpus contents enter the run hash), so that the driver
    # `python -m study.pretrain`, which resolves a bare config, trains the very same run hash
    return with_fingerprint(RunConfig.model_validate(d))


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def events(run_dir: Path) -> list[dict]:
    p = run_dir / "events.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def stable_history(run_dir: Path) -> list[dict]:
    """history.jsonl without the timing field: must be identical for an interrupted and a clean run."""
    return [{k: v for k, v in h.items() if k != "tokens_per_s"} for h in history(run_dir)]


def losses(run_dir: Path) -> list[float]:
    return [h["loss"] for h in history(run_dir) if "loss" in h]


def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / "model" / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


# --------------------------------------------------------------------------- schedule
def test_schedule_shapes(corpus):
    lin = lr_curve(make_cfg(corpus, train__amount=100, train__warmup=0.1, train__lr=1.0))
    assert len(lin) == 100
    assert lin[0] == pytest.approx(0.1) and lin[9] == pytest.approx(1.0)  # linear warmup over 10 steps
    assert np.all(np.diff(lin[:10]) > 0) and np.all(np.diff(lin[10:]) < 0)  # then strictly down
    assert lin[10] == pytest.approx(1.0) and lin[-1] == pytest.approx(1 / 90)  # linear to ~0
    cos = lr_curve(
        make_cfg(corpus, train__amount=100, train__warmup=0.1, train__lr=1.0, train__schedule="cosine")
    )
    assert cos[55] == pytest.approx(0.5)  # half way through the decay
    assert cos[30] > lin[30] and cos[80] < lin[80]  # cosine: above, then below
    const = lr_curve(
        make_cfg(corpus, train__amount=100, train__warmup=0.0, train__lr=1.0, train__schedule="constant")
    )
    assert set(const) == {1.0}


# --------------------------------------------------------------------------- run folder
def test_run_folder_history_and_hf_loading(corpus, layout, tmp_path, monkeypatch):
    from transformers import AutoModel, AutoModelForMaskedLM, pipeline

    cfg = make_cfg(corpus, impl__eval_every=10)
    lay = layout("results")
    seen = []
    m = train_run(cfg, lay, quiet=True, on_eval=lambda step, tokens, ev: seen.append((step, tokens, ev)))
    run = lay.run_dir(cfg.run_hash())
    assert {p.name for p in run.iterdir()} >= {
        "config.json",
        "meta.json",
        "status.json",
        "history.jsonl",
        "metrics.json",
        "model",
        "checkpoints",
    }
    assert json.loads((run / "status.json").read_text()) == {"status": "done", "error": None, "step": 30}
    # status.json is written last
    others = [p.stat().st_mtime_ns for p in run.iterdir() if p.is_file() and p.name != "status.json"]
    assert (run / "status.json").stat().st_mtime_ns >= max(others)
    assert json.loads((run / "config.json").read_text())["run_hash"] == cfg.run_hash()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["run_hash"] == cfg.run_hash() and meta["data_hash"] == cfg.data_hash()
    assert meta["device"] == "cpu" and meta["params"] == m["params"] > 0 and "git" in meta["provenance"]
    for key in (
        "ref_mlm_loss",
        "ref_mlm_acc",
        "ref_ppl",
        "sentence_acc",
        "tokens_seen",
        "steps",
        "tokens_per_s",
        "mfu",
        "params",
        "wall_s",
        "peak_flops",
    ):
        assert m[key] is not None, key
    assert m["steps"] == 30 and m["ref_ppl"] == pytest.approx(np.exp(m["ref_mlm_loss"]))
    assert 0 < m["mfu"] < 1 and m["peak_flops"] > 1e9 and 0 <= m["sentence_acc"] <= 1
    assert m["vocab_size"] > 250  # the tiny corpus gives a real WordPiece vocabulary
    # on_eval after every eval (10, 20) and at the end (30); the last one is the metrics
    assert [s for s, _, _ in seen] == [10, 20, 30]
    assert seen[-1][2]["ref_mlm_loss"] == m["ref_mlm_loss"] and seen[-1][1] == m["tokens_seen"]
    # history: one line per step (log_every=1) with the LR schedule, eval events, loss goes down
    h = [e for e in history(run) if "loss" in e]
    assert [e["step"] for e in h] == list(range(1, 31))
    assert [e["lr"] for e in h] == pytest.approx(lr_curve(cfg))
    assert all(e["sentence_loss"] is not None and e["tokens_per_s"] > 0 for e in h)
    assert [e["step"] for e in history(run) if "eval" in e] == [10, 20, 30]
    assert np.mean([e["loss"] for e in h[-5:]]) < np.mean([e["loss"] for e in h[:5]]) - 0.3
    assert not list((run / "checkpoints").glob("*.pt"))  # resume state removed once done
    # the model folder is a standard HF checkpoint
    mlm = AutoModelForMaskedLM.from_pretrained(run / "model")
    enc = AutoModel.from_pretrained(run / "model")
    assert enc.config.hidden_size == 32 and mlm.config.vocab_size == m["vocab_size"]
    fill = pipeline("fill-mask", model=str(run / "model"), top_k=2)
    assert len(fill("the [MASK] is here")) == 2
    # its tokenizer truncates to what the model takes (the data stage's has no limit: a long text crashed)
    conf = json.loads((run / "model" / "tokenizer_config.json").read_text())
    assert conf["model_max_length"] == cfg.model.max_positions and "local_files_only" not in conf
    long = fill.tokenizer(" ".join(["the [MASK] is here"] * 40), truncation=True, return_tensors="pt")
    assert long["input_ids"].shape[1] == cfg.model.max_positions
    assert mlm(**long).logits.shape[1] == cfg.model.max_positions
    # a second call trains nothing and returns the same metrics
    monkeypatch.setattr(
        "study.pretrain.trainer.Trainer.run", lambda self: pytest.fail("trained a finished run")
    )
    assert train_run(cfg, lay, quiet=True) == m


def test_rescore_adds_missing_fields_only_when_stored_scores_reproduce(corpus, layout, monkeypatch):
    """`study rescore`: an old run (metrics without ref_mode_acc) gets the field from its saved model;
    stored numbers are never overwritten, and a run whose stored scores do not come back is left alone."""
    from study.pretrain.rescore import rescore_run

    cfg = make_cfg(corpus, train__amount=12, impl__checkpoint_every=100)
    lay = layout("r")
    full = train_run(cfg, lay, quiet=True)
    run = lay.run_dir(cfg.run_hash())
    old = {k: v for k, v in full.items() if k != "ref_mode_acc"}  # as written before the field existed
    (run / "metrics.json").write_text(json.dumps(old))

    res = rescore_run(cfg, lay)
    assert res.ok and res.added == ["ref_mode_acc"], res
    assert res.deviation["ref_mlm_loss"] < 1e-6 and res.deviation["ref_masked"] == 0
    assert metrics(run) == {
        **old,
        "ref_mode_acc": full["ref_mode_acc"],
    }  # the value training would have written
    assert [r["added"] for r in json.loads((run / "meta.json").read_text())["rescores"]] == [["ref_mode_acc"]]
    assert rescore_run(cfg, lay).added == []  # up to date: nothing written again
    assert len(json.loads((run / "meta.json").read_text())["rescores"]) == 1
    # scored on the run's own impl.threads (the thread count moves the loss), as training was: it ignored it
    import study.pretrain.rescore as rescore_mod
    from study.runtime import threads

    seen, real = [], rescore_mod.evaluate
    monkeypatch.setattr(
        rescore_mod, "evaluate", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k)
    )
    with threads(2 if torch.get_num_threads() == 1 else 1):
        rescore_run(cfg.model_copy(update={"impl": cfg.impl.model_copy(update={"threads": 3})}), lay)
    assert seen == [3]
    monkeypatch.undo()

    # stored scores that the saved model does not give back: reported, nothing written
    bad = {
        **old,
        "ref_mlm_loss": old["ref_mlm_loss"] * 1.01,
        "sentence_acc": (old["sentence_acc"] + 0.5) % 1.0,
    }
    (run / "metrics.json").write_text(json.dumps(bad))
    before = (run / "metrics.json").read_bytes()
    res = rescore_run(cfg, lay)
    assert not res.ok and set(res.mismatch) == {"ref_mlm_loss", "sentence_acc"}, res
    assert (run / "metrics.json").read_bytes() == before

    # an unfinished run has no model to score
    other = make_cfg(corpus, train__amount=13)
    with pytest.raises(StudyError, match="pending"):
        rescore_run(other, lay)


def test_tokens_budget_and_no_sentence_task(corpus, layout, tmp_path):
    cfg = make_cfg(
        corpus,
        objective__sentence="none",
        objective__format="doc_sentences",
        train__budget="tokens",
        train__amount=2000,
        impl__log_every=5,
    )
    m = train_run(cfg, layout("r"), quiet=True)
    assert m["sentence_acc"] is None
    per_step = 8 * 32  # at most batch x max_seq_len real tokens per step
    assert 2000 <= m["tokens_seen"] < 2000 + per_step and m["steps"] >= 2000 // per_step


def test_seconds_budget_stops_on_time_and_says_it_cannot_resume_bitwise(corpus, layout, monkeypatch):
    """A seconds budget follows the clock the trainer reads (time.perf_counter in study.pretrain.loop and .trainer, read
    at each step's start and end). Here that clock is fake and moves 1/8 s per reading, so every step lasts
    exactly 1/8 s whatever the machine's speed: a 1 s budget is 8 steps, and the LR schedule follows it."""
    readings = itertools.count()
    fake = types.SimpleNamespace(perf_counter=lambda: next(readings) / 8)
    monkeypatch.setattr("study.pretrain.trainer.time", fake)
    monkeypatch.setattr("study.pretrain.loop.time", fake)
    cfg = make_cfg(corpus, train__budget="seconds", train__amount=1.0, train__warmup=0.06, impl__log_every=1)
    lay = layout("r")
    m = train_run(cfg, lay, quiet=True)
    run = lay.run_dir(cfg.run_hash())
    assert m["time_s"] == 1.0 and m["steps"] == len(losses(run)) == 8
    # the LR of step k is set before its length is known: progress after it is estimated from the previous
    # step's length (none for step 1: 0, still in warmup), so step k >= 2 is past the 6% warmup, at linear decay
    # 1 - (p_before - 0.06) / 0.94 with p_before = (k - 1) / 8
    lrs = [h["lr"] for h in history(run) if "lr" in h]
    want = [0.0] + [cfg.train.lr * (1 - ((k - 1) / 8 - 0.06) / 0.94) for k in range(2, 9)]
    assert lrs == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert json.loads((run / "meta.json").read_text())["bitwise_resume"] is False


# --------------------------------------------------------------------------- faults
def _subprocess_env() -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO),
    )
    env.pop(NAN_ENV, None)
    return env


def _driver(cfg_path: Path, results: Path) -> list[str]:
    return [PY, "-m", "study.pretrain", str(cfg_path), "--results", str(results), "--quiet"]


@pytest.mark.slow  # four fresh interpreters (torch + transformers imports); the in-process resume is fast
def test_resume_is_bitwise_after_sigkill(corpus, layout, tmp_path):
    """Kill a real training process with SIGKILL several times, just after it writes a checkpoint
    (so the kill lands mid-run, between checkpoints); the resumed run must end bitwise equal."""
    cfg = make_cfg(corpus, train__amount=60, impl__checkpoint_every=4, impl__log_every=3, impl__eval_every=25)
    ref = layout("ref")
    train_run(cfg, ref, quiet=True)

    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(cfg.model_dump_json())
    killed = layout("killed")
    run = killed.run_dir(cfg.run_hash())
    kills, last = 0, 0
    for _ in range(3):
        proc = subprocess.Popen(
            _driver(cfg_path, killed.root),
            cwd=REPO,
            env=_subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        target = None
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:
            steps = (
                sorted(int(p.stem.split("-")[1]) for p in (run / "checkpoints").glob("step-*.pt"))
                if (run / "checkpoints").exists()
                else []
            )
            if steps and steps[-1] > last:
                target = steps[-1]
                break
            time.sleep(0.002)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if not (run / "status.json").exists():
                kills += 1
                last = target or last
        else:
            assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
            break
    assert kills >= 1, "no kill landed mid-run"
    out = subprocess.run(
        _driver(cfg_path, killed.root),
        cwd=REPO,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((run / "status.json").read_text())["status"] == "done"
    ref_run = ref.run_dir(cfg.run_hash())
    assert_same_weights(ref_run, run)
    a, b = metrics(ref_run), metrics(run)
    assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
    assert stable_history(ref_run) == stable_history(run)  # resumed lines dropped, then logged again
    resumes = [e for e in events(run) if e["event"] == "resume"]
    assert len(resumes) == kills and json.loads((run / "meta.json").read_text())["sessions"] == kills + 1
    starts = [e for e in events(run) if e["event"] == "start"]
    assert len(starts) == kills + 1 and not starts[0]["resumed"] and all(e["resumed"] for e in starts[1:])


class Stop(Exception):
    pass


def _stop_at(step_to_stop: int):
    def hook(step, tokens, ev):
        if step == step_to_stop:
            raise Stop(step)

    return hook


def test_on_eval_stop_keeps_run_resumable_and_damaged_checkpoints_fall_back(corpus, layout, tmp_path):
    cfg = make_cfg(corpus, impl__eval_every=10, impl__checkpoint_every=10)
    ref = layout("ref")
    train_run(cfg, ref, quiet=True)
    ref_run = ref.run_dir(cfg.run_hash())

    lay = layout("b")
    run = lay.run_dir(cfg.run_hash())
    with pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(20))
    assert not (run / "status.json").exists()  # pruned: resumable, not finished
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.glob("*.pt")) == ["step-00000010.pt", "step-00000020.pt"]
    assert read_checkpoint(ck / "step-00000020.pt")["step"] == 20
    # truncate the newest checkpoint: it must be detected, reported, and the previous one used
    data = (ck / "step-00000020.pt").read_bytes()
    (ck / "step-00000020.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="sha256"):
        read_checkpoint(ck / "step-00000020.pt")
    with pytest.warns(RuntimeWarning, match="step-00000020.pt rejected"):
        train_run(cfg, lay, quiet=True)
    assert [e["step"] for e in events(run) if e["event"] == "resume"] == [10]
    assert any("rejected" in e.get("message", "") for e in events(run))
    assert stable_history(run) == stable_history(ref_run)  # resumed lines dropped, then logged again
    assert_same_weights(ref_run, run)
    assert {k: metrics(ref_run)[k] for k in EXACT} == {k: metrics(run)[k] for k in EXACT}

    # every checkpoint damaged (a flipped byte): reported, then a fresh start that still ends equal
    lay2 = layout("c")
    run2 = lay2.run_dir(cfg.run_hash())
    with pytest.raises(Stop):
        train_run(cfg, lay2, quiet=True, on_eval=_stop_at(20))
    for p in (run2 / "checkpoints").glob("*.pt"):
        raw = bytearray(p.read_bytes())
        raw[-100] ^= 0xFF
        p.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="from scratch"):
        train_run(cfg, lay2, quiet=True)
    assert_same_weights(ref_run, run2)


def test_a_fresh_start_after_rejected_checkpoints_keeps_its_own(corpus, layout):
    """Every checkpoint damaged -> training starts from scratch. Its first checkpoint (step 10) has a lower
    step than the rejected files, which counted as the newest two: the write deleted the new file, so a
    second interruption started from scratch again. Now a write removes the rejected later files."""
    cfg = make_cfg(corpus, impl__eval_every=10, impl__checkpoint_every=10)
    lay = layout("a")
    run = lay.run_dir(cfg.run_hash())
    with pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(20))
    for p in (run / "checkpoints").glob("*.pt"):
        p.write_bytes(p.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match="from scratch"), pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(10))
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt")) == ["step-00000010.pt"]
    train_run(cfg, lay, quiet=True)
    assert [e["from"] for e in events(run) if e["event"] == "resume"] == ["step-00000010.pt"]


def test_an_intact_checkpoint_that_does_not_load_is_an_error_and_kept(corpus, layout):
    """A checkpoint that passes its checksum but does not fit the code (here a renamed parameter, as after
    a refactor) stops the run with an error naming the file, and every checkpoint is kept: the one before
    it was written by the same code, and starting from scratch would throw away its training."""
    from study.pretrain.checkpoint import write_checkpoint

    cfg = make_cfg(corpus, impl__eval_every=10, impl__checkpoint_every=10)
    lay = layout("a")
    ck = lay.run_dir(cfg.run_hash()) / "checkpoints"
    with pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(20))
    obj = read_checkpoint(ck / "step-00000020.pt")
    obj["model"] = {f"renamed.{k}": v for k, v in obj["model"].items()}
    write_checkpoint(ck, 20, obj)
    before = {p.name: p.read_bytes() for p in ck.glob("*.pt")}
    with pytest.raises(StudyError, match="step-00000020.pt is intact but does not load"):
        train_run(cfg, lay, quiet=True)
    assert {p.name: p.read_bytes() for p in ck.glob("*.pt")} == before


def _sigterm_at(monkeypatch, step: int, sig: int = signal.SIGTERM, times: int = 1) -> None:
    """SIGTERM (or `sig`, `times` times) to this process in the middle of `step` (after its backward passes,
    before its update: the fault suite's kill point); the trainer's handler only sets a flag, so the test
    process lives on."""
    from study import faults

    real_point = faults.point

    def point(name, detail=""):
        if name == "train.step" and detail.endswith(f" step {step}"):
            for _ in range(times):
                os.kill(os.getpid(), sig)
        real_point(name, detail)

    monkeypatch.setattr(faults, "point", point)


def test_ctrl_c_in_the_commands_process_checkpoints_and_twice_stops_at_once(corpus, layout, monkeypatch):
    """With --jobs 1 a run trains in the command's own process, where only SIGTERM was handled: Ctrl-C
    was a bare KeyboardInterrupt, with no checkpoint (the docs promised one) and a traceback. Now Ctrl-C
    finishes the step and checkpoints as SIGTERM does (Interrupted, exit 143); a second one stops at once
    (KeyboardInterrupt, exit 130); Python's own handler is back after either."""
    from study import cli

    cfg = make_cfg(corpus, train__amount=20, impl__checkpoint_every=None, impl__checkpoint_minutes=0)
    lay = layout("a")
    ck = lay.run_dir(cfg.run_hash()) / "checkpoints"
    # a background job (CI under nohup ... &) starts with SIGINT ignored: Python's own handler, as at a terminal
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _sigterm_at(monkeypatch, 8, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as err:  # not Interrupted: a bare Ctrl-C, not the session's end
            train_run(cfg, lay, quiet=True)
        assert (
            isinstance(err.value, Interrupted)
            and err.value.step == 8
            and [p.name for p in ck.glob("*.pt")] == ["step-00000008.pt"]
        )
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        _sigterm_at(monkeypatch, 11, signal.SIGINT, times=2)
        with pytest.raises(KeyboardInterrupt) as err:
            train_run(cfg, lay, quiet=True)
        assert not isinstance(err.value, Interrupted)
        assert [p.name for p in ck.glob("*.pt")] == ["step-00000008.pt"]  # none for the stop at once
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old)
    for exc, code in ((Interrupted(8), 143), (KeyboardInterrupt(), 130)):

        def raising(args, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "cmd_pretrain", raising)
        assert cli.main(["pretrain", "ablations/smoke.yaml"]) == code


def test_sigterm_finishes_the_step_checkpoints_and_resumes_bitwise(corpus, layout, tmp_path, monkeypatch):
    """SIGTERM during step 8: the step finishes, a checkpoint of step 8 is written, no status (the run stays
    pending), the driver exits 143; SIGTERM again at step 11 of the next session (Interrupted, a
    KeyboardInterrupt: `except Exception` does not record it as a failure); the third session ends bitwise
    equal to an uninterrupted run. The step and time rules are off: the only checkpoints are SIGTERM's."""
    cfg = make_cfg(
        corpus, train__amount=20, impl__checkpoint_every=None, impl__checkpoint_minutes=0, impl__log_every=3
    )
    ref = layout("ref")
    train_run(cfg, ref, quiet=True)
    ref_run = ref.run_dir(cfg.run_hash())
    handler = signal.getsignal(signal.SIGTERM)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(cfg.model_dump_json())
    lay = layout("b")
    run = lay.run_dir(cfg.run_hash())
    _sigterm_at(monkeypatch, 8)
    assert main([str(cfg_path), "--results", str(lay.root), "--quiet"]) == EXIT_INTERRUPTED == 143
    assert signal.getsignal(signal.SIGTERM) is handler  # the caller's handler is back
    assert not (run / "status.json").exists()
    assert [p.name for p in (run / "checkpoints").glob("*.pt")] == ["step-00000008.pt"]
    assert [e["step"] for e in events(run) if e["event"] == "interrupted"] == [8]
    _sigterm_at(monkeypatch, 11)
    with pytest.raises(Interrupted) as err:
        train_run(cfg, lay, quiet=True)
    assert err.value.step == 11 and isinstance(err.value, KeyboardInterrupt)
    monkeypatch.undo()
    train_run(cfg, lay, quiet=True)
    assert [e["step"] for e in events(run) if e["event"] == "resume"] == [8, 11]
    assert_same_weights(ref_run, run)
    assert stable_history(ref_run) == stable_history(run)
    assert {k: metrics(ref_run)[k] for k in EXACT} == {k: metrics(run)[k] for k in EXACT}


@pytest.mark.parametrize(
    "every, minutes, kept",
    [
        (None, 1e-9, ["step-00000009.pt", "step-00000010.pt"]),  # by time: every step (the newest two kept)
        (None, 0, ["step-00000010.pt"]),  # no rule: only the checkpoint of the stop
        (4, 0, ["step-00000008.pt", "step-00000010.pt"]),  # by steps
        (4, 10, ["step-00000008.pt", "step-00000010.pt"]),  # both: ten minutes never pass here
    ],
)
def test_checkpoints_by_steps_and_by_time(corpus, layout, every, minutes, kept):
    cfg = make_cfg(
        corpus, impl__eval_every=10, impl__checkpoint_every=every, impl__checkpoint_minutes=minutes
    )
    lay = layout("r")
    with pytest.raises(Stop):
        train_run(cfg, lay, quiet=True, on_eval=_stop_at(10))
    assert sorted(p.name for p in (lay.run_dir(cfg.run_hash()) / "checkpoints").glob("*.pt")) == kept


def test_divergence_is_recorded_and_raised(corpus, layout, tmp_path, monkeypatch):
    cfg = make_cfg(corpus, impl__checkpoint_every=5)
    lay = layout("r")
    monkeypatch.setenv(NAN_ENV, "7")
    with pytest.raises(Diverged) as err:
        train_run(cfg, lay, quiet=True)
    assert err.value.step == 7 and not np.isfinite(err.value.loss)
    run = lay.run_dir(cfg.run_hash())
    st = json.loads((run / "status.json").read_text())
    assert st["status"] == "diverged" and st["step"] == 7 and "non-finite loss" in st["error"]
    assert not (run / "metrics.json").exists() and not (run / "model").exists()
    assert [e["step"] for e in events(run) if e["event"] == "diverged"] == [7]
    # calling again does not train: the recorded divergence is raised again
    monkeypatch.delenv(NAN_ENV)
    monkeypatch.setattr(
        "study.pretrain.trainer.Trainer.run", lambda self: pytest.fail("retrained a diverged run")
    )
    with pytest.raises(Diverged):
        train_run(cfg, lay, quiet=True)


def test_divergence_between_syncs_is_found_at_the_next_and_nothing_of_it_is_saved(
    corpus, layout, monkeypatch
):
    """Steps are read back from the device once per log window (impl.log_every): a NaN at step 7 with logs at
    4 and 8 is found at the step-8 sync. The status still names step 7, and nothing from step 7 on was
    written: no history line, no checkpoint (the step-8 checkpoint would have been, it checks first)."""
    cfg = make_cfg(corpus, impl__log_every=4, impl__checkpoint_every=4)
    lay = layout("r")
    monkeypatch.setenv(NAN_ENV, "7")
    with pytest.raises(Diverged) as err:
        train_run(cfg, lay, quiet=True)
    run = lay.run_dir(cfg.run_hash())
    st = json.loads((run / "status.json").read_text())
    assert err.value.step == 7 and st["status"] == "diverged" and st["step"] == 7 and st["loss"] == "nan"
    assert [h["step"] for h in history(run)] == [4]
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt")) == ["step-00000004.pt"]
    assert [e["step"] for e in events(run) if e["event"] == "diverged"] == [7]


# --------------------------------------------------------------------------- impl is speed-only
def test_impl_settings_do_not_change_the_loss_curve(corpus, layout, tmp_path):
    """sparse/full head x eager/SDPA attention (and a prefetch worker), fused vs looped AdamW, and the MLM
    loss in row chunks vs over the whole logits give the same training curve; all share one run hash
    because impl is not semantic."""
    curves, hashes, evals, layout_of = {}, set(), {}, {}
    for sparse in (True, False):
        for attn in ("eager", "sdpa"):
            cfg = make_cfg(
                corpus,
                train__amount=20,
                impl__sparse_head=sparse,
                impl__attention=attn,
                impl__workers=1 if attn == "sdpa" else 0,
            )
            lay = layout_of[(sparse, attn)] = layout(f"{sparse}-{attn}")
            m = train_run(cfg, lay, quiet=True)
            hashes.add(cfg.run_hash())
            curves[(sparse, attn)] = np.array(losses(lay.run_dir(cfg.run_hash())))
            evals[(sparse, attn)] = m["ref_mlm_loss"]
    # AdamW as a loop over parameter tensors (and a per-tensor gradient norm) instead of the fused kernels
    cfg = make_cfg(corpus, train__amount=20, impl__fused_optimizer=False)
    lay = layout_of["loop"] = layout("loop-adamw")
    m = train_run(cfg, lay, quiet=True)
    hashes.add(cfg.run_hash())
    curves["loop"], evals["loop"] = np.array(losses(lay.run_dir(cfg.run_hash()))), m["ref_mlm_loss"]
    # the MLM loss over the whole logits instead of in row chunks (impl.mlm_loss auto is chunked on a CPU)
    cfg = make_cfg(corpus, train__amount=20, impl__mlm_loss="torch")
    lay = layout_of["torch-xent"] = layout("torch-xent")
    m = train_run(cfg, lay, quiet=True)
    hashes.add(cfg.run_hash())
    curves["torch-xent"], evals["torch-xent"] = (
        np.array(losses(lay.run_dir(cfg.run_hash()))),
        m["ref_mlm_loss"],
    )
    # meta.json names the kernel that ran: "auto" resolves to chunked on a CPU in fp32
    assert RunDir(lay, cfg.run_hash()).meta()["mlm_loss"] == "torch"
    assert RunDir(layout_of[(True, "eager")], cfg.run_hash()).meta()["mlm_loss"] == "chunked"
    assert len(hashes) == 1
    base = curves[(True, "eager")]
    assert len(base) == 20 and base[-1] < base[0]
    for k, c in curves.items():
        np.testing.assert_allclose(c, base, rtol=2e-4, atol=2e-4, err_msg=str(k))
        assert evals[k] == pytest.approx(evals[(True, "eager")], rel=2e-4)
    # evaluation, checkpointing (by steps, and by time: ~every step), prefetching and logging (the host sync
    # of the loop) draw no random numbers: bitwise the same run
    cfg = make_cfg(
        corpus,
        train__amount=20,
        impl__workers=2,
        impl__eval_every=5,
        impl__checkpoint_every=3,
        impl__checkpoint_minutes=1e-9,
        impl__log_every=7,
    )
    lay = layout("busy")
    train_run(cfg, lay, quiet=True)
    assert_same_weights(lay.run_dir(cfg.run_hash()), layout_of[(True, "eager")].run_dir(cfg.run_hash()))


def test_bits_dropout_moves_the_curve_no_further_than_another_dropout_stream(corpus, layout, monkeypatch):
    """impl.dropout_masks="bits" draws the same Bernoulli masks from another random stream (bitwise torch's
    arithmetic given a mask: tests/test_model.py), so it cannot be bitwise loss-neutral; what it must not do
    is move training further than a different dropout stream of torch's own kernel does. Same data, init
    and MLM masks throughout; only the dropout stream (DROPOUT_TAG) and the mask kernel change."""
    curves, evals = {}, {}
    for kind, tags in (("torch", (1, 2, 3)), ("bits", (1, 2))):
        for tag in tags:
            monkeypatch.setattr("study.pretrain.trainer.DROPOUT_TAG", tag)
            cfg = make_cfg(corpus, train__amount=40, impl__dropout_masks=kind)
            assert cfg.model.dropout > 0 and cfg.model.attention_dropout > 0
            lay = layout(f"{kind}{tag}")
            evals[kind, tag] = train_run(cfg, lay, quiet=True)["ref_mlm_loss"]
            curves[kind, tag] = np.array(losses(lay.run_dir(cfg.run_hash())))
            meta = json.loads((lay.run_dir(cfg.run_hash()) / "meta.json").read_text())
            assert meta["dropout_masks"] == kind
    torch_runs = [k for k in curves if k[0] == "torch"]
    bits_runs = [k for k in curves if k[0] == "bits"]

    def dist(a, b) -> float:
        return float(np.mean(np.abs(curves[a] - curves[b])))

    between_streams = max(dist(a, b) for a in torch_runs for b in torch_runs if a < b)
    assert between_streams > 0  # dropout is on: another stream gives another curve
    for b in bits_runs:
        for a in torch_runs:
            assert 0 < dist(a, b) <= 2 * between_streams, (a, b, dist(a, b), between_streams)
    torch_mean = np.mean([evals[k] for k in torch_runs])
    eval_spread = max(evals[k] for k in torch_runs) - min(evals[k] for k in torch_runs)
    for b in bits_runs:
        assert abs(evals[b] - torch_mean) <= 2 * eval_spread, evals


def test_sdpa_trains_like_eager_without_dropout(corpus, layout, monkeypatch):
    """With dropout (the grid above) the CPU's bits masks run eager arithmetic for impl.attention sdpa too
    (study.model.bert._bits_attention); without dropout sdpa must really go through torch's
    scaled_dot_product_attention, forward and backward, and train the same curve as eager."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = {"n": 0, "grad": 0}

    def spy(*args, **kwargs):
        calls["n"] += 1
        calls["grad"] += torch.is_grad_enabled()
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    curves, evals, counts, trained = {}, {}, {}, {}
    for attn in ("eager", "sdpa"):
        calls.update(n=0, grad=0)
        cfg = make_cfg(
            corpus, train__amount=12, impl__attention=attn, model__dropout=0.0, model__attention_dropout=0.0
        )
        lay = layout(attn)
        evals[attn] = train_run(cfg, lay, quiet=True)["ref_mlm_loss"]
        curves[attn] = np.array(losses(lay.run_dir(cfg.run_hash())))
        trained[attn] = weights(lay.run_dir(cfg.run_hash()))
        counts[attn] = dict(calls)
    assert counts["eager"] == {"n": 0, "grad": 0}
    # every training step's forward (2 layers) went through SDPA, with autograd on: its backward ran too
    assert counts["sdpa"]["grad"] >= 12 * 2, counts
    assert len(curves["eager"]) == 12 and curves["eager"][-1] < curves["eager"][0]
    np.testing.assert_allclose(curves["sdpa"], curves["eager"], rtol=2e-4, atol=2e-4)
    assert evals["sdpa"] == pytest.approx(evals["eager"], rel=2e-4)
    # 12 steps of a tiny model barely move the loss through attention (cutting SDPA's backward shifts the
    # curve by ~2e-4 relative), so the trained weights are compared too: SDPA's gradients reach them. Here
    # the two kernels end within ~1e-7 of each other; a cut backward moves the query weights by ~7e-3.
    assert trained["sdpa"].keys() == trained["eager"].keys()
    for k, w in trained["eager"].items():
        torch.testing.assert_close(
            trained["sdpa"][k], w, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )


def test_threads_do_not_change_the_loss_curve(corpus, layout, monkeypatch):
    """impl.threads 1 vs 2: the same curve (the intra-op thread count only splits the work) and the run
    really trained with that many threads (read inside the run, at its evaluations). The command's
    --threads (study/cpu.py's STUDY_THREADS) wins over impl.threads: impl.threads 2 under --threads 1
    trains on 1 thread, bitwise the impl.threads 1 curve, with the same run hash."""
    curves, evals, seen = {}, {}, {}
    for n in (1, 2):
        cfg = make_cfg(corpus, train__amount=8, impl__threads=n, impl__eval_every=4)
        lay = layout(f"t{n}")
        found = seen[n] = set()
        m = train_run(
            cfg,
            lay,
            quiet=True,
            on_eval=lambda step, tokens, ev, found=found: found.add(torch.get_num_threads()),
        )
        curves[n], evals[n] = np.array(losses(lay.run_dir(cfg.run_hash()))), m
    assert seen == {1: {1}, 2: {2}}
    np.testing.assert_allclose(curves[2], curves[1], rtol=1e-5, atol=1e-6)
    for k in ("ref_mlm_loss", "ref_mlm_acc", "sentence_acc"):
        assert evals[2][k] == pytest.approx(evals[1][k], rel=1e-5, abs=1e-6), k
    assert {k: evals[2][k] for k in ("steps", "tokens_seen", "masked_seen")} == {
        k: evals[1][k] for k in ("steps", "tokens_seen", "masked_seen")
    }
    monkeypatch.setenv(THREADS_ENV, "1")
    cfg = make_cfg(corpus, train__amount=8, impl__threads=2, impl__eval_every=4)
    over: set[int] = set()
    lay = layout("t2over1")
    train_run(cfg, lay, quiet=True, on_eval=lambda step, tokens, ev: over.add(torch.get_num_threads()))
    assert over == {1} and cfg.run_hash() == make_cfg(corpus, train__amount=8, impl__eval_every=4).run_hash()
    np.testing.assert_array_equal(np.array(losses(lay.run_dir(cfg.run_hash()))), curves[1])


def test_progress_bar_does_not_change_the_run(corpus, layout, capsys):
    """impl.progress on vs off (not quiet, so the bar is drawn): bitwise the same weights, history and metrics."""
    runs, err = {}, {}
    for on in (True, False):
        cfg = make_cfg(corpus, train__amount=12, impl__progress=on)
        lay = layout(f"p{on}")
        capsys.readouterr()
        train_run(cfg, lay, quiet=False)
        err[on] = capsys.readouterr().err
        runs[on] = lay.run_dir(cfg.run_hash())
    tag = f"pretrain {cfg.run_hash()}: "  # the bar's description (a heartbeat line reads "pretrain <hash> step")
    assert tag in err[True] and tag not in err[False]  # the bar was drawn, and only when on
    assert_same_weights(runs[True], runs[False])
    assert stable_history(runs[True]) == stable_history(runs[False])
    assert {k: metrics(runs[True])[k] for k in EXACT} == {k: metrics(runs[False])[k] for k in EXACT}


def test_grad_accumulation_matches_one_big_batch(corpus, layout, tmp_path):
    """Losses are weighted by the global masked count, so 4 micro-batches of 2 = 1 batch of 8 (no dropout)."""
    curves = []
    for accum in (1, 4):
        cfg = make_cfg(
            corpus,
            train__amount=15,
            train__grad_accum=accum,
            model__dropout=0.0,
            model__attention_dropout=0.0,
        )
        lay = layout(f"a{accum}")
        train_run(cfg, lay, quiet=True)
        curves.append(np.array(losses(lay.run_dir(cfg.run_hash()))))
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-4, atol=1e-4)


def test_pad_to_max_gives_the_same_loss_and_gradients(corpus, layout):
    """impl.pad_to="max": the micro-batches of a real batch (grad_accum 4: four different widths) padded back
    to max_seq_len (64 here: rows of segment pairs this long are often shorter) give the same masks, the same
    loss and the same gradients as the trimmed ones."""
    from study.data.batches import Batches
    from study.data.prepare import prepare_data
    from study.labels import IGNORE
    from study.pretrain.step import (
        LossModule,
        build_training_model,
        make_optimizer,
        pad_parts,
        pretrain_step,
        read_steps,
    )
    from study.runtime import resolve

    cfg = make_cfg(
        corpus,
        train__grad_accum=4,
        model__dropout=0.0,
        model__attention_dropout=0.0,
        objective__max_seq_len=64,
    )
    prepared = prepare_data(cfg, layout("r"), progress=False)
    parts = Batches(cfg, prepared).make(0, 1)["parts"]
    padded = pad_parts(parts, 64, prepared.special.pad)
    assert min(p["tensors"]["input_ids"].shape[1] for p in parts) < 64  # something to pad
    for a, b in zip(parts, padded, strict=True):
        ta, tb = a["tensors"], b["tensors"]
        w = ta["input_ids"].shape[1]
        assert all(
            tb[k].shape == (2, 64) for k in ("input_ids", "attention_mask", "token_type_ids", "labels")
        )
        for k in ("input_ids", "attention_mask", "token_type_ids", "labels"):
            assert torch.equal(tb[k][:, :w], ta[k]), k  # identical masks and inputs
        assert (tb["labels"][:, w:] == IGNORE).all() and (tb["attention_mask"][:, w:] == 0).all()
        assert (tb["input_ids"][:, w:] == prepared.special.pad).all()
        assert (b["n_mlm"], b["n_sent"], b["positions"]) == (a["n_mlm"], a["n_sent"], 2 * 64)
    rt, out, grads = resolve(cfg.impl), {}, {}
    for name, ps in (("batch", parts), ("max", padded)):
        model, _ = build_training_model(cfg, len(prepared.tokenizer), rt.device)
        opt, fused = make_optimizer(cfg, model, rt.device)
        res = pretrain_step(LossModule(model, True), model, opt, ps, 1e-3, clip=1.0, rt=rt, fused=fused)
        out[name] = read_steps([res])[0]
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert out["max"].loss == pytest.approx(out["batch"].loss, rel=1e-5)
    assert out["max"].grad_norm == pytest.approx(out["batch"].grad_norm, rel=1e-4)
    assert out["max"].masked == out["batch"].masked and out["max"].positions == 4 * 2 * 64
    assert grads["max"].keys() == grads["batch"].keys()
    for n in grads["batch"]:
        torch.testing.assert_close(grads["max"][n], grads["batch"][n], rtol=1e-4, atol=1e-6, msg=n)


def test_a_micro_batch_with_nothing_to_learn_trains_as_if_it_were_not_there():
    """A row's mask count is rounded at random, so a micro-batch can hold no masked token; with no sentence
    task it has no loss at all. Its backward crashed ("does not require grad"). Now it adds a zero that
    reaches every parameter (DDP needs a gradient for each): the step equals the one without that part."""
    from study.labels import IGNORE
    from study.pretrain.step import (
        LossModule,
        build_training_model,
        make_optimizer,
        pretrain_step,
        read_steps,
    )
    from study.runtime import resolve

    cfg = RunConfig(
        model={
            "layers": 1,
            "hidden": 32,
            "heads": 2,
            "intermediate": 64,
            "max_positions": 64,
            "dropout": 0.0,
            "attention_dropout": 0.0,
        },
        objective={"sentence": "none", "max_seq_len": 32},
        finetune={"max_length": 64},
    )
    ids = torch.randint(5, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    none, one = torch.full_like(ids, IGNORE), torch.full_like(ids, IGNORE)
    one[0, 3] = ids[0, 3]

    def part(labels, n):
        return {
            "tensors": {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "token_type_ids": torch.zeros_like(ids),
                "labels": labels,
                "sentence_label": torch.full((2,), -1),
            },
            "n_mlm": n,
            "n_sent": 0,
            "positions": 20,
        }

    rt, out = resolve(cfg.impl), {}
    for name, parts in (("alone", [part(one, 1)]), ("with an empty part", [part(one, 1), part(none, 0)])):
        torch.manual_seed(0)
        model, _ = build_training_model(cfg, 200, rt.device)
        opt, fused = make_optimizer(cfg, model, rt.device)
        out[name] = (
            read_steps(
                [
                    pretrain_step(
                        LossModule(model, True, chunked=rt.chunked_mlm),
                        model,
                        opt,
                        parts,
                        1e-3,
                        clip=1.0,
                        rt=rt,
                        fused=fused,
                    )
                ]
            )[0],
            model.state_dict(),
        )
    (a, wa), (b, wb) = out["alone"], out["with an empty part"]
    assert b.loss == pytest.approx(a.loss) and b.grad_norm == pytest.approx(a.grad_norm) and b.masked == 1
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], msg=k)


def _curve_without_dropout(corpus, layout, name: str, **impl) -> tuple[np.ndarray, dict]:
    cfg = make_cfg(
        corpus,
        train__amount=12,
        model__dropout=0.0,
        model__attention_dropout=0.0,
        objective__max_seq_len=64,
        **{f"impl__{k}": v for k, v in impl.items()},
    )
    lay = layout(name)
    m = train_run(cfg, lay, quiet=True)
    return np.array(losses(lay.run_dir(cfg.run_hash()))), m


def test_pad_to_max_is_loss_neutral(corpus, layout):
    """The training curve and the reference loss with every batch padded to max_seq_len track the trimmed
    run (without dropout: padded positions would draw dropout masks too, so another stream)."""
    base, m0 = _curve_without_dropout(corpus, layout, "batch")
    padded, m1 = _curve_without_dropout(corpus, layout, "max", pad_to="max")
    np.testing.assert_allclose(padded, base, rtol=1e-4, atol=1e-4)
    assert m1["ref_mlm_loss"] == pytest.approx(m0["ref_mlm_loss"], rel=1e-4)
    assert m1["positions_computed"] == 12 * 8 * 64 > m0["positions_computed"]
    assert m1["masked_seen"] == m0["masked_seen"] and m1["tokens_seen"] == m0["tokens_seen"]


@pytest.mark.slow  # torch.compile of the encoder's forward and backward: ~40 s on one CPU core
def test_compile_with_static_shapes_is_loss_neutral(corpus, layout):
    eager, m0 = _curve_without_dropout(corpus, layout, "eager", pad_to="max")
    compiled, m1 = _curve_without_dropout(corpus, layout, "compiled", pad_to="max", compile=True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-4)
    assert m1["ref_mlm_loss"] == pytest.approx(m0["ref_mlm_loss"], rel=1e-4)


def test_bf16_autocast_tracks_fp32(corpus, layout, tmp_path):
    curves = {}
    for prec in ("fp32", "bf16"):
        cfg = make_cfg(corpus, train__amount=20, impl__precision=prec)
        lay = layout(prec)
        m = train_run(cfg, lay, quiet=True)
        curves[prec] = np.array(losses(lay.run_dir(cfg.run_hash())))
        # MFU's peak is measured in the dtype the run computes in, and the resolved precision is recorded
        assert (m["precision"], m["peak_kind"]) == (prec, f"{prec} matmul 2048^3, measured")
        assert m["peak_flops"] > 0 and m["mfu"] > 0
    rel = np.max(np.abs(curves["bf16"] - curves["fp32"]) / curves["fp32"])
    assert 0 < rel < 0.02, rel  # > 0: autocast really ran in bf16


# --------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "change, field",
    [
        (lambda c: setattr(c.objective, "max_seq_len", 128), "objective.max_seq_len"),  # > max_positions 64
        # 8 does not split in 3: TrainConfig refuses that on assignment, so the value is put in unvalidated
        # (as code building a config could); the trainer still refuses it
        (lambda c: c.train.__dict__.update(grad_accum=3), "train.batch_size"),
        (lambda c: setattr(c.train, "batch_size", 5000), "train.batch_size"),  # more than the corpus
        # ImplConfig refuses compile without static shapes on assignment too; set unvalidated, the trainer does
        (lambda c: c.impl.__dict__.update(compile=True), "impl.compile"),
    ],
)
def test_config_errors_name_the_field_before_training(corpus, layout, tmp_path, change, field):
    cfg = make_cfg(corpus)
    change(cfg)
    lay = layout("r")
    with pytest.raises(StudyError) as err:
        train_run(cfg, lay, quiet=True)
    assert err.value.field == field
    assert not lay.run_dir(cfg.run_hash()).exists()  # nothing written for the run


def test_compile_needs_static_shapes():
    from pydantic import ValidationError

    from study.config import ImplConfig

    with pytest.raises(ValidationError, match="impl.pad_to"):
        ImplConfig(compile=True)
    assert ImplConfig(compile=True, pad_to="max").compile


def test_vocab_mismatch_between_tokenizer_and_ids_is_rejected(corpus, layout, monkeypatch):
    """A data folder whose special ids disagree with its tokenizer (or ids beyond its vocab) is refused."""
    import study.data.prepare as prepmod  # where the prepared folder's special ids are read

    real = prepmod.special_ids
    monkeypatch.setattr(
        prepmod, "special_ids", lambda tok: dataclasses.replace(real(tok), vocab_size=len(tok) + 7)
    )
    cfg = make_cfg(corpus)
    lay = layout("r")
    with pytest.raises(StudyError) as err:
        train_run(cfg, lay, quiet=True)
    assert err.value.field == "tokenizer.vocab_size" and not lay.run_dir(cfg.run_hash()).exists()


def test_batch_of_zero_rejected(corpus):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="batch_size"):
        make_cfg(corpus, train__batch_size=0)


# --------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_two_processes_match_single_process(corpus, layout, tmp_path):
    """torchrun with 2 gloo processes, global batch 8 split 4+4, vs one process: same loss curve."""
    cfg = make_cfg(
        corpus, train__amount=15, model__dropout=0.0, model__attention_dropout=0.0, impl__checkpoint_every=5
    )
    single = layout("single")
    m1 = train_run(cfg, single, quiet=True)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(cfg.model_dump_json())
    ddp = layout("ddp")
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "study.pretrain",
        str(cfg_path),
        "--results",
        str(ddp.root),
        "--quiet",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=_subprocess_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = ddp.run_dir(cfg.run_hash())
    m2 = metrics(run)
    assert m2["world_size"] == 2 and m2["steps"] == m1["steps"] and m2["tokens_seen"] == m1["tokens_seen"]
    np.testing.assert_allclose(losses(run), losses(single.run_dir(cfg.run_hash())), rtol=1e-4, atol=1e-4)
    assert m2["ref_mlm_loss"] == pytest.approx(m1["ref_mlm_loss"], rel=1e-4)

    # both ranks SIGKILLed at their 8th step (study/faults.py), then restarted: resumes from step 5
    # (RNG states of both ranks restored from rank 0's checkpoint) and ends bitwise equal. With dropout on,
    # so that each rank's own dropout stream must come back (at 0 a lost RNG state would go unseen)
    cfg = make_cfg(corpus, train__amount=15, impl__checkpoint_every=5)
    assert cfg.model.dropout > 0 and cfg.model.attention_dropout > 0
    cfg_path.write_text(cfg.model_dump_json())
    ddp = layout("ddp-dropout")
    cmd[cmd.index("--results") + 1] = str(ddp.root)
    cmd[cmd.index("--master_port") + 1] = str(_free_port())
    out = subprocess.run(cmd, cwd=REPO, env=_subprocess_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = ddp.run_dir(cfg.run_hash())
    killed = layout("ddp-killed")
    cmd_k = [c if c != str(ddp.root) else str(killed.root) for c in cmd]
    cmd_k[cmd_k.index("--master_port") + 1] = str(_free_port())
    out = subprocess.run(
        cmd_k,
        cwd=REPO,
        env={**_subprocess_env(), "STUDY_KILL_AT": "train.step:8"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0 and "fault: SIGKILL at train.step #8" in out.stderr
    krun = killed.run_dir(cfg.run_hash())
    assert not (krun / "status.json").exists() and (krun / "checkpoints" / "step-00000005.pt").exists()
    cmd_k[cmd_k.index("--master_port") + 1] = str(_free_port())
    out = subprocess.run(cmd_k, cwd=REPO, env=_subprocess_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [e["step"] for e in events(krun) if e["event"] == "resume"] == [5]
    assert_same_weights(run, krun)
    assert stable_history(run) == stable_history(krun)


def test_short_rows_first_then_full_length_and_resume_across_the_switch(corpus, layout, monkeypatch):
    """train.short_len/short_fraction: the first steps (progress < short_fraction) train on rows of
    short_len tokens, the rest on max_seq_len rows; the reference eval stays at max_seq_len. SIGTERM
    before and after the switch resumes bitwise (the phase and its data position are in the checkpoint)."""
    cfg = make_cfg(
        corpus,
        train__amount=20,
        train__short_len=8,
        train__short_fraction=0.4,
        impl__checkpoint_every=None,
        impl__checkpoint_minutes=0,
    )
    plain = make_cfg(corpus, train__amount=20, impl__checkpoint_every=None, impl__checkpoint_minutes=0)
    assert cfg.run_hash() != plain.run_hash()
    ref = layout("ref")
    train_run(cfg, ref, quiet=True)
    run_dir = ref.run_dir(cfg.run_hash())
    steps = [h for h in history(run_dir) if "loss" in h]
    per_step = np.diff([0] + [h["tokens"] for h in steps])
    B = cfg.train.batch_size
    assert all(B * 8 < t <= 4 * B * 8 for t in per_step[:8])  # steps 1-8 (40% of 20): 4 x B rows of 8
    assert all(t > B * 8 for t in per_step[8:])  # then B full-length rows
    assert cfg.short_phase().train.batch_size == 4 * B and cfg.short_phase().objective.max_seq_len == 8
    ev = [h["eval"] for h in history(run_dir) if "eval" in h][-1]
    plain_lay = layout("plain")
    train_run(plain, plain_lay, quiet=True)
    plain_ev = [h["eval"] for h in history(plain_lay.run_dir(plain.run_hash())) if "eval" in h][-1]
    assert ev["ref_masked"] == plain_ev["ref_masked"]  # the same reference questions
    # ... and a second one on rows of the short length (what the warmup trains), only where there is a warmup
    assert (
        0 <= ev["short_mask_acc"] <= 1 and 0 < ev["short_mask_mode_acc"] < 1 and 0 <= ev["short_spread"] <= 1
    )
    assert not any(k.startswith("short_") for k in plain_ev)
    assert short_reference_set(plain, None) is None
    lay = layout("b")
    for stop in (5, 13):  # once in each phase
        _sigterm_at(monkeypatch, stop)
        with pytest.raises(Interrupted):
            train_run(cfg, lay, quiet=True)
        monkeypatch.undo()
    train_run(cfg, lay, quiet=True)
    run = lay.run_dir(cfg.run_hash())
    assert [e["step"] for e in events(run) if e["event"] == "resume"] == [5, 13]
    assert_same_weights(run_dir, run)
    assert stable_history(run_dir) == stable_history(run)
    # evals in both phases (what `study curve` adds) leave the run bitwise as it was
    evals = make_cfg(
        corpus,
        train__amount=20,
        train__short_len=8,
        train__short_fraction=0.4,
        impl__eval_every=3,
        impl__checkpoint_every=None,
        impl__checkpoint_minutes=0,
    )
    assert evals.run_hash() == cfg.run_hash()
    lay = layout("evals")
    train_run(evals, lay, quiet=True)
    evs = [h["eval"] for h in history(lay.run_dir(cfg.run_hash())) if "eval" in h]
    assert len(evs) == 7 and all("short_mask_acc" in e for e in evs)
    assert_same_weights(run_dir, lay.run_dir(cfg.run_hash()))


def test_sigterm_while_finishing_stops_the_command_and_keeps_the_run(corpus, layout, monkeypatch):
    """SIGTERM during the run's final eval/publish: the run is done (status, metrics, model), and the
    command stops (Interrupted) instead of starting the next run. Before: the flag was dropped with the
    handler, and a preempted machine's `study run` went on into the next run until SIGKILL."""
    from study.pretrain import trainer as tr

    cfg = make_cfg(corpus, train__amount=6, impl__checkpoint_every=None)
    lay = layout("a")
    real = tr.Trainer._finish

    def finish(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag: we live on
        return real(self)

    monkeypatch.setattr(tr.Trainer, "_finish", finish)
    with pytest.raises(Interrupted):
        train_run(cfg, lay, quiet=True)
    rd = RunDir(lay, cfg.run_hash())
    assert rd.status().done and rd.metrics()["steps"] == 6 and rd.has_model()
    monkeypatch.undo()
    assert train_run(cfg, lay, quiet=True)["steps"] == 6  # the next command reuses it


def test_resume_never_pads_a_short_history(corpus, layout):
    """A history.jsonl shorter than its checkpoint says (cut from outside) keeps its whole lines on resume:
    before, truncate() to the recorded size padded it with NUL bytes and the next line read as garbage;
    a line cut in the middle is dropped, so the next one is not glued onto it."""
    cfg = make_cfg(corpus, train__amount=12, impl__checkpoint_every=4)
    lay = layout("a")
    os.environ[NAN_ENV] = "9"  # stop the first session after step 8's checkpoint, as a kill would
    try:
        with pytest.raises(Diverged):
            train_run(cfg, lay, quiet=True)
    finally:
        del os.environ[NAN_ENV]
    rd = RunDir(lay, cfg.run_hash())
    # the run diverged: make it resumable from its step-8 checkpoint, with its history cut short
    (rd.path / "status.json").unlink()
    text = rd.history_path.read_text().splitlines(keepends=True)
    rd.history_path.write_text("".join(text[:2]) + text[2][:10])  # and cut inside its third line
    with pytest.warns(RuntimeWarning, match="shorter"):
        train_run(cfg, lay, quiet=True)
    raw = rd.history_path.read_bytes()
    assert b"\x00" not in raw
    assert all(json.loads(line) for line in raw.decode().splitlines())


def test_meta_and_metrics_name_the_precision_alike(corpus, layout):
    """One name for the resolved precision in both files (before: meta.json said torch.float32)."""
    cfg = make_cfg(corpus, train__amount=2)
    lay = layout("a")
    train_run(cfg, lay, quiet=True)
    rd = RunDir(lay, cfg.run_hash())
    assert rd.meta()["precision"] == rd.metrics()["precision"] == "fp32"


def test_quiet_training_prints_a_heartbeat(corpus, layout, monkeypatch, capsys):
    """Without a bar (--quiet, the DVC stages), a line on stderr every HEARTBEAT_S at a log step, so a long
    stage shows where it is; with the bar on, none (the bar says it)."""
    from study.pretrain import loop

    monkeypatch.setattr(loop, "HEARTBEAT_S", 0.0)
    cfg = make_cfg(corpus, train__amount=4, impl__log_every=2)
    train_run(cfg, layout("a"), quiet=True)
    beats = [
        x for x in capsys.readouterr().err.splitlines() if x.startswith(f"pretrain {cfg.run_hash()} step")
    ]
    assert [b.split(" step ")[1].split(" ")[0] for b in beats] == ["2", "4"]
    assert "(50% of 4 steps), loss " in beats[0] and "tok/s" in beats[0]
