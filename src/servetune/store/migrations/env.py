"""Alembic environment. servetune runs migrations itself (`store.db.upgrade`), passing
its connection in `config.attributes["connection"]`; the URL fallback is for developers
who run `alembic` by hand (see docs/store.md)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from servetune.store.models import Base

config = context.config


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    # Batch mode: SQLite cannot ALTER most things in place; alembic copies the table.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


conn = config.attributes.get("connection")
if conn is not None:
    _run(conn)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as c:
        _run(c)
