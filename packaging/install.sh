#!/usr/bin/env bash
# Install elasticd on this host from the source tree this script lives in.
#
#   sudo packaging/install.sh [--prefix DIR] [--python PY] [--extras LIST] [--dry-run]
#
# What it does (every step is idempotent; re-run it to upgrade):
#   - creates a virtual environment at PREFIX (default /opt/elasticd) with `PY -m venv`
#   - pip installs the project into it, constrained by packaging/constraints.txt
#   - installs units/elasticd.service to /etc/systemd/system (ExecStart -> PREFIX/bin/elasticd),
#     units/elasticd.sysusers.conf to /usr/lib/sysusers.d/elasticd.conf and
#     units/elasticd.tmpfiles.conf to /usr/lib/tmpfiles.d/elasticd.conf
#   - creates the system group "elastic" (socket access) if missing
#   - creates /etc/elasticd, /var/lib/elasticd and /var/log/elasticd
#   - copies packaging/elasticd.toml.example to /etc/elasticd/elasticd.toml if that is absent
#   - links /usr/local/bin/elasticctl -> PREFIX/bin/elasticctl
#   - runs `systemctl daemon-reload` when systemd is running
# It never enables, starts or restarts the service: restarting stops the jobs on this host.
#
# Options:
#   --prefix DIR    where the virtual environment goes (default /opt/elasticd)
#   --python PY     interpreter to create it with, Python >= 3.11 (default: python3, or $PYTHON)
#   --extras LIST   comma-separated extras to install, e.g. "nvml"; "" for none; default "auto":
#                   nvml when this host has an NVIDIA driver (needed to see its GPUs)
#   --dry-run, -n   print what would be done and change nothing (root not required)
#   --help, -h      this text
set -euo pipefail

PREFIX=/opt/elasticd
PYTHON=${PYTHON:-python3}
EXTRAS=auto
DRY_RUN=0

UNIT_DIR=/etc/systemd/system
SYSUSERS_DIR=/usr/lib/sysusers.d
TMPFILES_DIR=/usr/lib/tmpfiles.d
CONF_DIR=/etc/elasticd
STATE_DIR=/var/lib/elasticd
LOG_DIR=/var/log/elasticd
LINK_DIR=/usr/local/bin
GROUP=elastic

SRC=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PYTHON=$2; shift 2 ;;
        --python=*) PYTHON=${1#*=}; shift ;;
        --extras) [ $# -ge 2 ] || die "--extras needs a list (\"\" for none)"; EXTRAS=$2; shift 2 ;;
        --extras=*) EXTRAS=${1#*=}; shift ;;
        -n | --dry-run) DRY_RUN=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

