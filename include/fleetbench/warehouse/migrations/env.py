"""Alembic environment: migrations run on a connection handed in by `fleetbench.warehouse.upgrade`."""

from alembic import context

from fleetbench.warehouse.schema import metadata

connection = context.config.attributes["connection"]
sqlite = connection.dialect.name == "sqlite"
if sqlite:
    # A batch ALTER rebuilds a table and renames the copy into place; SQLite's modern rename re-checks
    # every view against the schema in between (capacity_features names benchmark_results) and fails.
    # The legacy rename leaves views alone; they name the table, which is back after the rename.
    connection.exec_driver_sql("PRAGMA legacy_alter_table = ON")
try:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
finally:
    if sqlite:
        connection.exec_driver_sql("PRAGMA legacy_alter_table = OFF")
