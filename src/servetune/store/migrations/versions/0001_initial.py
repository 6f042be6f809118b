"""The first schema: studies, runs (seed 003 §16), tags, record chunks, blobs.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
schema_version = 1


def upgrade() -> None:
    op.create_table(
        "servetune_info",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    op.create_table(
        "studies",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("kind", sa.String(32), nullable=True),
        sa.Column("created_utc", sa.String(32), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column(
            "study_id",
            sa.String(64),
            sa.ForeignKey("studies.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("created_utc", sa.String(32), nullable=False),
        sa.Column("updated_utc", sa.String(32), nullable=False),
        sa.Column("backend", sa.String(8), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("writer", sa.String(200), nullable=True),
        sa.Column("model", sa.String(300), nullable=True),
        sa.Column("engine", sa.String(32), nullable=True),
        sa.Column("engine_version", sa.String(100), nullable=True),
        sa.Column("hardware", sa.String(200), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=True),
        sa.Column("load_kind", sa.String(20), nullable=True),
        sa.Column("rate", sa.Float(), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("n_records", sa.Integer(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("request_dist", sa.JSON(), nullable=True),
        sa.Column("stability", sa.JSON(), nullable=True),
        sa.Column("quality", sa.JSON(), nullable=True),
        sa.Column("conclusion", sa.String(8), nullable=True),
        sa.Column("conclusion_note", sa.Text(), nullable=True),
        sa.Column("concluded_utc", sa.String(32), nullable=True),
    )
    for col in ("study_id", "created_utc", "status", "model", "engine"):
        op.create_index(f"ix_runs_{col}", "runs", [col])
    op.create_table(
        "run_tags",
        sa.Column(
            "run_id",
            sa.String(100),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("tag", sa.String(100), primary_key=True),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    op.create_table(
        "record_chunks",
        sa.Column(
            "run_id",
            sa.String(100),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("codec", sa.String(16), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("codec", sa.String(16), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "run_blobs",
        sa.Column(
            "run_id",
            sa.String(100),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("hash", sa.String(64), sa.ForeignKey("blobs.hash"), nullable=False),
    )
    op.create_index("ix_run_blobs_hash", "run_blobs", ["hash"])
    info = sa.table("servetune_info", sa.column("key", sa.String), sa.column("value", sa.Text))
    op.bulk_insert(info, [{"key": "app", "value": "servetune"}, {"key": "schema", "value": "1"}])


def downgrade() -> None:
    for name in ("run_blobs", "blobs", "record_chunks", "run_tags", "runs", "studies"):
        op.drop_table(name)
    op.drop_table("servetune_info")
