#!/bin/sh
# The compose one-shot `minio-init` (image minio/mc): buckets, anchor versioning, service users.
# Idempotent: it runs on every `docker compose up`. tests/e2e/test_compose_native.py does the
# bucket and versioning steps natively with the minio Python client (its S3 server takes any
# key, so the user and policy steps have no native equivalent there).
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}"
: "${MINIO_APP_ACCESS_KEY:?}" "${MINIO_APP_SECRET_KEY:?}"
: "${MINIO_ANCHOR_ACCESS_KEY:?}" "${MINIO_ANCHOR_SECRET_KEY:?}"
DATA_BUCKET="${DPSYNTH_BUCKET:-dpsynth}"
ANCHOR_BUCKET="${DPSYNTH_ANCHOR_BUCKET:-dpsynth-ledger-anchor}"
POLICIES=/tmp/dpsynth-policies
mkdir -p "$POLICIES"

mc alias set local "${MINIO_URL:-http://minio:9000}" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"

mc mb --ignore-existing local/"$DATA_BUCKET"
# Object lock can only be switched on when a bucket is created (it also turns on
# versioning): an overwritten anchor record then only adds a version, the original stays.
# No default retention is set; `mc retention set --default GOVERNANCE <days>d` adds one.
mc mb --ignore-existing --with-lock local/"$ANCHOR_BUCKET"
mc version enable local/"$ANCHOR_BUCKET"

# api and workers: everything on the data bucket, nothing on the anchor bucket.
cat > "$POLICIES/dpsynth-app.json" <<JSON
{"Version": "2012-10-17", "Statement": [
  {"Effect": "Allow", "Action": ["s3:*"],
   "Resource": ["arn:aws:s3:::$DATA_BUCKET", "arn:aws:s3:::$DATA_BUCKET/*"]}]}
JSON
# The ledger's anchor: read and append, never delete (the anchor is what a restored database
# is checked against, so the ledger's own credentials must not be able to rewind it).
cat > "$POLICIES/dpsynth-ledger-anchor.json" <<JSON
{"Version": "2012-10-17", "Statement": [
  {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket"],
   "Resource": ["arn:aws:s3:::$ANCHOR_BUCKET"]},
  {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
   "Resource": ["arn:aws:s3:::$ANCHOR_BUCKET/*"]}]}
JSON

attach() {  # attach policy $1 to user $2; "already in effect" on a re-run is fine
    if ! out=$(mc admin policy attach local "$1" --user "$2" 2>&1); then
        case "$out" in
            *already*) ;;
            *) echo "$out" >&2; exit 1 ;;
        esac
    fi
}

mc admin policy create local dpsynth-app "$POLICIES/dpsynth-app.json"
mc admin policy create local dpsynth-ledger-anchor "$POLICIES/dpsynth-ledger-anchor.json"
mc admin user add local "$MINIO_APP_ACCESS_KEY" "$MINIO_APP_SECRET_KEY"
mc admin user add local "$MINIO_ANCHOR_ACCESS_KEY" "$MINIO_ANCHOR_SECRET_KEY"
attach dpsynth-app "$MINIO_APP_ACCESS_KEY"
attach dpsynth-ledger-anchor "$MINIO_ANCHOR_ACCESS_KEY"
echo "minio-init: buckets $DATA_BUCKET and $ANCHOR_BUCKET (versioned, object lock) ready"
