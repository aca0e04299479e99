"""Alembic environment: migrations run on a connection handed in by `fleetbench.warehouse.upgrade`."""

from alembic import context

from fleetbench.warehouse.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
