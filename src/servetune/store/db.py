"""Where the store lives and how it is opened: URL resolution, SQLite pragmas (WAL),
refusing foreign/corrupt/newer databases, and running the shipped migrations.

Everything a user can get wrong here becomes an `InputError` (one line, exit 2) before
a single byte of their database is written.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from servetune import __version__
from servetune.errors import InputError
from servetune.store.models import APP, SCHEMA_VERSION

DEFAULT_DB = "servetune.db"
ENV_VAR = "SERVETUNE_DB"
MIGRATIONS = Path(__file__).with_name("migrations")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_FIELD = "--db"


def resolve_url(db: str | None = None) -> str:
    """`--db` beats `$SERVETUNE_DB` beats `./servetune.db`. A bare path means SQLite;
    `postgresql://` gets the psycopg 3 driver, the one servetune installs."""
    raw = db or os.environ.get(ENV_VAR) or DEFAULT_DB
    if "://" not in raw:
        return "sqlite:///" + str(Path(raw).expanduser().absolute())
    for plain in ("postgresql://", "postgres://"):
        if raw.startswith(plain):
            return "postgresql+psycopg://" + raw[len(plain) :]
    return raw


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


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Per-connection settings; none of them writes to the file.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout = 30000")  # several writers (a sweep, a tuner) queue
    cur.execute("PRAGMA foreign_keys = ON")
    cur.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across a crash
    cur.close()


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
    path = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    dest = Path(f"{path}.schema{version}.bak")
    if not dest.exists():
        shutil.copy2(path, dest)
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
        if engine.url.get_backend_name() == "sqlite" and state.kind == "empty":
            with engine.connect() as conn:  # persistent: later readers never block writers
                conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        if state.kind == "old":
            _backup_sqlite(engine, state.version)
        if state.kind in ("empty", "old"):
            upgrade(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise InputError(
            _FIELD, f"cannot write to {where}: {_first_line(exc)}", "check permissions"
        ) from exc
    return engine
