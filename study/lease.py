"""A lock that holds on a shared filesystem across hosts: a lease file, created with O_EXCL, renewed by a
heartbeat thread, taken over only when stale.

Why not `flock` (study/io.py's file_lock): on NFS mounted `nolock` or `local_lock=all` it locks nothing
across hosts and says nothing, and on Lustre it needs the `flock` mount option. Creating a file with
O_CREAT|O_EXCL is atomic on NFSv3+ and Lustre, so two hosts cannot both create the lease.

The file (JSON): host, pid, Slurm job id (or null), a random token naming this holder, the time it was
taken, and `beat`, a counter the heartbeat thread rewrites in place every `ttl / 4` seconds.

Staleness (when another process may take the lease over):
- the holder is on this host and its pid is gone (SIGKILL, OOM, a crashed node that rebooted): at once;
- otherwise when the file has not changed (same token and beat) for `ttl` seconds of the waiter's own
  monotonic clock. Host clocks are never compared, so clock skew between nodes cannot make a live lease
  look stale. STALE_S = 120 s by default: a holder whose heartbeat thread could not write for two minutes
  (a hung filesystem, a frozen node) loses the lease. For a non-waiting look (`study status`, what to
  submit) a lease counts as live unless its holder is a dead pid on this host or its file's mtime is more
  than `ttl` old by this host's clock (an approximation, as it compares the file server's clock).
- Takeover renames the stale file aside (atomic: one of two racing waiters wins), checks that the file
  it moved is the stale one it watched (else puts it back), and then creates its own with O_EXCL.
- A holder whose heartbeat finds its token gone (the lease was taken over while it was frozen) warns and
  sends itself SIGTERM, so a run in training checkpoints and stops rather than train beside the new
  holder (training is deterministic: both would write the same files, but not twice the work).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STALE_S = float(os.environ.get("STUDY_LEASE_STALE_S", "120"))  # module doc: when a lease is stale
POLL_S = 0.5  # a waiter looks at the lease this often


def job_id() -> str | None:
    """This process's Slurm job id (an array task as ARRAYID_TASK), None outside Slurm."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job: str | None
    token: str
    beat: int
    taken: float

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}" + (f", Slurm job {self.job}" if self.job else "")


def read_holder(path: str | os.PathLike) -> Holder | None:
    """The lease's holder, or None when there is no lease file. A file caught mid-rewrite reads as a
    holder with beat -1 (alive: it is being written)."""
    try:
        raw = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        d = json.loads(raw)
        return Holder(d["host"], int(d["pid"]), d.get("job"), d["token"], int(d["beat"]), float(d["taken"]))
    except (ValueError, KeyError, TypeError):
        return Holder("?", -1, None, raw[:64], -1, 0.0)


def dead_here(h: Holder) -> bool:
    """The holder ran on this host and its process is gone."""
    if h.host != socket.gethostname() or h.pid <= 0:
        return False
    try:
        os.kill(h.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def live_holder(path: str | os.PathLike, ttl: float = STALE_S) -> Holder | None:
    """The holder of a lease that looks live without waiting (module doc), else None."""
    h = read_holder(path)
    if h is None or dead_here(h):
        return None
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    return h if age <= ttl else None


class Lease:
    """One held lease: its file, token and heartbeat thread."""

    def __init__(self, path: Path, ttl: float):
        self.path, self.ttl = path, ttl
        self.token = secrets.token_hex(8)
        self.beat = 0
        self.taken = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        d = {"host": socket.gethostname(), "pid": os.getpid(), "job": job_id(), "token": self.token}
        return json.dumps({**d, "beat": self.beat, "taken": self.taken}, sort_keys=True).encode()

    def create(self) -> bool:
        """O_EXCL-create the file; False when it exists."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._body())
            f.flush()
            os.fsync(f.fileno())
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease {self.path.name}", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            h = read_holder(self.path)
            if h is None or (h.beat >= 0 and h.token != self.token):
                print(
                    f"warning: lease {self.path} was taken over ({h.describe() if h else 'removed'}); "
                    "stopping this process (SIGTERM) so the run is not trained twice",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGTERM)
                return
            self.beat += 1
            try:  # in place, not by rename: a rename would race a takeover's rename
                with open(self.path, "r+b") as f:
                    body = self._body()
                    f.write(body)
                    f.truncate(len(body))
                    f.flush()
                    os.fsync(f.fileno())
            except FileNotFoundError:
                continue  # taken over between the read and the write: the next beat says so

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        h = read_holder(self.path)
        if h is not None and h.token == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _take_over(path: Path, stale: Holder) -> None:
    """Move the stale lease aside, if it is still the one watched (module doc)."""
    aside = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # released or taken by another waiter meanwhile
    moved = read_holder(aside)
    if moved is not None and (moved.token, moved.beat) != (stale.token, stale.beat):
        with contextlib.suppress(OSError):  # not the stale one: put it back (link fails if one exists)
            os.link(aside, path)
    print(f"lease {path}: took over from {stale.describe()} (stale)", file=sys.stderr, flush=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(aside)


@contextlib.contextmanager
def lease(path: str | os.PathLike, *, blocking: bool = True, ttl: float = STALE_S) -> Iterator[bool]:
    """Hold the lease at `path` for the block (True), renewing it; with blocking=False yield False at once
    when a live holder has it. Blocking waits until it is released or stale (module doc)."""
    path = Path(path)
    mine = Lease(path, ttl)
    seen: tuple[tuple, float] | None = None  # ((token, beat) last read, when it was first read)
    while not mine.create():
        h = read_holder(path)
        if h is None:
            continue  # released between the create and the read
        now = time.monotonic()
        key = (h.token, h.beat)
        if seen is None or seen[0] != key:
            seen = (key, now)
        if dead_here(h) or (h.beat >= 0 and now - seen[1] > ttl):
            _take_over(path, h)
            continue
        if not blocking:
            yield False
            return
        time.sleep(POLL_S)
    mine.start()
    try:
        yield True
    finally:
        mine.release()


def train_lease_path(layout, run_hash: str) -> Path:
    """The lease that one run's trainer holds (study/pretrain/trainer.py); status and the Slurm submitter
    read it to tell a run in training."""
    return layout.lease_file(f"train-{run_hash}")
