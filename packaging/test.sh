#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set up .venv, lint, type-check, run every test.
# Extra arguments go to pytest (e.g. packaging/test.sh -k ddp).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/packaging/dev-env.sh" test,grpc
bin="$repo/.venv/bin"
cd "$repo"
"$bin/ruff" check .
"$bin/ruff" format --check elasticd elasticctl tests bench examples
"$bin/mypy"
# pytest exits 5 when it collects nothing; with `set -e` that fails the run, as it should.
# Two workers (ELASTICD_TEST_WORKERS): most integration tests wait on leases, timeouts and rounds,
# not on the CPU. A group (pytest.mark.xdist_group) keeps tests that share a costly fixture together.
exec "$bin/python" -m pytest -p no:cacheprovider --timeout 300 \
    -n "${ELASTICD_TEST_WORKERS:-2}" --dist loadgroup "$@"
