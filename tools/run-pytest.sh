#!/usr/bin/env bash
# Run pytest; exit 5 ("no tests were collected") is a failure, not a pass.
set -uo pipefail
pytest=${1:-pytest}
shift || true
"$pytest" "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit $rc
