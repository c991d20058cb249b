"""Small file helpers every stage shares: atomic writes, content hashes, locks.

Everything a later stage reads is written through `atomic_write_*` (temp file in
the same folder + fsync + os.replace), so a process killed mid-write leaves either
the old file or no file, never half a file that looks complete.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from study import faults


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the input to every config hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def hash_obj(obj: Any, length: int = 12) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        faults.point(
            "io.replace", str(path)
        )  # the fault suite kills here: the temp file is complete, not yet renamed
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write() names no file: name it,
            exc.filename = str(path)  # so a full disk's one-line message says where (errors.message)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Build a folder under a temp name and rename it into place only when complete."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    tmp.chmod(0o755)  # mkdtemp makes 0700; results are meant to be shared
    try:
        yield tmp
        faults.point("io.replace", str(final))
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: Path, final: Path) -> None:
    """Put folder `tmp` in place of `final`. The old folder is renamed aside first (a reader never sees it
    half deleted), and the rename is retried when another writer put its own folder there in between: two
    commands rendering one report at once both succeed, the last one's folder stays (seen in CI: removing
    the old folder, then renaming, failed "Directory not empty" when the other writer came in between)."""
    asides = []
    try:
        for _ in range(20):
            if final.exists():
                aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
                try:
                    os.replace(final, aside)  # onto an empty folder: allowed
                except FileNotFoundError:  # the other writer moved it first
                    pass
                asides.append(aside)
            try:
                os.replace(tmp, final)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        raise OSError(errno.EBUSY, f"{final} kept being replaced by another writer")
    finally:
        for aside in asides:
            shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, blocking: bool = True) -> Iterator[bool]:
    """An advisory exclusive lock (flock) held for the block; released if the process dies.

    Yields True when the lock is held; with blocking=False yields False instead of
    waiting when another process holds it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
