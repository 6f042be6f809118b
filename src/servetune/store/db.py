"""Where the store lives and how it is opened: URL resolution, SQLite pragmas (journal mode),
refusing foreign/corrupt/newer databases, and running the shipped migrations.

Everything a user can get wrong here becomes an `InputError` (one line, exit 2) before
a single byte of their database is written.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from servetune import __version__
from servetune.errors import InputError
from servetune.results.files import sqlite_file
from servetune.store.models import APP, SCHEMA_VERSION

DEFAULT_DB = "servetune.db"
ENV_VAR = "SERVETUNE_DB"
MIGRATIONS = Path(__file__).with_name("migrations")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_FIELD = "--db"


def resolve_url(db: str | None = None) -> str:
    """`--db` beats `$SERVETUNE_DB` beats `./servetune.db`. A bare path means SQLite;
    `postgresql://` gets the psycopg 3 driver, the one servetune installs. An empty
    `--db` or `$SERVETUNE_DB` (an unset shell variable) is refused, never read as the
    default: every command opens the store through here, so all of them refuse it."""
    raw = _given(db)
    if "://" not in raw:
        return "sqlite:///" + str(Path(raw).expanduser().absolute())
    for plain in ("postgresql://", "postgres://"):
        if raw.startswith(plain):
            return "postgresql+psycopg://" + raw[len(plain) :]
    return raw


def _given(db: str | None) -> str:
    """What the user named: `--db`, else `$SERVETUNE_DB`, else the default file."""
    if db is not None:
        if not db.strip():
            raise InputError(_FIELD, "is empty", "give a file path or URL")
        return db
    env = os.environ.get(ENV_VAR)
    if env is not None and not env.strip():
        fix = f"set it to a file path or URL, or unset it for ./{DEFAULT_DB}"
        raise InputError(f"${ENV_VAR}", "is empty", fix)
    return env or DEFAULT_DB


def display_url(url: str) -> str:
    """The URL as it may be shown: password hidden, SQLite as its file path."""
    try:
        u = make_url(url)
    except ArgumentError:
        return url
    if u.get_backend_name() == "sqlite":
        return u.database or ":memory:"
    return u.render_as_string(hide_password=True)


@dataclass(frozen=True)
class SchemaState:
    kind: str  # empty | current | old | foreign | newer
    version: int | None = None
    written_by: str | None = None
    tables: tuple[str, ...] = ()


# SQLite's "WAL-reset bug" (sqlite.org/wal.html#walresetbug): in WAL mode, a commit that
# resets the log while two checkpoints race can lose pages and corrupt the file. It affects
# SQLite 3.7.0 through 3.51.2 and is fixed in 3.51.3, with backports to 3.50.7 and 3.44.6.
# servetune commits from two threads at once (a run's records beside the study's rows), the
# pattern the bug needs, and Debian 12 ships 3.40.1; a CI run here found a database
# "malformed" after exactly that. So WAL only where the library is fixed.
_WAL_FIXED: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((3, 44, 6), (3, 45, 0)),
    ((3, 50, 7), (3, 51, 0)),
    ((3, 51, 3), (999,)),
)


def wal_is_safe(version: tuple[int, ...]) -> bool:
    """True when this SQLite library has the WAL-reset fix (see _WAL_FIXED)."""
    return any(low <= tuple(version) < high for low, high in _WAL_FIXED)


def _sqlite_version(engine: Engine) -> tuple[int, ...]:
    return tuple(engine.dialect.dbapi.sqlite_version_info)  # type: ignore[union-attr]


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Per-connection settings; none of them writes to the file.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout = 30000")  # several writers (a sweep, a tuner) queue
    cur.execute("PRAGMA foreign_keys = ON")
    mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
    # WAL + NORMAL is durable across a crash; a rollback journal keeps the default FULL.
    if str(mode).lower() == "wal":
        cur.execute("PRAGMA synchronous = NORMAL")
    cur.close()


def _set_journal_mode(engine: Engine, *, existing: bool) -> None:
    """WAL on a new database where the library is safe (readers never block the writer);
    a WAL database on an unsafe library goes back to a rollback journal, when nobody else
    has it open (a short wait, never the 30 s queue: it is tried again next time)."""
    want = "wal" if wal_is_safe(_sqlite_version(engine)) else "delete"
    if existing and want == "wal":
        return  # whatever it is, it is safe
    with engine.connect() as conn:
        mode = str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
        if mode == want or (existing and mode != "wal"):
            return
        conn.exec_driver_sql("PRAGMA busy_timeout = 200")
        try:
            conn.exec_driver_sql(f"PRAGMA journal_mode = {want.upper()}")
        except DBAPIError:
            pass  # another process has it open: keep WAL this time
        finally:
            conn.exec_driver_sql("PRAGMA busy_timeout = 30000")


def _check_sqlite_file(url: str, create: bool) -> None:
    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    p = Path(path)
    if not p.exists():
        if not create:
            raise InputError(
                _FIELD,
                f"no servetune database at {p}",
                "run bench/simulate or `servetune runs import` first, or pass --db / "
                f"set ${ENV_VAR}",
            )
        if not p.parent.is_dir():
            raise InputError(_FIELD, f"folder {p.parent} does not exist", "create it first")
        return
    if p.is_dir():
        raise InputError(_FIELD, f"{p} is a folder, not a database file")
    with p.open("rb") as fh:
        head = fh.read(16)
    if head and head != _SQLITE_MAGIC:
        raise InputError(
            _FIELD,
            f"{p} is not a SQLite database (corrupt, or another program's file)",
            "point --db at a servetune database; the file was left as it is",
        )


def make_engine(url: str, *, create: bool = True) -> Engine:
    """An Engine for `url`, after the checks that need no connection."""
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise InputError(
            _FIELD, f"not a database URL: {url!r}", "e.g. ./runs.db or postgresql://user@host/db"
        ) from exc
    backend = u.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        _check_sqlite_file(url, create)
        kwargs["connect_args"] = {"timeout": 30}
    elif backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 5}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        raise InputError(
            _FIELD,
            f"no driver for {u.drivername} ({exc})",
            "install it, e.g. pip install 'psycopg[binary]' for PostgreSQL",
        ) from exc
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    return lines[0] if lines else type(orig).__name__


def schema_state(engine: Engine) -> SchemaState:
    """What is in the database, read without writing anything."""
    try:
        with engine.connect() as conn:
            tables = tuple(sorted(inspect(conn).get_table_names()))
            if not tables:
                return SchemaState("empty")
            if "servetune_info" not in tables:
                return SchemaState("foreign", tables=tables)
            info = dict(conn.execute(text("SELECT key, value FROM servetune_info")).all())
    except DBAPIError as exc:
        raise InputError(
            _FIELD,
            f"cannot open {display_url(str(engine.url))}: {_first_line(exc)}",
            "check the URL, that the server is up, or that the file is a servetune database",
        ) from exc
    if info.get("app") != APP:
        return SchemaState("foreign", tables=tables)
    try:
        version = int(info.get("schema", "0"))
    except ValueError:
        return SchemaState("foreign", tables=tables)
    written_by = info.get("written_by")
    if version > SCHEMA_VERSION:
        return SchemaState("newer", version, written_by, tables)
    if version < SCHEMA_VERSION:
        return SchemaState("old", version, written_by, tables)
    return SchemaState("current", version, written_by, tables)


def _alembic_config(conn: Any) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def _backup_sqlite(engine: Engine, version: int | None) -> Path | None:
    """`FILE.schemaN.bak`, the database as it was before a migration, made once. It is
    made by SQLite's online backup through the store's own connection, not by copying
    the file: in WAL mode the last commits live in FILE-wal until a checkpoint, and a copy
    of FILE alone lost them. Written beside and renamed, so a backup cut short is never
    taken for one (and retried next time)."""
    path = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    dest = Path(f"{path}.schema{version}.bak")
    if dest.exists():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    raw = engine.raw_connection()
    try:
        with closing(sqlite3.connect(tmp)) as copy:
            raw.driver_connection.backup(copy)  # type: ignore[union-attr]
        os.replace(tmp, dest)
    except (sqlite3.Error, OSError) as exc:
        raise InputError(
            _FIELD,
            f"cannot back up {path} to {dest.name} before migrating it: {exc}",
            "free some space or make its folder writable; the database was not changed",
        ) from exc
    finally:
        raw.close()
        tmp.unlink(missing_ok=True)
    return dest


def upgrade(engine: Engine) -> None:
    """Run the shipped migrations up to head and note which servetune wrote last."""
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "head")
        conn.execute(text("DELETE FROM servetune_info WHERE key = 'written_by'"))
        conn.execute(
            text("INSERT INTO servetune_info (key, value) VALUES ('written_by', :v)"),
            {"v": __version__},
        )


def open_engine(url: str, *, create: bool = True) -> Engine:
    """Open (and for writers create or migrate) the database at `url`, or raise a
    one-line InputError that leaves it untouched."""
    engine = make_engine(url, create=create)
    where = display_url(url)
    state = schema_state(engine)
    if state.kind == "foreign":
        shown = ", ".join(state.tables[:5]) + (" ..." if len(state.tables) > 5 else "")
        engine.dispose()
        raise InputError(
            _FIELD,
            f"{where} is not a servetune database (it has tables {shown})",
            "point --db at a servetune database or a new file; nothing was changed",
        )
    if state.kind == "newer":
        engine.dispose()
        raise InputError(
            _FIELD,
            f"{where} has schema {state.version} (written by servetune "
            f"{state.written_by or '?'}); this servetune {__version__} reads up to "
            f"schema {SCHEMA_VERSION}",
            "upgrade servetune; the database was not changed",
        )
    if state.kind == "empty" and not create:
        engine.dispose()
        raise InputError(_FIELD, f"{where} holds no servetune data yet", "record a run first")
    try:
        if engine.url.get_backend_name() == "sqlite" and (state.kind == "empty" or create):
            _set_journal_mode(engine, existing=state.kind != "empty")
        if state.kind == "old":
            _backup_sqlite(engine, state.version)
        if state.kind in ("empty", "old"):
            upgrade(engine)
    except InputError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise InputError(
            _FIELD, f"cannot write to {where}: {_first_line(exc)}", "check permissions"
        ) from exc
    return engine


def store_file(db: str | None) -> str | None:
    """The SQLite file `--db` (or `$SERVETUNE_DB`, or the default) names, for a command
    that checks its outputs before it opens the store; None when it names no file (a
    server URL) or cannot be read (the store's own open says why, or it is off)."""
    try:
        return sqlite_file(resolve_url(db))
    except (InputError, ValueError, ImportError):
        return None
