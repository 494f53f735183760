"""the formats a document's outputs were written in (documents.output_formats: a JSON list of format names)

Outputs written before it were JSON, markdown and, when one could be made, the searchable PDF: the list is
set from their keys.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, as 0004 and 0005: no view reads the column.
    op.add_column("documents", sa.Column("output_formats", sa.JSON))
    op.execute("""UPDATE documents SET output_formats = '["json", "md", "pdf"]'
                  WHERE json_key IS NOT NULL AND markdown_key IS NOT NULL AND pdf_key IS NOT NULL""")
    op.execute("""UPDATE documents SET output_formats = '["json", "md"]'
                  WHERE json_key IS NOT NULL AND markdown_key IS NOT NULL AND pdf_key IS NULL""")


def downgrade() -> None:
    op.drop_column("documents", "output_formats")
