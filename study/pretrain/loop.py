"""The training loop of one session (a mixin of trainer.Trainer, which sets up, resumes, checkpoints,
evaluates and finishes): budget progress, the learning rate, one optimizer step left on the device, one
host sync per log window (study/pretrain/trainer.py's module doc says what each guarantees), the log
lines, the progress bar and the heartbeat without one.
"""

from __future__ import annotations

import math
import os
import sys
import time

from tqdm import tqdm

from study import faults
from study.config import RunConfig
from study.errors import Diverged, Interrupted
from study.metrics import finite
from study.pretrain.checkpoint import TrainState
from study.pretrain.schedule import budget_progress
from study.pretrain.step import pad_parts, pretrain_step, read_steps

NAN_ENV = (
    "STUDY_INJECT_NAN_AT_STEP"  # test hook: the loss of step k (1-based) becomes NaN; "<hash>:k" for one run
)
HEARTBEAT_S = 300.0  # without a progress bar, a line on stderr at most this often (Loop._heartbeat)
EMPTY_WINDOW = {"n": 0, "loss": 0.0, "mlm": 0.0, "sent": 0.0, "tokens": 0, "s": 0.0}


def progress_of(cfg: RunConfig, st: TrainState) -> float:
    """How much of the run's budget (steps, tokens or seconds) the state has done, 1.0 at the end."""
    return budget_progress(cfg, st.step, st.tokens, st.train_s)


