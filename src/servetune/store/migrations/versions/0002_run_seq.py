"""runs.seq: insertion order, the tie-break between runs created in the same second.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
# The schema number this migration leads to (models.SCHEMA_VERSION after it).
schema_version = 2


def upgrade() -> None:
    op.add_column("runs", sa.Column("seq", sa.Integer(), nullable=True))
    op.create_index("ix_runs_seq", "runs", ["seq"])
    # Runs stored before: numbered in the order readers listed them (created, then id).
    op.execute(
        sa.text(
            "UPDATE runs SET seq = (SELECT count(*) FROM runs AS r2"
            " WHERE r2.created_utc < runs.created_utc"
            " OR (r2.created_utc = runs.created_utc AND r2.id <= runs.id))"
        )
    )
    op.execute(
        sa.text("UPDATE servetune_info SET value = :v WHERE key = 'schema'").bindparams(
            v=str(schema_version)
        )
    )


def downgrade() -> None:
    op.drop_index("ix_runs_seq", "runs")
    op.drop_column("runs", "seq")
