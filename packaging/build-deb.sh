#!/usr/bin/env bash
# Build the Debian package elasticd_<version>_<arch>.deb from this source tree.
#
#   packaging/build-deb.sh [--out DIR] [--python PY] [--compress xz|gzip|zstd|none] [--revision N]
#
# The package holds:
#   /opt/elasticd/                       a self-contained virtual environment (elasticd, its
#                                        dependencies, the nvml extra; not torch: jobs run with
#                                        their submitter's interpreter)
#   /usr/bin/{elasticd,elasticctl,elasticrun} -> /opt/elasticd/bin/...
#   /usr/lib/systemd/system/elasticd.service  units/elasticd.service, ExecStart=/opt/elasticd/bin/elasticd
#   /usr/lib/sysusers.d/elasticd.conf, /usr/lib/tmpfiles.d/elasticd.conf
#   /etc/elasticd/elasticd.toml          packaging/elasticd.toml.example (a conffile, mode 0600)
#   maintainer scripts from packaging/deb/ (create the group and directories; never start the service)
#
# A virtual environment is not relocatable: its scripts' shebangs and activate files name the
# path it was created at. So it is created *at* /opt/elasticd, in a private mount namespace
# (unshare -m; as non-root, unshare -rm) where an overlay makes /opt writable without touching
# the host and a staging directory is bind-mounted onto /opt/elasticd. The host's /opt is never
# written. The interpreter is Debian's (/usr/bin/pythonX.Y, from --python, default
# /usr/bin/python3); the package depends on exactly that pythonX.Y because the venv's compiled
# dependencies are built for its ABI.
#
# Needs: dpkg-deb, unshare and mount (util-linux), pythonX.Y with venv/ensurepip (python3-venv),
# and a package index for pip (dependencies are pinned by packaging/constraints.txt).
#
# Options:
#   --out DIR        where the .deb goes (default: dist/ in the source tree)
#   --python PY      Debian interpreter to build the venv from (default /usr/bin/python3)
#   --compress C     dpkg-deb compressor: xz (default), gzip, zstd or none
#   --revision N     Debian revision: the version becomes <version>-N (default: none)
#   --help, -h       this text
set -euo pipefail

SRC=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
PREFIX=/opt/elasticd
OUT=$SRC/dist
PYTHON=/usr/bin/python3
COMPRESS=xz
REVISION=

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { printf 'build-deb.sh: error: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

# --- inside the private mount namespace: build the venv at /opt/elasticd ----------------------
# Re-executed by the outer script through unshare; STAGE, WORK, PYBIN and SRC come from it.
if [ "${ELASTICD_DEB_INNER:-}" = 1 ]; then
    # unshare(1) already makes every mount private; say it again so that nothing below can
    # propagate to the host whatever the defaults.
    mount --make-rprivate /
    mkdir -p "$WORK/ovl"
    # The overlay's upper layer must not be on an overlay itself (containers' root often is).
    mount -t tmpfs -o mode=0755 tmpfs "$WORK/ovl"
    mkdir -p "$WORK/ovl/upper" "$WORK/ovl/work"
    mount -t overlay overlay -o "lowerdir=/opt,upperdir=$WORK/ovl/upper,workdir=$WORK/ovl/work" /opt
    mkdir -p "$PREFIX"
    mount --bind "$STAGE$PREFIX" "$PREFIX"
    [ -z "$(ls -A "$PREFIX")" ] || die "$PREFIX is not empty inside the build namespace"

    "$PYBIN" -m venv "$PREFIX"
    pip=("$PREFIX/bin/python" -m pip --disable-pip-version-check --no-input)
    # Build the wheel from a copy, so that the source tree gets no build/ or *.egg-info.
    mkdir -p "$WORK/src" "$WORK/wheels"
    cp -a "$SRC/pyproject.toml" "$SRC/elasticd" "$SRC/elasticctl" "$WORK/src/"
    [ ! -f "$SRC/README.md" ] || cp -a "$SRC/README.md" "$WORK/src/"
    find "$WORK/src" -name __pycache__ -type d -prune -exec rm -rf {} +
    "${pip[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/wheels" "$WORK/src"
    wheel=$(find "$WORK/wheels" -name 'elasticd-*.whl' | head -n 1)
    [ -n "$wheel" ] || die "pip wheel produced no elasticd wheel"
    # nvml: pure Python; on a host without an NVIDIA driver the daemon logs that and counts CPUs.
    "${pip[@]}" install --quiet -c "$SRC/packaging/constraints.txt" "${wheel}[nvml]"
    # The daemon never installs anything: pip and setuptools would only be dead weight that dpkg
    # then owns (and an invitation to pip-install into a dpkg-managed tree).
    "${pip[@]}" uninstall --quiet --yes pip setuptools
    "$PREFIX/bin/python" -c 'import elasticd.etcd.client, elasticd.daemon.main, elasticctl.cli, elasticctl.run, zmq, psutil'
    # Ship sources only, as Debian's Python packages do: postinst compiles the bytecode with the
    # installed interpreter and prerm removes it.
    find "$PREFIX" -depth -type d -name __pycache__ -exec rm -rf {} +
    # Shared libraries bundled by wheels need not be executable (lintian: shared-library-is-executable).
    find "$PREFIX/lib" -type f -name '*.so*' -exec chmod 0644 {} +
    exit 0
fi

while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PYTHON=$2; shift 2 ;;
        --python=*) PYTHON=${1#*=}; shift ;;
        --compress) [ $# -ge 2 ] || die "--compress needs a compressor"; COMPRESS=$2; shift 2 ;;
        --compress=*) COMPRESS=${1#*=}; shift ;;
        --revision) [ $# -ge 2 ] || die "--revision needs a number"; REVISION=$2; shift 2 ;;
        --revision=*) REVISION=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

