#!/usr/bin/env bash
# Install (or remove) the POET Edge device agent as the systemd service poet-agent.service.
#
# What it puts where (PREFIX defaults to /opt/poet-agent; everything below goes under $DESTDIR when set):
#   /usr/lib/sysusers.d/poet-agent.conf    the system user poet-agent (groups dialout, i2c, video), made by systemd-sysusers
#   $PREFIX/venv                           a virtual environment with poet-edge[device,zoo] (none with --venv); on
#                                          aarch64 with the PyTorch build that runs on its CPU (deploy/torch_choice.py)
#   /etc/poet-agent/agent.toml             copied from the template only when absent: an operator's config is never overwritten
#   /var/lib/poet-agent, .../swap          the state directory and the default swap directory
#   /etc/systemd/system/poet-agent.service deploy/poet-agent.service with ExecStart pointing at the venv's poet-edge; enabled
#
# Ownership: files are chowned to poet-agent only when the script runs as root (with or without DESTDIR; the
# IDs come from the target's own /etc/passwd). Staging as another user leaves them to that user; systemd's
# StateDirectory= gives /var/lib/poet-agent to poet-agent on the first start either way.
#
# Exit status: 0 done, 1 failed (the message says why), 2 bad usage.
set -euo pipefail
umask 022  # directories made under DESTDIR must be usable on the device, whatever the caller's umask

readonly UNIT=poet-agent.service
readonly USER_NAME=poet-agent
readonly SYSUSERS_CONF=poet-agent.conf
readonly MARKER=.poet-agent-installer  # in a venv this script created, so --uninstall removes only those

usage() {
    cat <<'EOF'
Usage: install.sh [OPTIONS]
       DESTDIR=/path/to/root install.sh [OPTIONS]    stage into another root (an image, a test tree)

Install the POET Edge device agent as the systemd service poet-agent.service.

Options:
  --prefix DIR             where the virtual environment goes (default /opt/poet-agent; the venv is DIR/venv)
  --venv DIR               use this existing virtual environment (it must have bin/poet-edge, here or
                           under DESTDIR) instead of creating one; ExecStart gets DIR/bin/poet-edge
  --source PATH            what to pip install: a source tree or a wheel
                           (default: the repository this script lives in)
  --extras LIST            its extras (default device,zoo: the agent and the zoo's models)
  --config-template FILE   the agent.toml to copy when /etc/poet-agent/agent.toml is absent
                           (default: deploy/agent.example.toml beside this script)
  --uninstall              remove the unit, the sysusers file and the venv this script created;
                           keep /etc/poet-agent and /var/lib/poet-agent
  --purge                  with --uninstall, remove /etc/poet-agent, /var/lib/poet-agent and the unit's
                           drop-ins too
  -h, --help               this help

Environment:
  DESTDIR                  a root to stage into (no service is started; systemctl --root enables it)
  PYTHON                   the interpreter for a new venv (default python3; 3.11 or newer)

PyTorch: x86_64 gets the version constraints.txt pins. aarch64 gets PyTorch's CPU-only build from its
wheel index, or where that is out of reach or does not run on the CPU, the last CPU-only build on the
package index that runs on it (2.9.1 on an ARMv8.0 core such as the Pi 4's, 2.10.0 on newer ones); a
Jetson whose python3 has NVIDIA's torch keeps it (the venv sees the system's packages). The torch is
checked to run before anything else goes in. deploy/README.md says more.

Running it again changes nothing, except that pip reinstalls a source tree into the venv it made; the
service is restarted only when its unit or the installed versions changed.
EOF
}

die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'install.sh: %s (see --help)\n' "$*" >&2; exit 2; }
say() { printf '%s\n' "$*"; }