class Loop:
    """The loop's methods; the state (cfg, state, batches, model, optimizer, clock) is Trainer's."""

    # ---- one optimizer step
    def _train_step(self, batch: dict, lr: float):
        inject = os.environ.get(NAN_ENV)  # "k" (every run) or "<run_hash>:k" (one run of a study)
        target, _, at = (inject or "").rpartition(":")
        run_hash, step = self.cfg.run_hash(), self.state.step + 1
        poison = bool(inject) and target in ("", run_hash) and int(at) == step
        parts = (
            batch["parts"]
            if self.cfg.impl.pad_to == "batch"
            else pad_parts(batch["parts"], self.cfg.objective.max_seq_len, self.prepared.special.pad)
        )  # static shapes
        return pretrain_step(
            self.step_module,
            self.model,
            self.opt,
            parts,
            lr,
            clip=self.cfg.train.clip,
            rt=self.rt,
            fused=self.fused,
            poison=poison,
            mid_step=lambda: faults.point("train.step", f"{run_hash} step {step}"),
        )

    def _sync(self) -> None:
        """Read the steps run since the last sync back from the device (one transfer) and, in step order,
        stop at the first non-finite one or add them to the log window and the counters."""
        st, win, clip = self.state, self.state.window, self.cfg.train.clip
        pending, self.pending = self.pending, []
        for (step, _), v in zip(pending, read_steps([r for _, r in pending]), strict=True):
            if not finite(v.loss) or (clip > 0 and not finite(v.grad_norm)):
                self._diverged(v.loss, v.grad_norm, step)
            st.positions, st.masked, st.last_loss, self.grad_norm = (
                st.positions + v.positions,
                st.masked + v.masked,
                v.loss,
                v.grad_norm,
            )
            for k, x in (("loss", v.loss), ("mlm", v.mlm), ("sent", v.sentence)):
                win[k] += x

    def _diverged(self, loss: float, gnorm: float, step: int) -> None:
        what = f"non-finite loss {loss}" if not finite(loss) else f"non-finite gradient norm {gnorm}"
        if self.dist.main:
            self._event({"event": "diverged", "step": step, "loss": str(loss), "grad_norm": str(gnorm)})
            self.rd.write_status("diverged", f"{what} at step {step}", step, loss=str(loss))
        raise Diverged(step, loss if not finite(loss) else gnorm)

    # ---- the loop
    def _heartbeat(self, bar, loss: float, tps: float | None) -> None:
        """Without a progress bar (--quiet, as in dvc.yaml's stages), one line on stderr every HEARTBEAT_S
        of wall time at a log step, so a long stage shows where it is between its runs' end lines."""
        now = time.perf_counter()
        if not bar.disable or not self.dist.main or now - self.last_beat < HEARTBEAT_S:
            return
        self.last_beat = now
        cfg, st = self.cfg, self.state
        print(
            f"pretrain {cfg.run_hash()} step {st.step:,} ({100 * min(progress_of(cfg, st), 1.0):.0f}% of "
            f"{cfg.train.amount:,.0f} {cfg.train.budget}), loss {loss:.3f}, "
            f"{f'{tps:,.0f}' if tps else '-'} tok/s",
            file=sys.stderr,
            flush=True,
        )

    def _loop(self) -> dict:
        cfg, st = self.cfg, self.state
        bar = self._bar()
        st.window = st.window or dict(EMPTY_WINDOW)
        self.last_dt = 0.0
        self.last_ckpt_step = st.step if st.step else None
        try:
            while progress_of(cfg, st) < 1.0:
                self._one_step(bar)
        finally:
            bar.close()
        if self.last_ckpt_step != st.step:
            self._checkpoint()  # a kill during finishing must not retrain
        if st.last_eval.get("step") != st.step:
            self._eval_event()
        return self._finish()

    def _bar(self):
        cfg, st, t = self.cfg, self.state, self.cfg.train
        unit_total = {"steps": math.ceil(t.amount), "tokens": t.amount, "seconds": t.amount}[t.budget]
        return tqdm(
            total=unit_total,
            initial=min(progress_of(cfg, st), 1.0) * unit_total,
            desc=f"pretrain {cfg.run_hash()}",
            unit={"steps": "step", "tokens": "tok", "seconds": "s"}[t.budget],
            unit_scale=t.budget == "tokens",
            dynamic_ncols=True,
            mininterval=0.5,
            disable=self.quiet or not cfg.impl.progress or not self.dist.main,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )

    def _lr(self, batch: dict) -> float:
        """The schedule's factor over this step's share of the budget, times train.lr."""
        cfg, st, t = self.cfg, self.state, self.cfg.train
        p_before = progress_of(cfg, st)
        if t.budget == "steps":
            p_after = (st.step + 1) / math.ceil(t.amount)
        elif t.budget == "tokens":
            p_after = (st.tokens + batch["tokens"]) / t.amount
        else:
            p_after = (st.train_s + self.last_dt) / t.amount  # this step's length is not known yet
        return t.lr * self.schedule.factor(p_before, p_after)

    def _one_step(self, bar) -> None:
        cfg, st, t = self.cfg, self.state, self.cfg.train
        t0 = time.perf_counter()
        source = self.short_batches if st.phase == 0 else self.batches
        batch = source.get(st.epoch, st.batch)
        lr = self._lr(batch)
        self.pending.append((st.step + 1, self._train_step(batch, lr)))
        st.step, st.tokens, st.sequences = (
            st.step + 1,
            st.tokens + batch["tokens"],
            st.sequences + t.batch_size,
        )
        st.epoch, st.batch = source.next_position(st.epoch, st.batch)
        if st.phase == 0 and progress_of(cfg, st) >= t.short_fraction:  # short rows done: full length
            st.phase, st.epoch, st.batch = 1, 0, 0
        log_now = st.step % cfg.impl.log_every == 0
        eval_now = bool(cfg.impl.eval_every) and st.step % cfg.impl.eval_every == 0
        ckpt_now, stop = self.clock.decide(st.step, log_now, self.dist, self.device)
        if log_now or eval_now or ckpt_now or stop or progress_of(cfg, st) >= 1.0:
            self._sync()  # inside the step's time: waiting for the device's queue is training time
        dt = self.last_dt = time.perf_counter() - t0
        st.train_s += dt
        for k, v in (("n", 1), ("tokens", batch["tokens"]), ("s", dt)):
            st.window[k] += v
        bar.update(1 if t.budget == "steps" else batch["tokens"] if t.budget == "tokens" else dt)
        if log_now:
            self._log_window(bar, lr)
        if eval_now and progress_of(cfg, st) < 1.0:
            self._eval_event()
        if ckpt_now and progress_of(cfg, st) < 1.0:
            self._checkpoint()
        if stop:  # SIGTERM: this step is done; save it and leave the run pending (resumable)
            if self.last_ckpt_step != st.step:
                self._checkpoint()
            self._event({"event": "interrupted", "signal": "SIGTERM", "tokens": st.tokens})
            raise Interrupted(st.step)

    def _log_window(self, bar, lr: float) -> None:
        """One history.jsonl line with the log window's means, then a fresh window."""
        cfg, st = self.cfg, self.state
        win = st.window
        tps = win["tokens"] / win["s"] if win["s"] else None
        self._log(
            {
                "step": st.step,
                "tokens": st.tokens,
                "loss": win["loss"] / win["n"],
                "mlm_loss": win["mlm"] / win["n"],
                "sentence_loss": win["sent"] / win["n"] if cfg.objective.sentence != "none" else None,
                "lr": lr,
                "grad_norm": self.grad_norm if finite(self.grad_norm) else None,
                "tokens_per_s": tps,
                "epoch": st.epoch,
            }
        )
        bar.set_postfix(
            loss=f"{win['loss'] / win['n']:.3f}", tok_s=f"{tps:,.0f}" if tps else "-", refresh=False
        )
        self._heartbeat(bar, win["loss"] / win["n"], tps)
        st.window = dict(EMPTY_WINDOW)
