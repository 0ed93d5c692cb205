"""Storage: the SQLite database (sqlite-utils, WAL, one transaction per run), its
migrations, and maintenance (backup, export)."""
