#!/usr/bin/env bash
# tools/setup.sh: take a Debian 12 machine (Python >= 3.11 and gcc) to a working fanfs install.
#
#   bash tools/setup.sh            # as root on a bare machine; safe to re-run
#
# 1. Debian packages (fuse3, libfuse3-dev, Open MPI, squashfuse, ...), installed only if missing.
# 2. A virtual environment at REPO/.venv (created if absent, never upgraded needlessly).
# 3. pyfuse3 3.5.0 built from its pinned sdist with tools/pyfuse3/fanfs.patch (version
#    3.5.0+fanfs.N for patch level N; see tools/pyfuse3/README.md). Skipped when the venv's
#    pyfuse3 already has that patch level.
# 4. mpi4py, pinned, checked with a 2-rank mpirun against the system Open MPI.
# 5. fanfs itself, editable, with its test extra.
#
# Environment knobs:
#   PYTHON=python3.12           interpreter for the venv (default python3)
#   FANFS_MPI4PY_FROM_SOURCE=1  build mpi4py from its sdist with the system mpicc (~3 min)
#                               instead of the binary wheel
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"

PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PYFUSE3_PATCH="$REPO/tools/pyfuse3/fanfs.patch"
# Build dependencies of the patched pyfuse3 (installed into the venv, --no-build-isolation).
# Cython 3.2.4 is the version upstream generated the sdist's __init__.c with.
PYFUSE3_BUILD_PINS=(Cython==3.2.4 setuptools==80.9.0 setuptools_scm==8.3.1 wheel==0.45.1)
MPI4PY_VERSION=4.1.2

APT_PACKAGES=(fuse3 libfuse3-dev pkg-config openmpi-bin libopenmpi-dev
              squashfuse squashfs-tools erofs-utils psmisc patch)

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1

log() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

TMPD=""
cleanup() { if [[ -n "$TMPD" ]]; then rm -rf "$TMPD"; fi; }
trap cleanup EXIT

pip_() { "$PY" -m pip "$@"; }

# --------------------------------------------------------------------------------------------
# 0. Python
# --------------------------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3.11+)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "fanfs needs Python >= 3.11; $PYTHON is $("$PYTHON" -V 2>&1)"

