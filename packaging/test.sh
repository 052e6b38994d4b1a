#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set up .venv, lint, type-check, run every test.
# Extra arguments go to pytest (e.g. packaging/test.sh -k ddp). The fast lane, under 4 minutes on
# 2 cores: packaging/test.sh -m "not slow" (the soak, the .deb build and other long runs left out).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/packaging/dev-env.sh" test,grpc
bin="$repo/.venv/bin"
cd "$repo"
# promtool checks the alerting rules (tests/unit/test_unit_monitoring.py). It is not on PyPI: where
# apt can fetch Debian's prometheus package, its one static binary is taken out of the package into
# the venv, without installing the package (no service, no dependencies). Elsewhere that test skips.
if ! command -v promtool >/dev/null && [ ! -x "$bin/promtool" ] && command -v apt-get >/dev/null; then
    tmp=$(mktemp -d)
    if (cd "$tmp" && apt-get download prometheus) >/dev/null 2>&1 && dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"; then
        cp "$tmp/x/usr/bin/promtool" "$bin/promtool"
    fi
    rm -rf "$tmp"
fi
# nft drives the port filter's tests (tests/integration/test_portfilter.py, the nft contract). As
# root where apt works, the nftables package is installed when missing (it ships no rule and
# starts nothing by itself); elsewhere those tests skip, saying so.
if ! command -v nft >/dev/null && [ ! -x /usr/sbin/nft ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null 2>&1 || echo "nftables not installed: the port filter's tests skip" >&2
fi
# The suite starts hundreds of interpreters (daemons, CLIs, helpers, workers). Where bytecode
# writes are off (PYTHONDONTWRITEBYTECODE, set in some CI images), each would compile the package
# from source again: a daemon's start costs half as much again. __pycache__ is ignored by git and
# left out of the .deb (packaging/build-deb.sh).
unset PYTHONDONTWRITEBYTECODE
"$bin/python" -m compileall -q -j 0 elasticd elasticctl tests bench examples >/dev/null
"$bin/ruff" check .
"$bin/ruff" format --check elasticd elasticctl tests bench examples
# The user guide (mkdocs.yml): --strict fails on a broken link or anchor and on a page left out of the nav.
"$bin/mkdocs" build --strict --site-dir "$(mktemp -d)"
# mypy (strict, ~40 s of one core from a cold cache) checks the types beside the tests, on the CPU
# the workers leave idle while they wait on leases and rounds. Its verdict is printed after the
# tests', and a type error fails the run.
types="$(mktemp)"
"$bin/mypy" >"$types" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$types"' EXIT
# pytest exits 5 when it collects nothing: that fails the run, as it should.
# Four workers (ELASTICD_TEST_WORKERS) on 2 cores: most integration tests wait on leases,
# timeouts and rounds, not on the CPU. Two workers take a third longer; three keep the cores
# about 82% busy, four about 88% and finish a run a few percent sooner. A group
# (pytest.mark.xdist_group) keeps tests that share a costly fixture together. The slowest tests
# are listed at the end: where a run's minutes went.
status=0
"$bin/python" -m pytest -p no:cacheprovider --timeout 300 --durations 25 \
    -n "${ELASTICD_TEST_WORKERS:-4}" --dist loadgroup "$@" || status=$?
if wait "$mypy_pid"; then
    cat "$types"
else
    cat "$types" >&2
    echo "mypy found type errors" >&2
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