case $COMPRESS in
    xz | gzip | zstd | none) ;;
    *) die "--compress must be xz, gzip, zstd or none: $COMPRESS" ;;
esac
case $REVISION in
    '' | [0-9]*) ;;
    *) die "--revision must start with a digit: $REVISION" ;;
esac
for tool in dpkg-deb unshare mount; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
[ -x "$PYTHON" ] || die "$PYTHON not found (Debian: apt-get install python3 python3-venv)"

# The venv's base interpreter: pythonX.Y by its versioned name, which is what the package depends
# on (python3 may later point at another version, whose ABI the venv's extensions do not match).
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))' ||
    die "$PYTHON is Python $PYVER; elasticd needs >= 3.11"
PYBIN=/usr/bin/python$PYVER
[ -x "$PYBIN" ] || die "$PYBIN not found: --python must be a Debian interpreter in /usr/bin"
"$PYBIN" -c 'import venv, ensurepip' 2>/dev/null ||
    die "$PYBIN cannot create virtual environments (apt-get install python$PYVER-venv)"
[ -d /opt ] || die "/opt does not exist; the build mounts an overlay on it in a private namespace"

VERSION=$("$PYBIN" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$SRC/pyproject.toml")
[ -z "$REVISION" ] || VERSION=$VERSION-$REVISION
ARCH=$(dpkg --print-architecture)
DEB=elasticd_${VERSION}_${ARCH}.deb

umask 022
WORK=$(mktemp -d "${TMPDIR:-/tmp}/elasticd-deb.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT
STAGE=$WORK/stage
mkdir -p "$STAGE$PREFIX"

say "venv at $PREFIX with $PYBIN (private mount namespace)"
if [ "$(id -u)" -eq 0 ]; then userns=(); else userns=(--map-root-user); fi
export ELASTICD_DEB_INNER=1 STAGE WORK PYBIN SRC
unshare --mount --propagation private "${userns[@]}" -- bash "$SRC/packaging/build-deb.sh"
unset ELASTICD_DEB_INNER

# Every script pip wrote must name the venv's interpreter at its installed path.
for f in "$STAGE$PREFIX"/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    if head -c 2 "$f" | grep -q '#!'; then
        line=$(head -n 1 "$f")
        case $line in
            "#!$PREFIX/bin/python" | "#!$PREFIX/bin/python"[0-9]* | "#!/bin/sh" | "#!/bin/bash" | "#!/usr/bin/env "*) ;;
            *) die "unexpected shebang in ${f#"$STAGE"}: $line" ;;
        esac
    fi
done

say "system files"
install -D -m 0644 "$SRC/units/elasticd.sysusers.conf" "$STAGE/usr/lib/sysusers.d/elasticd.conf"
install -D -m 0644 "$SRC/units/elasticd.tmpfiles.conf" "$STAGE/usr/lib/tmpfiles.d/elasticd.conf"
mkdir -p "$STAGE/usr/lib/systemd/system"
sed "s|^ExecStart=.*|ExecStart=$PREFIX/bin/elasticd|" "$SRC/units/elasticd.service" \
    >"$STAGE/usr/lib/systemd/system/elasticd.service"
grep -qx "ExecStart=$PREFIX/bin/elasticd" "$STAGE/usr/lib/systemd/system/elasticd.service" ||
    die "could not rewrite ExecStart in units/elasticd.service"
chmod 0644 "$STAGE/usr/lib/systemd/system/elasticd.service"
# 0600: it may come to hold the etcd password; only the daemon (root) reads it.
install -D -m 0600 "$SRC/packaging/elasticd.toml.example" "$STAGE/etc/elasticd/elasticd.toml"
mkdir -p "$STAGE/usr/bin"
for cmd in elasticd elasticctl elasticrun; do
    [ -x "$STAGE$PREFIX/bin/$cmd" ] || die "$PREFIX/bin/$cmd is missing from the venv"
    ln -s "$PREFIX/bin/$cmd" "$STAGE/usr/bin/$cmd"
done
doc=$STAGE/usr/share/doc/elasticd
install -D -m 0644 "$SRC/packaging/deb/copyright" "$doc/copyright"
gzip -9n <"$SRC/packaging/deb/changelog" >"$doc/changelog.gz"
install -D -m 0644 "$SRC/packaging/deb/lintian-overrides" "$STAGE/usr/share/lintian/overrides/elasticd"

say "control files"
mkdir -p "$STAGE/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@INSTALLED_SIZE@|$size|" \
    -e "s|@PYTHON@|python$PYVER|g" "$SRC/packaging/deb/control.in" >"$STAGE/DEBIAN/control"
for script in postinst prerm postrm; do
    install -m 0755 "$SRC/packaging/deb/$script" "$STAGE/DEBIAN/$script"
done
(cd "$STAGE" && find etc -type f | sed 's|^|/|' | sort) >"$STAGE/DEBIAN/conffiles"
(cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -print0 | sed -z 's|^\./||' | sort -z |
    xargs -0 md5sum) >"$STAGE/DEBIAN/md5sums"
chmod 0644 "$STAGE/DEBIAN/control" "$STAGE/DEBIAN/conffiles" "$STAGE/DEBIAN/md5sums"

mkdir -p "$OUT"
say "dpkg-deb --build -> $OUT/$DEB"
dpkg-deb --root-owner-group -Z"$COMPRESS" --build "$STAGE" "$OUT/$DEB" >/dev/null
printf '%s\n' "$OUT/$DEB"