# --------------------------------------------------------------------------------------------
# 1. Debian packages
# --------------------------------------------------------------------------------------------
want=("${APT_PACKAGES[@]}")
# Debian's own python3 needs these to make a venv and to compile extensions.
if [[ "$(readlink -f "$(command -v "$PYTHON")")" == /usr/bin/* ]]; then
    "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1 || want+=(python3-venv)
    "$PYTHON" -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || want+=(python3-dev)
fi
command -v gcc >/dev/null 2>&1 || want+=(gcc libc6-dev)

if command -v dpkg >/dev/null 2>&1; then
    missing=()
    for p in "${want[@]}"; do
        dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        if [[ "$(id -u)" != 0 ]]; then
            die "missing Debian packages: ${missing[*]}; run this script as root, or first: sudo apt-get install --no-install-recommends ${missing[*]}"
        fi
        log "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        log "Debian packages present"
    fi
else
    log "warning: no dpkg (not Debian?); assuming ${APT_PACKAGES[*]} are installed"
fi
[[ -e /dev/fuse ]] || log "warning: /dev/fuse does not exist here; mounting will not work"

# --------------------------------------------------------------------------------------------
# 2. Virtual environment
# --------------------------------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
else
    "$PY" -c 'import sys' 2>/dev/null || die "$VENV is broken; remove it and re-run"
    log "using existing $VENV"
fi

# --------------------------------------------------------------------------------------------
# 3. pyfuse3 with the fanfs patch (no-open reads, multi-process serving)
# --------------------------------------------------------------------------------------------
[[ -f "$PYFUSE3_PATCH" ]] || die "$PYFUSE3_PATCH not found"
# The patch sets pyfuse3.FANFS_PATCH_LEVEL (1 if it predates levels); a venv whose pyfuse3 has
# a lower level than the patch in the tree is rebuilt.
PATCH_LEVEL="$(sed -n 's/^+FANFS_PATCH_LEVEL *= *\([0-9][0-9]*\).*/\1/p' "$PYFUSE3_PATCH" | head -n1)"
PATCH_LEVEL="${PATCH_LEVEL:-1}"
PYFUSE3_FANFS_VERSION="$PYFUSE3_VERSION+fanfs.$PATCH_LEVEL"

has_patched_pyfuse3() {
    "$PY" - "$PATCH_LEVEL" >/dev/null 2>&1 <<'PYEOF'
import sys, pyfuse3
ok = getattr(pyfuse3, "FANFS_NOOPEN_READ", False) and getattr(pyfuse3, "FANFS_PATCH_LEVEL", 1) >= int(sys.argv[1])
sys.exit(0 if ok else 1)
PYEOF
}

if has_patched_pyfuse3; then
    log "pyfuse3 with fanfs patch level $PATCH_LEVEL already installed"
else
    log "building pyfuse3 $PYFUSE3_FANFS_VERSION (sdist + tools/pyfuse3/fanfs.patch)"
    TMPD="$(mktemp -d "${TMPDIR:-/tmp}/fanfs-setup.XXXXXX")"

    log "  build dependencies: ${PYFUSE3_BUILD_PINS[*]}"
    pip_ install -q "${PYFUSE3_BUILD_PINS[@]}"

    log "  downloading pyfuse3==$PYFUSE3_VERSION sdist"
    # --no-build-isolation: pip reads the sdist's metadata with the pinned build dependencies
    # just installed, instead of fetching unpinned ones into a throwaway environment (~15 s).
    pip_ download -q --no-deps --no-binary :all: --no-build-isolation -d "$TMPD/dl" \
        "pyfuse3==$PYFUSE3_VERSION"
    sdist="$TMPD/dl/pyfuse3-$PYFUSE3_VERSION.tar.gz"
    [[ -f "$sdist" ]] || die "pip download did not produce $sdist: $(ls "$TMPD/dl")"
    got="$(sha256sum "$sdist" | cut -d' ' -f1)"
    [[ "$got" == "$PYFUSE3_SHA256" ]] \
        || die "pyfuse3 sdist sha256 mismatch: got $got, expected $PYFUSE3_SHA256"
    log "  sha256 ok ($PYFUSE3_SHA256)"

    mkdir "$TMPD/src"
    tar -xzf "$sdist" -C "$TMPD/src"
    srcdir="$TMPD/src/pyfuse3-$PYFUSE3_VERSION"
    (cd "$srcdir" && patch -p1 --forward --batch --quiet < "$PYFUSE3_PATCH") \
        || die "tools/pyfuse3/fanfs.patch does not apply to pyfuse3 $PYFUSE3_VERSION"
    # The sdist ships a pre-generated __init__.c; remove it so the build must re-cythonize
    # the patched .pyx/.pxi (and fails loudly, rather than silently building stock, if it can't).
    rm -f "$srcdir/src/pyfuse3/__init__.c"
    log "  patch applied; compiling (about 20 s)"

    if pip_ show pyfuse3 >/dev/null 2>&1; then
        log "  removing pyfuse3 $(pip_ show pyfuse3 2>/dev/null | sed -n 's/^Version: //p') (lacks fanfs patch level $PATCH_LEVEL)"
        pip_ uninstall -q -y pyfuse3
    fi
    buildlog="$VENV/pyfuse3-fanfs-build.log"
    if ! SETUPTOOLS_SCM_PRETEND_VERSION="$PYFUSE3_FANFS_VERSION" \
            pip_ install --no-build-isolation --no-cache-dir "$srcdir" >"$buildlog" 2>&1; then
        tail -n 40 "$buildlog" >&2
        die "building the patched pyfuse3 failed (full log: $buildlog)"
    fi
    has_patched_pyfuse3 \
        || die "installed pyfuse3 lacks FANFS_NOOPEN_READ / FANFS_PATCH_LEVEL $PATCH_LEVEL (build log: $buildlog)"
    rm -rf "$TMPD"; TMPD=""
fi
pyfuse3_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("pyfuse3"))')"
[[ "$pyfuse3_version" == "$PYFUSE3_FANFS_VERSION" ]] \
    || log "note: pyfuse3 has fanfs patch level >= $PATCH_LEVEL but its version is $pyfuse3_version"

# --------------------------------------------------------------------------------------------
# 4. mpi4py against the system Open MPI
# --------------------------------------------------------------------------------------------
mpi_smoke() {
    # Only rank 0 prints (the ranks' stdout would interleave); expects size 2 and 1+2 = 3.
    local out
    out="$(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$PY" -c \
        'from mpi4py import MPI; c = MPI.COMM_WORLD; s = c.allreduce(c.Get_rank() + 1)
if c.Get_rank() == 0: print("mpi-ok", c.Get_size(), s)' 2>&1)" || { echo "$out" >&2; return 1; }
    grep -qx 'mpi-ok 2 3' <<<"$out" || { echo "$out" >&2; return 1; }
}
mpi4py_installed() {
    "$PY" -c 'import importlib.metadata as m, sys
sys.exit(m.version("mpi4py") != sys.argv[1])' "$MPI4PY_VERSION" 2>/dev/null
}

if [[ "${FANFS_MPI4PY_FROM_SOURCE:-0}" == 1 ]] && ! "$PY" -c 'import os, sys, mpi4py.MPI as M
sys.exit(not os.path.basename(M.__file__).startswith("MPI.cpython-"))' 2>/dev/null; then
    # The binary wheel names its extension MPI.<impl>.cpython-*.so (one per MPI ABI);
    # a source build is a plain MPI.cpython-*.so.
    log "building mpi4py $MPI4PY_VERSION from source with $(command -v mpicc || echo mpicc)"
    pip_ install -q --force-reinstall --no-deps --no-binary mpi4py "mpi4py==$MPI4PY_VERSION"
elif mpi4py_installed; then
    log "mpi4py $MPI4PY_VERSION already installed"
else
    log "installing mpi4py $MPI4PY_VERSION"
    pip_ install -q "mpi4py==$MPI4PY_VERSION"
fi
if ! mpi_smoke; then
    log "mpi4py does not work with the system MPI; rebuilding it from source (about 3 min)"
    pip_ install -q --force-reinstall --no-deps --no-binary mpi4py "mpi4py==$MPI4PY_VERSION"
    mpi_smoke || die "mpi4py $MPI4PY_VERSION fails a 2-rank mpirun even when built from source"
fi
ompi_version="$(mpirun --version 2>/dev/null | sed -n 's/.*(Open MPI) *//p' | head -n1)"
log "mpi4py $MPI4PY_VERSION passes a 2-rank mpirun (Open MPI ${ompi_version:-?})"

# --------------------------------------------------------------------------------------------
# 5. fanfs itself
# --------------------------------------------------------------------------------------------
[[ -f "$REPO/pyproject.toml" ]] || die "$REPO/pyproject.toml not found"
log "installing fanfs (editable, with the test and dev extras)"
pip_ install -q -e "${REPO}[test,dev]"

has_patched_pyfuse3 || die "installing fanfs replaced the patched pyfuse3"
mpi4py_installed || die "installing fanfs replaced mpi4py $MPI4PY_VERSION"

log "all steps done in ${SECONDS}s"
log "ready (.venv, pyfuse3 $pyfuse3_version, mpi4py $MPI4PY_VERSION, Open MPI ${ompi_version:-?})"
