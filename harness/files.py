"""Files that hostile folders cannot subvert: atomic writes, appends and reads of regular files.

Writes go to a temporary file created next to the target (never through a link), are fsync'ed
and renamed over it; appends are unbuffered and cut back when a write fails part-way; reads
refuse anything but a regular file (a link, a folder or a FIFO in place of a run file is
reported, never followed or waited on). Files are created with mode 0o666, so the umask decides
who may read them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from selfcest_env.harness.errors import CorruptRunError


def _fsync_dir(path: Path) -> None:
    """Best-effort fsync of a directory (so a rename survives a crash); a no-op where the OS
    does not allow opening directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``, open for writing.

    Created with mode 0o666, so the process umask decides who may read it (``tempfile.mkstemp``
    would make it 0o600); ``O_EXCL`` never opens what is already there, a symbolic link
    included.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temporary file in the same folder, fsync, rename.

    The file gets the permissions the umask gives a new file. A symbolic link at ``path`` is
    replaced, never written through. On any failure (a full disk) ``path`` keeps its old
    content and the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, like :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def open_append(path: Path) -> Any:
    """Open a run file for appending, unbuffered (each write reaches the OS at once).

    Never through a symbolic link and only a regular file (a run folder from elsewhere cannot
    redirect the writes, and a FIFO there cannot block the run); created with mode 0o666, so
    the umask decides who may read it.

    Raises:
        CorruptRunError: ``path`` is a symbolic link, a folder or another non-regular file.
    """
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise not_a_regular_file(path) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_a_regular_file(path)
    return os.fdopen(fd, "ab", buffering=0)


def not_a_regular_file(path: Path) -> CorruptRunError:
    return CorruptRunError(
        f"{path} is not a regular file (a link, a folder or a device); remove it, or use "
        "another output folder"
    )


def append_line(handle: Any, line: bytes) -> None:
    """Append one line to a file from :func:`open_append` and fsync it before returning.

    When a write fails part-way (a full disk), the file is cut back to where it was, so it
    never keeps a partial line; the error is raised again.
    """
    fd = handle.fileno()
    start = os.fstat(fd).st_size
    try:
        view = memoryview(line)
        while view:
            view = view[handle.write(view) :]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def read_regular_file(path: Path) -> bytes | None:
    """The bytes of a run file, ``None`` when it does not exist.

    Raises:
        CorruptRunError: it is not a regular file (a folder, a FIFO), or cannot be read.
    """
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_a_regular_file(path) from exc
        raise CorruptRunError(f"{path}: cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_a_regular_file(path)
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read()
        except OSError as exc:
            raise CorruptRunError(f"{path}: cannot read: {exc.strerror}") from exc
