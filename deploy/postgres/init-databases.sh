#!/bin/sh
# First start of the postgres container (docker-entrypoint-initdb.d): one role and one
# database per service, so the api's credentials cannot touch the ledger's tables (the ledger
# is the budget's source of truth) and the other way round. It runs once, on an empty data
# volume; later password changes are `ALTER ROLE ... PASSWORD` by hand (docs/deploy.md).
# tests/e2e/test_compose_native.py runs this same script against the embedded PostgreSQL.
set -eu
: "${POSTGRES_API_PASSWORD:?}" "${POSTGRES_LEDGER_PASSWORD:?}"
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" \
     --dbname "${POSTGRES_DB:-postgres}" \
     -v api_password="$POSTGRES_API_PASSWORD" \
     -v ledger_password="$POSTGRES_LEDGER_PASSWORD" <<'SQL'
CREATE ROLE dpsynth_api LOGIN PASSWORD :'api_password';
CREATE ROLE dpsynth_ledger LOGIN PASSWORD :'ledger_password';
CREATE DATABASE dpsynth_api OWNER dpsynth_api;
CREATE DATABASE dpsynth_ledger OWNER dpsynth_ledger;
REVOKE ALL ON DATABASE dpsynth_api FROM PUBLIC;
REVOKE ALL ON DATABASE dpsynth_ledger FROM PUBLIC;
SQL