# Builtins only up to the preflight check, so that a missing tool is reported as such.
SCRIPT_DIR=${BASH_SOURCE[0]%/*}
[[ ${BASH_SOURCE[0]} == */* ]] || SCRIPT_DIR=.
SCRIPT_DIR=$(cd "$SCRIPT_DIR" && pwd)
PREFIX=/opt/poet-agent
VENV=
SOURCE=${SCRIPT_DIR%/*}
EXTRAS=device,zoo
TEMPLATE=$SCRIPT_DIR/agent.example.toml
ACTION=install
PURGE=0

parse_args() {
    while (($#)); do
        case $1 in
            --prefix|--venv|--source|--config-template|--extras)
                (($# >= 2)) && [[ -n $2 ]] || usage_error "$1 needs a value"
                case $1 in
                    --prefix) PREFIX=$2 ;;
                    --venv) VENV=$2 ;;
                    --source) SOURCE=$2 ;;
                    --config-template) TEMPLATE=$2 ;;
                    --extras) EXTRAS=$2 ;;
                esac
                shift 2 ;;
            --uninstall) ACTION=uninstall; shift ;;
            --purge) PURGE=1; shift ;;
            -h|--help) usage; exit 0 ;;
            *) usage_error "unknown argument: $1" ;;
        esac
    done
    [[ $PREFIX == /* ]] || usage_error "--prefix must be an absolute path: $PREFIX"
    [[ -z $VENV || $VENV == /* ]] || usage_error "--venv must be an absolute path: $VENV"
    ((PURGE == 0)) || [[ $ACTION == uninstall ]] || usage_error "--purge goes with --uninstall"
    [[ $PREFIX$VENV != *[[:space:]\#\&]* ]] || usage_error "--prefix and --venv cannot hold spaces, '#' or '&' (they go into ExecStart=)"
    [[ $EXTRAS =~ ^[A-Za-z0-9_,-]+$ ]] || usage_error "--extras takes names separated by commas: $EXTRAS"
    PREFIX=${PREFIX%/}
    VENV=${VENV%/}
}

# Refuse early, before touching anything: root for a live install, and systemd's tools.
preflight() {
    if [[ -z ${DESTDIR:-} && $EUID -ne 0 ]]; then
        die "installing on this system needs root (run it with sudo), or set DESTDIR to stage into another root"
    fi
    local tool missing=() tools=(systemctl)
    [[ $ACTION == uninstall ]] || tools+=(systemd-sysusers)
    for tool in "${tools[@]}"; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    local list=${missing[*]}
    ((${#missing[@]} == 0)) || die "${list// /, } not found: install systemd (Debian: apt-get install systemd)"
}

# ROOT is DESTDIR without a trailing slash ("" for the live system), absolute so that --root= works from anywhere.
set_root() {
    ROOT=${DESTDIR:-}
    if [[ -n $ROOT ]]; then
        mkdir -p "$ROOT"
        ROOT=$(cd "$ROOT" && pwd)
    fi
    ROOT=${ROOT%/}
}

# Write $2 to file $1 only when its content differs, so that a second run leaves mtimes alone.
write_if_changed() {
    local dest=$1 content=$2 mode=$3
    if [[ -f $dest ]] && [[ $(cat "$dest") == "$content" ]]; then
        chmod "$mode" "$dest"
        return 1
    fi
    mkdir -p "$(dirname "$dest")"
    printf '%s\n' "$content" >"$dest.tmp.$$"
    chmod "$mode" "$dest.tmp.$$"
    mv -f "$dest.tmp.$$" "$dest"
}

install_user() {
    write_if_changed "$ROOT/usr/lib/sysusers.d/$SYSUSERS_CONF" "$(cat <<EOF
# The POET Edge device agent's system user (deploy/install.sh): serial meters, I2C gauges, vcgencmd.
u $USER_NAME - "POET Edge device agent" /var/lib/poet-agent /usr/sbin/nologin
m $USER_NAME dialout
m $USER_NAME i2c
m $USER_NAME video
EOF
)" 0644 || true
    if [[ -n $ROOT ]]; then
        mkdir -p "$ROOT/etc"
        systemd-sysusers --root="$ROOT" "$SYSUSERS_CONF"  # a bare name: read from the root's sysusers.d
    else
        systemd-sysusers "$SYSUSERS_CONF"
    fi
}

# The user's "UID:GID" in the target's passwd, or nothing.
user_ids() {
    if [[ -n $ROOT ]]; then
        awk -F: -v u="$USER_NAME" '$1 == u { print $3 ":" $4 }' "$ROOT/etc/passwd" 2>/dev/null || true
    else
        getent passwd "$USER_NAME" | awk -F: '{ print $3 ":" $4 }' || true
    fi
}

# chown $2... to $1 where it differs; only as root (see the header).
own() {
    local ids=$1 path
    shift
    [[ $EUID -eq 0 && -n $ids ]] || return 0
    for path in "$@"; do
        [[ $(stat -c %u:%g "$path") == "$ids" ]] || chown "$ids" "$path"
    done
}

pip_state() { "$1/bin/python" -m pip freeze --all 2>/dev/null || true; }

# Which torch this machine gets (deploy/torch_choice.py, run by the interpreter that makes the venv):
# sets TORCH_KIND, TORCH_SPEC, TORCH_INDEX, TORCH_FALLBACK and TORCH_REASON.
choose_torch() {
    local python=$1 pinned=() answer key value
    if [[ -d $SOURCE && -f $SOURCE/constraints.txt ]]; then
        pinned=(--pinned "$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' "$SOURCE/constraints.txt")")
    fi
    answer=$("$python" "$SCRIPT_DIR/torch_choice.py" "${pinned[@]}") || die "no PyTorch build for this machine (see above)"
    TORCH_KIND= TORCH_SPEC= TORCH_INDEX= TORCH_FALLBACK= TORCH_REASON=
    while IFS='=' read -r key value; do
        case $key in
            kind) TORCH_KIND=$value ;;
            spec) TORCH_SPEC=$value ;;
            index) TORCH_INDEX=$value ;;
            fallback) TORCH_FALLBACK=$value ;;
            reason) TORCH_REASON=$value ;;
        esac
    done <<<"$answer"
}

# The venv's torch runs on this CPU: its version on stdout; the failure (a SIGILL is status 132) on stderr.
torch_runs() {
    local out status=0
    out=$("$1/bin/python" "$SCRIPT_DIR/torch_choice.py" --check 2>&1) || status=$?
    if ((status == 0)); then
        printf '%s\n' "${out##*$'\n'}"
    elif [[ $2 == report ]]; then
        ((status == 132)) && out="stopped by SIGILL: it executes an instruction this CPU does not have"
        printf 'install.sh: torch does not run here: %s\n' "${out##*$'\n'}" >&2
    fi
    return "$status"
}

# Where torch_choice.py picked the build (aarch64), put it in before the rest and pin it for the rest
# (constraints.txt pins torch for x86_64 only); a torch already there that runs is kept.
install_torch() {
    local venv=$1 version pin=$1/torch-constraint.txt pip=("$1/bin/python" -m pip install -q)
    [[ $TORCH_KIND != pinned ]] || return 0
    say "torch: $TORCH_REASON"
    if version=$(torch_runs "$venv" quiet); then
        :
    elif [[ $TORCH_KIND == system ]]; then
        torch_runs "$venv" report || true
        die "the torch this Python has ($TORCH_SPEC) does not run: reinstall NVIDIA's build for this JetPack"
    elif "${pip[@]}" --index-url "$TORCH_INDEX" "$TORCH_SPEC" && version=$(torch_runs "$venv" report); then
        say "torch: $TORCH_SPEC from $TORCH_INDEX"
    else
        say "torch: no $TORCH_SPEC from $TORCH_INDEX that runs here; installing $TORCH_FALLBACK from the package index"
        "${pip[@]}" "$TORCH_FALLBACK" || die "pip install $TORCH_FALLBACK failed"
        version=$(torch_runs "$venv" report) \
            || die "$TORCH_FALLBACK does not run on this CPU either: install a torch that does into a venv, then pass --venv"
    fi
    say "torch: $version, checked to run on this CPU"
    write_if_changed "$pin" "torch==$version" 0644 || true
    constraints+=(-c "$pin")
}

# Create $ROOT$PREFIX/venv (once) and install the source into it; sets CHANGED when packages changed.
install_venv() {
    local venv=$ROOT$PREFIX/venv python=${PYTHON:-python3} before spec constraints=() venv_args=()
    command -v "$python" >/dev/null 2>&1 || die "$python not found: install Python 3.11 or newer, or pass --venv"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$python is older than 3.11: set PYTHON to a newer one, or pass --venv"
    choose_torch "$python"
    if [[ ! -x $venv/bin/python ]]; then
        [[ $TORCH_KIND != system ]] || venv_args=(--system-site-packages)  # NVIDIA's torch stays where it is
        say "creating the virtual environment $venv"
        "$python" -m venv "${venv_args[@]}" "$venv"
        : >"$venv/$MARKER"
    fi
    [[ -e $SOURCE ]] || die "nothing to install at --source $SOURCE"
    if [[ -d $SOURCE && -f $SOURCE/constraints.txt ]]; then
        constraints=(-c "$SOURCE/constraints.txt")  # the versions the test suite passed with
    fi
    spec="$(cd "$(dirname "$SOURCE")" && pwd)/$(basename "$SOURCE")[$EXTRAS]"
    before=$(pip_state "$venv")
    install_torch "$venv"
    say "installing $spec into $venv"
    "$venv/bin/python" -m pip install -q "${constraints[@]}" "$spec" || die "pip install $spec failed"
    [[ $(pip_state "$venv") == "$before" ]] || CHANGED=1
    # the caching CPU allocator (engine/allocator): freed tensors reused within the budget, not faulted back in
    "$venv/bin/python" -m engine.allocator build \
        || say "no caching allocator (see above): training runs, slower; install g++ and run install.sh again"
}

install_config() {
    local dir=$ROOT/etc/poet-agent ids=$1
    mkdir -p "$dir"
    if [[ -e $dir/agent.toml ]]; then
        say "keeping $dir/agent.toml"
    else
        [[ -f $TEMPLATE ]] || die "the config template $TEMPLATE is missing: pass --config-template FILE"
        install -m 0640 "$TEMPLATE" "$dir/agent.toml"
        say "wrote $dir/agent.toml from $TEMPLATE: edit it, then: systemctl restart $UNIT"
        [[ $EUID -ne 0 || -z $ids ]] || chgrp "${ids#*:}" "$dir/agent.toml"  # root-owned, readable by the agent
    fi
}

install_state() {
    local dir=$ROOT/var/lib/poet-agent ids=$1
    mkdir -p "$dir/swap"
    chmod 0750 "$dir"
    chmod 0700 "$dir/swap"
    own "$ids" "$dir" "$dir/swap"
}

install_unit() {
    local unit=$SCRIPT_DIR/$UNIT exec=$1 content
    [[ -f $unit ]] || die "$unit is missing"
    content=$(sed "s#^ExecStart=[^ ]*/poet-edge #ExecStart=$exec #" "$unit")
    [[ $content == *"ExecStart=$exec "* ]] || die "$unit has no ExecStart=.../poet-edge line to rewrite"
    if write_if_changed "$ROOT/etc/systemd/system/$UNIT" "$content" 0644; then
        CHANGED=1
    fi
}

