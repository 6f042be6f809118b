"""Writing a file the user named (`-o`, `--output`, `--profile-out`): one function for every
command, so each treats a symlink, a pipe or a read-only place the same way."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from servetune.errors import InputError


@contextmanager
def replaced(path: Path | str, field: str = "--output") -> Iterator[Path]:
    """Yield the path to write `path`'s new content to; it is in place when the block ends.

    - A regular file (or a new one) is written beside itself and renamed over it, so a
      reader never sees half a file and a failed write leaves the old one.
    - A symlink is followed: its target is replaced and the link kept.
    - A FIFO or a device (`/dev/stdout`) is written in place: renaming over it would
      replace the node itself.
    - The OS refusing the write (a read-only place, /proc) is one InputError naming
      `field`, never a traceback.
    """
    target = Path(os.path.realpath(path))
    special = target.exists() and not target.is_file()
    tmp = target if special else target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        yield tmp
        if not special:
            os.replace(tmp, target)
    except OSError as exc:
        _discard(tmp, special)
        reason = exc.strerror or str(exc)
        raise InputError(field, f"cannot write {path}: {reason}", "give a writable file") from None
    except BaseException:
        _discard(tmp, special)
        raise


def _discard(tmp: Path, special: bool) -> None:
    if not special:
        with suppress(OSError):  # the place refused the write in the first place
            tmp.unlink(missing_ok=True)
