"""Writing a file the user named (`-o`, `--output`, `--profile-out`): one function for every
command, so each treats a symlink, a pipe or a read-only place the same way."""

from __future__ import annotations

import math
import os
import re
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


def probe_writable(path: Path | str, field: str = "--output") -> None:
    """Create and remove the file `replaced` would write first, before anything is
    measured: a folder the OS refuses new files in (/proc, a read-only mount) passes
    every permission check a root user makes, and its refusal came only at the write,
    after the run (a traceback where the write was not `replaced`'s, the run lost)."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        return  # a pipe or a device: written in place
    reason = refused_in(target.parent, f"{target.name}.tmp{os.getpid()}")
    if reason is not None:
        where = f"folder {target.parent} takes no new file ({reason})"
        raise InputError(field, f"cannot write {path}: {where}", "give a path in a writable folder")


def refused_in(folder: Path, name: str) -> str | None:
    """Why `folder` refuses a new file `name` (the OS's words), made and removed at once;
    None when it takes it."""
    tmp = folder / name
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return None  # one of ours already there: the folder takes files
    except OSError as exc:
        return exc.strerror or str(exc)
    with suppress(OSError):
        tmp.unlink()
    return None


def _discard(tmp: Path, special: bool) -> None:
    if not special:
        with suppress(OSError):  # the place refused the write in the first place
            tmp.unlink(missing_ok=True)


def point_file(base: Path, label: str, many: bool, suffix: str = ".json") -> Path:
    """A point's file: `base` itself for a single point; `<stem>-<label><suffix>` beside
    it for each point of a sweep (the base's own suffix when it has one)."""
    return base if not many else base.with_name(f"{base.stem}-{label}{base.suffix or suffix}")


def point_files_of(base: Path) -> list[Path]:
    """The files a sweep given `-o base` wrote, one per point: `point_file`'s names for
    the labels `measure.loads.sweep_points` gives (`rate4`, `conc8`), users before rates,
    each by load (conc4 before conc16)."""
    suffix = base.suffix or ".json"
    named = re.compile(re.escape(base.stem) + r"-(rate|conc)([0-9.e+-]+)" + re.escape(suffix))
    try:
        found = [(named.fullmatch(p.name), p) for p in base.parent.iterdir() if p.is_file()]
    except (OSError, ValueError):  # no such folder, an unreadable one
        return []
    points = [(m.group(1), _number(m.group(2)), p) for m, p in found if m]
    return [p for *_, p in sorted(points)]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def missing_file_fix(path: Path | str, fix: str) -> str:
    """The fix for a file that does not exist: where a sweep's point files stand for it
    (`bench --concurrency 1,4 -o run.json` writes run-conc1.json and run-conc4.json, not
    run.json, and the next command given run.json said only "no such file"), else `fix`."""
    points = point_files_of(Path(path))
    if not points:
        return fix
    names = ", ".join(str(p) for p in points[:4]) + (", ..." if len(points) > 4 else "")
    return f"a sweep writes one file per point, here {names}"