# Offline into DESTDIR; live: start it, and restart a running one when its unit or its packages changed.
enable_unit() {
    local was_active=0
    if [[ -n $ROOT ]]; then
        systemctl --root="$ROOT" enable "$UNIT"
        return
    fi
    systemctl is-active --quiet "$UNIT" && was_active=1
    systemctl daemon-reload
    systemctl enable --now "$UNIT"
    if ((was_active && CHANGED)); then
        systemctl restart "$UNIT"
    fi
}

do_install() {
    local exec ids
    [[ -f $TEMPLATE || -f $ROOT/etc/poet-agent/agent.toml ]] \
        || die "the config template $TEMPLATE is missing: pass --config-template FILE"
    CHANGED=0
    install_user
    if [[ -n $VENV ]]; then
        # Staging, it may exist only inside the root (built in a chroot) or only here.
        [[ -x $ROOT$VENV/bin/poet-edge || -x $VENV/bin/poet-edge ]] \
            || die "--venv $VENV has no bin/poet-edge: pip install 'poet-edge[device]' into it first"
        exec=$VENV/bin/poet-edge
    else
        install_venv
        exec=$PREFIX/venv/bin/poet-edge
    fi
    ids=$(user_ids)
    install_config "$ids"
    install_state "$ids"
    install_unit "$exec"
    enable_unit
    say "installed $UNIT (ExecStart=$exec)"
}

