#!/usr/bin/env bash
# Make sure PostgreSQL answers on 127.0.0.1:5432 with a `fleetbench` role and database
# (password `fleetbench`, loopback only) for the warehouse tests and production-like runs.
source "$(dirname "$0")/lib.sh"

PGURL="postgresql://fleetbench:fleetbench@127.0.0.1:5432/fleetbench"
pg_ok() { PGPASSWORD=fleetbench psql -h 127.0.0.1 -U fleetbench -d fleetbench -tAc 'select 1' >/dev/null 2>&1; }

pg_ok && exit 0
apt_install postgresql
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  cluster="$(pg_lsclusters -h 2>/dev/null | awk '$3 == 5432 {print $1" "$2; exit}')"
  if [ -z "$cluster" ]; then
    ver="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
    say "creating PostgreSQL $ver cluster 'main' on port 5432"
    pg_createcluster "$ver" main -p 5432 >/dev/null
    cluster="$ver main"
  fi
  say "starting PostgreSQL cluster $cluster"
  pg_ctlcluster $cluster start
fi
wait_for 30 postgres pg_isready -h 127.0.0.1 -p 5432 -q || die "PostgreSQL did not answer on 127.0.0.1:5432"
su postgres -c "psql -v ON_ERROR_STOP=1 -q" <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fleetbench') THEN
    CREATE ROLE fleetbench LOGIN PASSWORD 'fleetbench' CREATEDB;
  END IF;
END $$;
SELECT 'CREATE DATABASE fleetbench OWNER fleetbench' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'fleetbench')\gexec
SQL
pg_ok || die "cannot log in as fleetbench on 127.0.0.1:5432 (check pg_hba.conf allows md5/scram on 127.0.0.1)"
say "PostgreSQL answers: $PGURL"
