#!/usr/bin/env bash
# An emulated arm64 machine to install and test the device agent on (make test-arm64, tests/arm64):
#   DIR/qemu/usr/bin/qemu-aarch64   Debian's qemu-user from bookworm-backports (10.x: it emulates
#                                   /proc/cpuinfo per CPU model, and has the cortex-a76 model)
#   DIR/root                        Debian bookworm's arm64 python3.11 (+ venv, libstdc++), unpacked, not installed
#   DIR/root/usr/bin/python3.11     a wrapper that runs it under qemu-user; QEMU_CPU picks the CPU model
#                                   (cortex-a72: the Pi 4, ARMv8.0; cortex-a76: the Pi 5, ARMv8.2)
# Everything comes from Debian's archive through apt, with apt's state kept under DIR: the machine's own
# apt sources, architectures and packages are left alone, and no root is needed. Nothing is redone once DIR
# holds it. DIR defaults to .arm64 in the repository.
#
# The wrapper makes the emulated python behave like a native one: it passes its own path as argv[0] (qemu's
# -0), so sys.executable and a venv's bin/python are the wrapper, and a subprocess of python (pip's
# build environments, venv's ensurepip, the tests' children) runs through qemu again. Without binfmt_misc,
# which a container rarely has, an emulated process cannot otherwise start an arm64 program.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-$REPO/.arm64}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
readonly ROOT_PACKAGES=(python3.11 python3.11-venv libstdc++6)

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

# apt with all of its state under $1, for architecture $2, from suites $3...
private_apt() {
    local state=$1 arch=$2 suite
    shift 2
    mkdir -p "$state/lists/partial" "$state/archives/partial" "$state/cache"
    : >"$state/status"
    : >"$state/sources.list"
    for suite in "$@"; do
        echo "deb [arch=$arch] $MIRROR $suite main" >>"$state/sources.list"
    done
    APT_OPTIONS=(
        -o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
        -o "Dir::Cache=$state/cache" -o "Dir::Cache::archives=$state/archives"
        -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch" -o Debug::NoLocking=1
        -o APT::Sandbox::User=root
    )
    apt-get -q "${APT_OPTIONS[@]}" update >"$state/update.log" 2>&1 \
        || { cat "$state/update.log" >&2; echo "arm64-env: apt-get update failed (above)" >&2; exit 1; }
}

if [[ ! -x $DIR/qemu/usr/bin/qemu-aarch64 ]]; then
    echo "arm64-env: qemu-user from bookworm-backports into $DIR/qemu"
    private_apt "$DIR/apt-host" amd64 bookworm-backports
    (cd "$DIR/apt-host/archives" && apt-get -q "${APT_OPTIONS[@]}" download qemu-user/bookworm-backports >/dev/null)
    rm -rf "$DIR/qemu.part"
    dpkg-deb -x "$DIR"/apt-host/archives/qemu-user_*.deb "$DIR/qemu.part"
    mv "$DIR/qemu.part" "$DIR/qemu"
fi

if [[ ! -x $DIR/root/usr/bin/python3.11.elf ]]; then
    echo "arm64-env: Debian bookworm's arm64 ${ROOT_PACKAGES[*]} into $DIR/root"
    private_apt "$DIR/apt-arm64" arm64 bookworm
    apt-get -q -y "${APT_OPTIONS[@]}" --no-install-recommends install --download-only "${ROOT_PACKAGES[@]}" \
        >"$DIR/apt-arm64/download.log" 2>&1 \
        || { cat "$DIR/apt-arm64/download.log" >&2; echo "arm64-env: downloading the arm64 packages failed" >&2; exit 1; }
    rm -rf "$DIR/root.part"
    for deb in "$DIR"/apt-arm64/archives/*.deb; do
        dpkg-deb -x "$deb" "$DIR/root.part"
    done
    mv "$DIR/root.part/usr/bin/python3.11" "$DIR/root.part/usr/bin/python3.11.elf"
    cat >"$DIR/root.part/usr/bin/python3.11" <<EOF
#!/bin/sh
# Debian's arm64 python3.11 under qemu-user (scripts/arm64-env.sh); QEMU_CPU picks the CPU model.
exec "$DIR/qemu/usr/bin/qemu-aarch64" -L "$DIR/root" -0 "\$0" "$DIR/root/usr/bin/python3.11.elf" "\$@"
EOF
    chmod 0755 "$DIR/root.part/usr/bin/python3.11"
    rm -rf "$DIR/root"
    mv "$DIR/root.part" "$DIR/root"
fi

"$DIR/root/usr/bin/python3.11" -c 'import platform, sys; sys.exit(platform.machine() != "aarch64")' \
    || { echo "arm64-env: the emulated python does not run" >&2; exit 1; }
echo "$DIR/root/usr/bin/python3.11"
