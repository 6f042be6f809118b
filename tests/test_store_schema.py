"""Schema versioning and bad databases: migrations match the models, and a corrupt,
foreign, newer or unreachable database gives a one-line InputError with the data
untouched."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from servetune.errors import InputError
from servetune.store import Store
from servetune.store import db as db_mod
from servetune.store.db import MIGRATIONS, resolve_url, wal_is_safe
from servetune.store.models import SCHEMA_VERSION


def _digest(path: Path) -> tuple[str, list[str]]:
    siblings = sorted(p.name for p in path.parent.iterdir())
    return hashlib.sha256(path.read_bytes()).hexdigest(), siblings


def test_migrated_db_is_at_head(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    Store.open(str(db)).close()
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        head = ScriptDirectory.from_config(_cfg()).get_current_head()
        assert MigrationContext.configure(conn).get_current_revision() == head
    engine.dispose()


def _cfg() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def test_head_migration_sets_the_code_schema_version() -> None:
    script = ScriptDirectory.from_config(_cfg())
    head = script.get_revision(script.get_current_head())
    assert head.module.schema_version == SCHEMA_VERSION


def _journal(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_wal_only_on_sqlite_libraries_with_the_wal_reset_fix() -> None:
    assert not wal_is_safe((3, 40, 1))  # Debian 12
    assert not wal_is_safe((3, 45, 1))  # Ubuntu 24.04
    assert not wal_is_safe((3, 51, 2))
    assert wal_is_safe((3, 44, 6)) and wal_is_safe((3, 50, 7)) and wal_is_safe((3, 51, 3))
    assert wal_is_safe((3, 54, 1))


@pytest.mark.parametrize("version", [(3, 40, 1), (3, 52, 0)])
def test_new_sqlite_db_journal_follows_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: tuple[int, int, int]
) -> None:
    monkeypatch.setattr(db_mod, "_sqlite_version", lambda engine: version)
    db = tmp_path / "w.db"
    Store.open(str(db)).close()
    assert _journal(db) == ("wal" if wal_is_safe(version) else "delete")


def test_wal_database_goes_back_to_a_rollback_journal_on_an_unsafe_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_mod, "_sqlite_version", lambda engine: (3, 52, 0))
    db = tmp_path / "w.db"
    with Store.open(str(db)) as st:
        st.ensure_study("kept")
    assert _journal(db) == "wal"
    monkeypatch.setattr(db_mod, "_sqlite_version", lambda engine: (3, 40, 1))
    other = sqlite3.connect(db)  # another process has it open: it stays WAL this time
    other.execute("BEGIN")
    other.execute("SELECT count(*) FROM studies").fetchone()
    Store.open(str(db)).close()
    assert _journal(db) == "wal"
    other.close()
    Store.open(str(db), create=False).close()  # readers never switch it
    assert _journal(db) == "wal"
    with Store.open(str(db)) as st:  # the next writer does; nothing is lost
        assert st.ensure_study("kept")
    assert _journal(db) == "delete"


def test_url_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVETUNE_DB", raising=False)
    assert resolve_url(None) == f"sqlite:///{tmp_path}/servetune.db"
    monkeypatch.setenv("SERVETUNE_DB", "team.db")
    assert resolve_url(None) == f"sqlite:///{tmp_path}/team.db"
    assert resolve_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"


def test_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    Store.open(str(db)).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE servetune_info SET value = '99' WHERE key = 'schema'")
    con.execute("UPDATE servetune_info SET value = '9.9.9' WHERE key = 'written_by'")
    con.commit()
    con.close()
    before = _digest(db)
    for create in (True, False):
        with pytest.raises(InputError, match=r"schema 99 \(written by servetune 9\.9\.9\)"):
            Store.open(str(db), create=create)
    assert _digest(db) == before


def test_foreign_sqlite_db_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users VALUES (1, 'ann')")
    con.commit()
    con.close()
    before = _digest(db)
    with pytest.raises(InputError, match="not a servetune database.*users") as exc:
        Store.open(str(db))
    assert "\n" not in exc.value.one_line()
    assert _digest(db) == before  # not even switched to WAL


@pytest.mark.parametrize(
    "content",
    [b"this is a text file, not a database\n" * 50, b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["foreign-file", "corrupt-sqlite"],
)
def test_corrupt_file_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "bad.db"
    db.write_bytes(content)
    with pytest.raises(InputError, match="--db"):
        Store.open(str(db))
    assert db.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.db"]


def test_unreachable_url_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open postgresql") as exc:
        Store.open("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(exc.value)


def test_missing_file_for_readers_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no servetune database"):
        Store.open(str(tmp_path / "none.db"), create=False)
    assert not (tmp_path / "none.db").exists()
    with pytest.raises(InputError, match="does not exist"):
        Store.open(str(tmp_path / "no" / "such.db"))
    with pytest.raises(InputError, match="not a database URL"):
        Store.open("::::://")
