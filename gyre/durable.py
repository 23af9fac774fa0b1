"""Files written atomically and durably: the data goes to a temporary file in the same directory, which is
fsynced and renamed over the final name, and then the directory is fsynced. After a crash the name holds
the whole old content or the whole new one, never a part, and a write that returned survives it.

    replace_durable(path, data)      # replaces what is there (the audit's step records)
    write_durable(path, data)        # a file written once: False, writing nothing, when it exists
                                     # (archived trees: a redelivered request finds the file complete)
    with replacing_dir(out) as tmp:  # a directory filled in a temporary sibling, renamed into place
        ...                          # (model and adapter directories; not fsynced)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def replace_durable(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably, replacing what is there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_durable(path: Path, data: bytes) -> bool:
    """Write `data` to `path` atomically and durably unless `path` exists: True when this call wrote it,
    False (leaving the file as it is) when it was there already."""
    if Path(path).exists():
        return False
    replace_durable(path, data)
    return True


@contextmanager
def replacing_dir(out: Path) -> Iterator[Path]:
    """A directory written whole: the block fills a fresh temporary sibling of `out`; when it ends, the
    files are made readable by all (0644, whatever the umask) and the sibling replaces `out`. A block that
    raises leaves `out` as it was and removes the sibling."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for item in tmp.iterdir():
        item.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