do_uninstall() {
    local venv=$ROOT$PREFIX/venv
    if [[ -n $ROOT ]]; then
        systemctl --root="$ROOT" disable "$UNIT" 2>/dev/null || true
    else
        systemctl disable --now "$UNIT" 2>/dev/null || true
    fi
    rm -f "$ROOT/etc/systemd/system/$UNIT" "$ROOT/etc/systemd/system/multi-user.target.wants/$UNIT"
    rm -f "$ROOT/usr/lib/sysusers.d/$SYSUSERS_CONF"
    # Only a venv this script made (it holds the marker); never the one passed with --venv.
    if [[ -f $venv/$MARKER && $VENV != "$PREFIX/venv" ]]; then
        rm -rf "$venv"
        rmdir "$ROOT$PREFIX" 2>/dev/null || true
    fi
    if ((PURGE)); then
        rm -rf "$ROOT/etc/poet-agent" "$ROOT/var/lib/poet-agent" "$ROOT/etc/systemd/system/$UNIT.d"
    fi
    [[ -n $ROOT ]] || systemctl daemon-reload
    # The user stays: system users are never deleted, so leftover files never pass to a reused UID.
    say "removed $UNIT$( ((PURGE)) && echo ', its config and its state' || echo '; kept /etc/poet-agent and /var/lib/poet-agent')"
}

main() {
    parse_args "$@"
    preflight
    set_root
    case $ACTION in
        install) do_install ;;
        uninstall) do_uninstall ;;
    esac
}

main "$@"
