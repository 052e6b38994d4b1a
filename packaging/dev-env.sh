#!/usr/bin/env bash
# Create or refresh ./.venv for development, the demo and the tests. Sourced by demo.sh and test.sh.
# Usage: packaging/dev-env.sh [EXTRAS]   (default EXTRAS: test,grpc)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-test,grpc}"
venv="$repo/.venv"
python="${PYTHON:-python3}"

"$python" - <<'PY' || { echo "elasticd needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 2; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.elasticd-$extras.stamp"
want="$(cat "$repo/pyproject.toml" "$repo/packaging/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log="$venv/pip-install.log"
    echo "setting up $venv (log: $log)" >&2
    {
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip &&
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            -c "$repo/packaging/constraints.txt" -e "${repo}[${extras}]"
    } > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
    echo "$want" > "$stamp"
fi
