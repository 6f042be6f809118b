"""The store's tables (SQLAlchemy 2 declarative). Migrations in `migrations/versions`
create exactly these; `tests/test_store_schema.py` checks the two never drift apart.

Runs hold the seed 003 §16 experiment record: searchable columns for what `runs list`
filters on, JSON for the rest, and the raw per-request records in compressed chunks
(`record_chunks`, one row per `append_records` call, so a crash loses nothing
committed). Request lists and server-metric series are content-addressed blobs, stored
once however many sweep points share them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from servetune.errors import InputError

# Bumped by every migration; a database with a higher number was written by a newer
# servetune and is refused rather than misread.
SCHEMA_VERSION = 2
APP = "servetune"


def check_length(field: str, value: object, column: Any) -> None:
    """Refuse text longer than `column` (a mapped attribute such as `RunTag.tag`) holds,
    in one line naming `field`, on every database alike: PostgreSQL refuses it with a
    traceback, SQLite keeps it, and then the run cannot move to PostgreSQL."""
    limit = getattr(getattr(column, "type", None), "length", None)
    if isinstance(value, str) and limit and len(value) > limit:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise InputError(
            field,
            f"{shown!r} is {len(value)} characters; the store keeps at most {limit}",
            "shorten it",
        )


def check_tag(field: str, tag: str) -> None:
    """A tag is one word: not empty (an unset shell variable), no comma (`report A,B` and
    `runs list` split and join on commas: `x,y` stored as one tag showed as two and no
    `--tag x` found it), no blank (`a b` read as two words), and as long as the store
    keeps (`check_length`). Every command that tags checks this one rule."""
    if not tag.strip():
        raise InputError(field, "an empty tag names nothing", "give a word such as baseline")
    if "," in tag or any(c.isspace() for c in tag):
        parts = [p for p in re.split(r"[,\s]+", tag) if p]
        raise InputError(
            field,
            f"{tag!r} holds a comma or a blank",
            f"one word per tag, each its own: {' '.join(parts)}"
            if len(parts) > 1
            else f"give {parts[0]}",
        )
    check_length(field, tag, RunTag.tag)


def check_row(row: Base, names: Mapping[str, str] | None = None) -> None:
    """`check_length` for every text column of `row`, each named by `names` (what the
    user calls it: `model`, `run id`) or by the column."""
    for col in row.__table__.columns:
        check_length((names or {}).get(col.key, col.key), getattr(row, col.key), col)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Info(Base):
    """Key/value facts about the database: app name, schema version, who wrote it."""

    __tablename__ = "servetune_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Study(Base):
    """A group of runs: a sweep, a tuning session, an A/B."""

    __tablename__ = "studies"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str | None] = mapped_column(String(32))
    created_utc: Mapped[str] = mapped_column(String(32))
    note: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Run(Base):
    """One experiment (seed 003 §16): a bench or simulate run at one load point."""

    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    study_id: Mapped[str | None] = mapped_column(
        ForeignKey("studies.id", ondelete="SET NULL"), index=True
    )
    created_utc: Mapped[str] = mapped_column(String(32), index=True)
    # Insertion order: breaks ties between runs created in the same second (created_utc
    # has second precision), so a sweep lists in the order it ran (schema 2).
    seq: Mapped[int | None] = mapped_column(Integer, index=True)
    updated_utc: Mapped[str] = mapped_column(String(32))  # heartbeat while running
    backend: Mapped[str] = mapped_column(String(8))
    # running | completed | interrupted | circuit_breaker | slo_missed | failed | incomplete
    status: Mapped[str] = mapped_column(String(20), index=True)
    stop_reason: Mapped[str | None] = mapped_column(Text)
    writer: Mapped[str | None] = mapped_column(String(200))  # host:pid:start of the writer
    model: Mapped[str | None] = mapped_column(String(300), index=True)
    engine: Mapped[str | None] = mapped_column(String(32), index=True)
    engine_version: Mapped[str | None] = mapped_column(String(100))
    hardware: Mapped[str | None] = mapped_column(String(200))
    gpu_count: Mapped[int | None] = mapped_column(Integer)
    load_kind: Mapped[str | None] = mapped_column(String(20))
    rate: Mapped[float | None] = mapped_column(Float)
    concurrency: Mapped[int | None] = mapped_column(Integer)
    n_records: Mapped[int] = mapped_column(Integer, default=0)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)  # RunMeta as given
    result: Mapped[dict[str, Any]] = mapped_column(default=dict)  # RunResult's small fields
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_dist: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stability: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    quality: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    conclusion: Mapped[str | None] = mapped_column(String(8))  # keep | drop | next
    conclusion_note: Mapped[str | None] = mapped_column(Text)
    concluded_utc: Mapped[str | None] = mapped_column(String(32))

    tags: Mapped[list[RunTag]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, lazy="selectin"
    )
    study: Mapped[Study | None] = relationship(lazy="joined")


class RunTag(Base):
    __tablename__ = "run_tags"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(100), primary_key=True)
    __table_args__ = (Index("ix_run_tags_tag", "tag"),)


class RecordChunk(Base):
    """A batch of raw request records, encoded by `store.codec`."""

    __tablename__ = "record_chunks"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    codec: Mapped[str] = mapped_column(String(16))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Blob(Base):
    """Content-addressed compressed JSON (sha256 of the uncompressed bytes)."""

    __tablename__ = "blobs"
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    codec: Mapped[str] = mapped_column(String(16))
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunBlob(Base):
    """Which blob holds a run's `requests` (materialised workload) or `server` series."""

    __tablename__ = "run_blobs"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    hash: Mapped[str] = mapped_column(ForeignKey("blobs.hash"), index=True)
