#!/usr/bin/env bash
# The PostgreSQL roles and databases of docker-compose.yaml, one role per job:
#
#   role (.env)                        database (.env)            may                      used by
#   POSTGRES_USER (superuser)          POSTGRES_DB                everything               Airflow's central services
#   CELERY_RESULTS_USER                CELERY_RESULTS_DB          own its database         scheduler, Celery workers
#   FLEETBENCH_WAREHOUSE_USER          FLEETBENCH_WAREHOUSE_DB    own its database         airflow-init, central workers
#   FLEETBENCH_WAREHOUSE_READER_USER   FLEETBENCH_WAREHOUSE_DB    SELECT only (read-only)  the api-server's results view
#
# No other role may connect to these three databases (CONNECT and TEMP are revoked from PUBLIC), and
# the reader gets SELECT on every table and view the warehouse role creates, now and in later migrations.
#
# The postgres image runs this file once, as the superuser, when it initialises an empty data volume
# (docker-compose.yaml mounts it into /docker-entrypoint-initdb.d/). It is idempotent: run it again
# after changing one of the passwords in .env, or on a volume initialised before it existed (it then
# also hands the warehouse's tables, created by the superuser, to the warehouse role):
#   docker compose exec postgres bash /docker-entrypoint-initdb.d/10-fleetbench-roles.sh
#
# Passwords are read from the environment by psql (\getenv), so they appear on no command line.

fleetbench_roles() {
  local var
  for var in POSTGRES_USER POSTGRES_DB CELERY_RESULTS_PASSWORD FLEETBENCH_WAREHOUSE_PASSWORD \
             FLEETBENCH_WAREHOUSE_READER_PASSWORD; do
    if [ -z "${!var:-}" ]; then
      echo "postgres-roles: $var is not set" >&2
      return 1
    fi
  done
  psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v metadata_db="$POSTGRES_DB" \
    -v celery_user="${CELERY_RESULTS_USER:-airflow_celery}" \
    -v celery_db="${CELERY_RESULTS_DB:-airflow_celery}" \
    -v wh_user="${FLEETBENCH_WAREHOUSE_USER:-fleetbench}" \
    -v wh_db="${FLEETBENCH_WAREHOUSE_DB:-fleetbench}" \
    -v reader_user="${FLEETBENCH_WAREHOUSE_READER_USER:-fleetbench_reader}" <<'SQL'
\getenv celery_password CELERY_RESULTS_PASSWORD
\getenv wh_password FLEETBENCH_WAREHOUSE_PASSWORD
\getenv reader_password FLEETBENCH_WAREHOUSE_READER_PASSWORD

-- Roles: created once; attributes and password (re)set on every run.
SELECT format('CREATE ROLE %I', r) FROM unnest(ARRAY[:'celery_user', :'wh_user', :'reader_user']) AS r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r)
\gexec
ALTER ROLE :"celery_user" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'celery_password';
ALTER ROLE :"wh_user" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'wh_password';
ALTER ROLE :"reader_user" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'reader_password';
ALTER ROLE :"reader_user" SET default_transaction_read_only = on;

-- Databases, each owned by the role that migrates and writes it.
SELECT format('CREATE DATABASE %I OWNER %I', d, o)
  FROM (VALUES (:'celery_db', :'celery_user'), (:'wh_db', :'wh_user')) AS t(d, o)
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = d)
\gexec
ALTER DATABASE :"celery_db" OWNER TO :"celery_user";
ALTER DATABASE :"wh_db" OWNER TO :"wh_user";
REVOKE ALL ON DATABASE :"metadata_db" FROM PUBLIC;
REVOKE ALL ON DATABASE :"celery_db" FROM PUBLIC;
REVOKE ALL ON DATABASE :"wh_db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"wh_db" TO :"reader_user";

\connect :"celery_db"
ALTER SCHEMA public OWNER TO :"celery_user";
REVOKE ALL ON SCHEMA public FROM PUBLIC;

\connect :"wh_db"
ALTER SCHEMA public OWNER TO :"wh_user";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
-- Tables and views another role created (the superuser, before this file existed) go to the warehouse
-- role; sequences follow their tables.
SELECT format('ALTER %s %I.%I OWNER TO %I',
              CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
              n.nspname, c.relname, :'wh_user')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm') AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = :'wh_user')
\gexec
GRANT USAGE ON SCHEMA public TO :"reader_user";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"reader_user";
ALTER DEFAULT PRIVILEGES FOR ROLE :"wh_user" IN SCHEMA public GRANT SELECT ON TABLES TO :"reader_user";
SQL
}

fleetbench_roles
