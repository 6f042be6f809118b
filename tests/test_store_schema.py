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
from servetune.store.db import MIGRATIONS, resolve_url
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


def test_new_sqlite_db_uses_wal(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    Store.open(str(db)).close()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    con.close()


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