# --- checks (read-only) -------------------------------------------------------------------------
case $PREFIX in
    /*) ;;
    *) die "--prefix must be an absolute path, got: $PREFIX" ;;
esac
PREFIX=${PREFIX%/}
[ -n "$PREFIX" ] || die "--prefix / is not allowed"
# It ends up in ExecStart= and in a sed replacement: keep it to plain path characters.
case $PREFIX in
    *[!A-Za-z0-9/._+@-]*) die "--prefix may only contain letters, digits and / . _ + @ -: $PREFIX" ;;
esac
case $EXTRAS in
    *[!A-Za-z0-9,_-]*) die "--extras must be a comma-separated list of names: $EXTRAS" ;;
esac

for f in pyproject.toml packaging/constraints.txt packaging/elasticd.toml.example \
    units/elasticd.service units/elasticd.sysusers.conf units/elasticd.tmpfiles.conf; do
    [ -f "$SRC/$f" ] || die "$SRC/$f is missing; run this script from an elasticd source tree"
done

if [ "$(id -u)" -ne 0 ]; then
    [ "$DRY_RUN" -eq 1 ] || die "run as root (or use --dry-run to see what would be done)"
fi

# Files we create must be readable by everyone: users run PREFIX/bin/elasticctl.
umask 022

run() {
    if [ "$DRY_RUN" -eq 1 ]; then
        printf '    would run:'
        printf ' %q' "$@"
        printf '\n'
    else
        printf '    +'
        printf ' %q' "$@"
        printf '\n'
        "$@"
    fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/elasticd-install.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT

# install_file SOURCE DEST MODE: copy when absent or different, report otherwise.
# Sets CHANGED=1 when it (would have) copied. (Not reported through the exit status: a function
# called as a condition runs without `set -e`, and a failed copy must stop the script.)
CHANGED=0
install_file() {
    local src=$1 dest=$2 mode=$3
    CHANGED=0
    if [ -f "$dest" ] && cmp -s -- "$src" "$dest"; then
        note "$dest is up to date"
        return 0
    fi
    if [ -e "$dest" ]; then note "$dest differs: replacing it"; fi
    run install -D -m "$mode" -- "$src" "$dest"
    CHANGED=1
}

say "elasticd from $SRC -> $PREFIX$([ "$DRY_RUN" -eq 1 ] && printf ' (dry run: nothing will be changed)')"

# --- 1. the group that may use the control socket ---------------------------------------------
say "group $GROUP"
if getent group "$GROUP" >/dev/null 2>&1; then
    note "group $GROUP exists"
else
    command -v groupadd >/dev/null 2>&1 || [ "$DRY_RUN" -eq 1 ] || die "groupadd not found"
    run groupadd --system "$GROUP"
fi

# --- 2. the virtual environment ---------------------------------------------------------------
say "virtual environment $PREFIX"
if [ -x "$PREFIX/bin/python" ] && [ -f "$PREFIX/pyvenv.cfg" ]; then
    note "exists; reusing it"
    "$PREFIX/bin/python" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))' ||
        die "$PREFIX has Python < 3.11; remove it (rm -rf $PREFIX) and run this again"
else
    if [ -e "$PREFIX" ] && [ -n "$(ls -A -- "$PREFIX" 2>/dev/null)" ]; then
        die "$PREFIX exists, is not empty and is not a virtual environment; choose another --prefix"
    fi
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        [ "$DRY_RUN" -eq 1 ] || die "$PYTHON not found; install Python >= 3.11 or pass --python"
        note "warning: $PYTHON not found"
    elif ! "$PYTHON" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))'; then
        die "$PYTHON is $("$PYTHON" -V 2>&1); elasticd needs Python >= 3.11 (pass --python)"
    elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        msg="$PYTHON cannot create virtual environments (on Debian/Ubuntu: apt-get install python3-venv)"
        [ "$DRY_RUN" -eq 1 ] || die "$msg"
        note "warning: $msg"
    fi
    # The venv links to its base interpreter and standard library: users running elasticctl
    # must be able to read them, which a pyenv or conda Python under /root or /home may not allow.
    base=$("$PYTHON" -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true)
    case $base in
        /root/* | /home/*) note "warning: $PYTHON lives in $base; users may not be able to run elasticctl" \
            "from this venv. Prefer the system python3 (--python /usr/bin/python3)." ;;
    esac
    run "$PYTHON" -m venv "$PREFIX"
fi

# --- 3. the package ---------------------------------------------------------------------------
if [ "$EXTRAS" = auto ]; then
    if [ -e /dev/nvidiactl ] || command -v nvidia-smi >/dev/null 2>&1; then
        EXTRAS=nvml
        note "NVIDIA driver found: installing the nvml extra so that the daemon sees the GPUs"
    else
        EXTRAS=
    fi
fi
TARGET=$SRC
[ -z "$EXTRAS" ] || TARGET="${SRC}[${EXTRAS}]"
say "pip install $TARGET"
# A local directory is always rebuilt and reinstalled, so re-running upgrades in place.
run "$PREFIX/bin/python" -m pip install --disable-pip-version-check \
    -c "$SRC/packaging/constraints.txt" "$TARGET"

# --- 4. systemd unit, sysusers and tmpfiles snippets ------------------------------------------
say "systemd files"
sed "s|^ExecStart=.*|ExecStart=$PREFIX/bin/elasticd|" "$SRC/units/elasticd.service" >"$WORK/elasticd.service"
grep -qx "ExecStart=$PREFIX/bin/elasticd" "$WORK/elasticd.service" ||
    die "could not rewrite ExecStart in units/elasticd.service"
note "elasticd.service is units/elasticd.service with ExecStart=$PREFIX/bin/elasticd"
install_file "$WORK/elasticd.service" "$UNIT_DIR/elasticd.service" 0644
CHANGED_UNIT=$CHANGED
install_file "$SRC/units/elasticd.sysusers.conf" "$SYSUSERS_DIR/elasticd.conf" 0644
install_file "$SRC/units/elasticd.tmpfiles.conf" "$TMPFILES_DIR/elasticd.conf" 0644

# --- 5. directories (the same modes as the unit's *Directory= and the tmpfiles snippet) -------
say "directories"
ensure_dir() {
    local dir=$1 mode=$2
    if [ -d "$dir" ] && [ "$(stat -c %a -- "$dir")" = "${mode#0}" ]; then
        note "$dir exists"
    else
        run install -d -m "$mode" -- "$dir"
    fi
}
ensure_dir "$CONF_DIR" 0755
ensure_dir "$STATE_DIR" 0700
ensure_dir "$LOG_DIR" 0755

# --- 6. configuration (never overwritten) -----------------------------------------------------
say "configuration $CONF_DIR/elasticd.toml"
if [ -e "$CONF_DIR/elasticd.toml" ]; then
    note "exists; left as it is (compare with $SRC/packaging/elasticd.toml.example)"
else
    # 0600: it may come to hold the etcd password. Only the daemon (root) reads it.
    run install -m 0600 -- "$SRC/packaging/elasticd.toml.example" "$CONF_DIR/elasticd.toml"
fi

# --- 7. elasticctl on users' PATH -------------------------------------------------------------
say "$LINK_DIR/elasticctl"
LINK=$LINK_DIR/elasticctl
if [ -L "$LINK" ] && [ "$(readlink -- "$LINK")" = "$PREFIX/bin/elasticctl" ]; then
    note "$LINK -> $PREFIX/bin/elasticctl exists"
elif [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
    note "warning: $LINK exists and is not a symlink; left alone (users can run $PREFIX/bin/elasticctl)"
else
    [ -d "$LINK_DIR" ] || run mkdir -p -- "$LINK_DIR"
    run ln -sfn -- "$PREFIX/bin/elasticctl" "$LINK"
fi

# --- 8. tell systemd -------------------------------------------------------------------------
say "systemd"
if [ -d /run/systemd/system ]; then
    run systemctl daemon-reload
    if systemctl is-active --quiet elasticd 2>/dev/null; then
        note "elasticd is running the previous version; to switch (this stops the jobs on this host):"
        note "  systemctl restart elasticd"
    elif ! systemctl is-enabled --quiet elasticd 2>/dev/null; then
        note "to start it now and at boot:  systemctl enable --now elasticd"
    fi
else
    note "systemd is not running here: skipped daemon-reload"
    note "start the daemon with: $PREFIX/bin/elasticd   (it reads $CONF_DIR/elasticd.toml)"
fi
if [ "$CHANGED_UNIT" -eq 1 ] && [ "$DRY_RUN" -eq 0 ]; then note "the unit file was updated"; fi

say "done$([ "$DRY_RUN" -eq 1 ] && printf ' (dry run)')"
cat <<EOF
    Next:
      - edit $CONF_DIR/elasticd.toml (as shipped: a one-host node with an embedded etcd;
        multi-host nodes set etcd_endpoints, TLS, auth and address)
      - let users submit jobs:  usermod -aG $GROUP USER   (takes effect at their next login)
      - check:  elasticctl ping
EOF
