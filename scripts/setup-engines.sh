#!/bin/sh
# Install and configure the container engines Karotte uses, on Debian/Ubuntu, as root.
#
# Idempotent: run it as often as you like. It never assumes systemd (works on machines whose
# PID 1 is something else, as in many VMs and CI containers) and merges its settings into existing
# configuration files instead of overwriting them.
#
# What it does (see docs/runtimes-setup.md for the why):
#   1. apt-get installs docker.io podman crun runc catatonit uidmap runsc mmdebstrap nftables (+ helpers)
#      when any of them is missing; on Debian 12, runsc from bookworm-backports (bookworm's own
#      2022-12 build fails statx with EINVAL, so `ls -l` and `stat` fail in every gVisor sandbox);
#   2. podman: default_ulimits in /etc/containers/containers.conf (root may lack CAP_SYS_RESOURCE);
#   3. crun on cgroup-v1 "hybrid" hosts: mounts the v1 hugetlb hierarchy crun insists on;
#   4. docker: registers gVisor's runsc runtime (--network=none --host-uds=open) in
#      /etc/docker/daemon.json;
#   5. starts dockerd if it is not running (no bridge, no iptables) and waits until it answers;
#      reloads it (SIGHUP) when daemon.json changed.
#
# Environment:
#   KAROTTE_SKIP_APT=1        do not install packages (only configure and start)
#   KAROTTE_SKIP_CGROUPS=1    do not touch cgroup mounts
#   KAROTTE_SKIP_DOCKERD=1    only write configuration: do not start or reload dockerd
#   KAROTTE_CONTAINERS_CONF / KAROTTE_DAEMON_JSON  other paths for the two files (tests)
#   KAROTTE_DOCKERD_LOG=PATH  where a dockerd started by this script logs (default /var/log/karotte-dockerd.log)
#   KAROTTE_DOCKERD_WAIT=S    seconds to wait for dockerd to answer (default 60)
set -eu

PACKAGES="docker.io podman crun runc catatonit uidmap runsc mmdebstrap e2fsprogs iptables nftables ca-certificates python3"
CONTAINERS_CONF=${KAROTTE_CONTAINERS_CONF:-/etc/containers/containers.conf}
DAEMON_JSON=${KAROTTE_DAEMON_JSON:-/etc/docker/daemon.json}
DOCKERD_LOG=${KAROTTE_DOCKERD_LOG:-/var/log/karotte-dockerd.log}
DOCKERD_WAIT=${KAROTTE_DOCKERD_WAIT:-60}

say() { printf '[setup-engines] %s\n' "$*"; }
die() { printf '[setup-engines] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run me as root (sudo $0)"

have_systemd() { [ -d /run/systemd/system ]; }

# --- 1. packages -------------------------------------------------------------------------------
install_packages() {
    missing=""
    for pkg in $PACKAGES; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $pkg"
        fi
    done
    if [ -z "$missing" ]; then
        say "packages: all present"
        return
    fi
    say "packages: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing
}

# runsc 0.0~20221219 (bookworm) rejects statx's AT_NO_AUTOMOUNT flag with EINVAL: coreutils' ls -l and
# stat fail inside every gVisor sandbox, for root and the student alike (an honest student's
# `ls -l` errors). bookworm-backports carries a 2024 build without the bug; only runsc is taken from
# there (backports have priority 100: nothing else is upgraded from them).
RUNSC_BACKPORT_LIST=/etc/apt/sources.list.d/karotte-bookworm-backports.list
install_runsc_backport() {
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [ "$codename" = "bookworm" ] || return 0
    current=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
    case "$current" in
        0.0~2022*|"") ;;
        *) say "runsc: $current"; return 0 ;;
    esac
    say "runsc: $current has the statx bug; installing runsc from bookworm-backports"
    mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/* *$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    echo "deb $mirror bookworm-backports main" >"$RUNSC_BACKPORT_LIST"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends -t bookworm-backports runsc
}

# --- 2. podman rlimits -------------------------------------------------------------------------
# Root without CAP_SYS_RESOURCE cannot raise RLIMIT_NOFILE to podman's default (1048576), so every
# `podman run` fails with "setrlimit RLIMIT_NOFILE: operation not permitted". Lower defaults fix it.
configure_podman() {
    mkdir -p "$(dirname "$CONTAINERS_CONF")"
    [ -f "$CONTAINERS_CONF" ] || : >"$CONTAINERS_CONF"
    if grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=' "$CONTAINERS_CONF"; then
        say "podman: default_ulimits already set in $CONTAINERS_CONF (left as is)"
    else
        line='default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]'
        if grep -Eq '^[[:space:]]*\[containers\][[:space:]]*$' "$CONTAINERS_CONF"; then
            tmp=$(mktemp "$CONTAINERS_CONF.XXXXXX")
            awk -v line="$line" '{ print } /^[[:space:]]*\[containers\][[:space:]]*$/ && !done { print line; done = 1 }' \
                "$CONTAINERS_CONF" >"$tmp"
            chmod 644 "$tmp"
            mv "$tmp" "$CONTAINERS_CONF"
        else
            printf '\n[containers]\n%s\n' "$line" >>"$CONTAINERS_CONF"
        fi
        say "podman: default_ulimits added to $CONTAINERS_CONF"
    fi
    # Without systemd, podman must use cgroupfs and log events to a file (no journald).
    if ! have_systemd; then
        for setting in 'cgroup_manager = "cgroupfs"' 'events_logger = "file"'; do
            key=${setting%% *}
            if grep -Eq "^[[:space:]]*${key}[[:space:]]*=" "$CONTAINERS_CONF"; then
                continue
            fi
            if grep -Eq '^[[:space:]]*\[engine\][[:space:]]*$' "$CONTAINERS_CONF"; then
                tmp=$(mktemp "$CONTAINERS_CONF.XXXXXX")
                awk -v line="$setting" '{ print } /^[[:space:]]*\[engine\][[:space:]]*$/ && !done { print line; done = 1 }' \
                    "$CONTAINERS_CONF" >"$tmp"
                chmod 644 "$tmp"
                mv "$tmp" "$CONTAINERS_CONF"
            else
                printf '\n[engine]\n%s\n' "$setting" >>"$CONTAINERS_CONF"
            fi
            say "podman: $setting added to $CONTAINERS_CONF (no systemd)"
        done
    fi
}

# --- 3. hugetlb for crun on hybrid cgroup hosts --------------------------------------------------
# In hybrid mode (v1 controllers + a v2 mount that owns only hugetlb) crun refuses to run unless a
# v1 hugetlb hierarchy exists. Mounting it is harmless. Never switch such a host to pure v2: its
# supervisor relies on v1 memory cgroups.
configure_cgroups() {
    fstype=$(stat -f -c %T /sys/fs/cgroup 2>/dev/null || echo unknown)
    if [ "$fstype" = "cgroup2fs" ]; then
        say "cgroups: unified (v2) host, nothing to do"
        return
    fi
    if [ -f /sys/fs/cgroup/unified/cgroup.controllers ] \
        && grep -qw hugetlb /sys/fs/cgroup/unified/cgroup.controllers \
        && ! grep -qE '^[^ ]+ /sys/fs/cgroup/hugetlb cgroup ' /proc/mounts; then
        mkdir -p /sys/fs/cgroup/hugetlb 2>/dev/null || mount -o remount,rw /sys/fs/cgroup
        mkdir -p /sys/fs/cgroup/hugetlb
        if mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb; then
            say "cgroups: hybrid host, mounted the v1 hugetlb hierarchy for crun"
        else
            say "cgroups: warning: could not mount hugetlb; podman with crun may refuse to start"
        fi
    else
        say "cgroups: hugetlb hierarchy fine"
    fi
}

# --- 4. docker daemon.json -------------------------------------------------------------------------
# Prints "changed" when the file was modified.
configure_docker() {
    mkdir -p "$(dirname "$DAEMON_JSON")"
    runsc_path=$(command -v runsc || echo /usr/bin/runsc)
    python3 - "$DAEMON_JSON" "$runsc_path" <<'EOF'
import json, os, sys, tempfile

path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    config = {}
except json.JSONDecodeError as exc:
    sys.exit(f"{path} is not valid JSON ({exc}); fix or remove it, then rerun")
before = json.dumps(config, sort_keys=True)
runtimes = config.setdefault("runtimes", {})
entry = runtimes.setdefault("runsc", {})
entry["path"] = runsc
# gVisor gets no network at all; never --platform=kvm here (it hangs on hosts with a fake /dev/kvm).
args = [
    a
    for a in entry.get("runtimeArgs", [])
    if not a.startswith(("--network", "--platform=kvm", "--host-uds"))
]
# --host-uds=open: the sandbox may connect to host unix sockets bind-mounted into it (the
# launcher's model-proxy and backend relays, in root-only dirs); gVisor refuses them otherwise
entry["runtimeArgs"] = ["--network=none", "--host-uds=open", *args]
if json.dumps(config, sort_keys=True) != before:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    print("changed")
EOF
}

# Flags for a dockerd we start ourselves; a flag that daemon.json also sets would make dockerd
# refuse to start, so those are left to the file.
dockerd_flags() {
    python3 - "$DAEMON_JSON" <<'EOF'
import json, sys
try:
    config = json.load(open(sys.argv[1]))
except (FileNotFoundError, json.JSONDecodeError):
    config = {}
flags = {"iptables": "--iptables=false", "ip6tables": "--ip6tables=false", "bridge": "--bridge=none"}
print(" ".join(flag for key, flag in flags.items() if key not in config))
EOF
}

docker_answers() { timeout 10 docker info >/dev/null 2>&1; }

dockerd_pid() {
    if [ -s /var/run/docker.pid ]; then
        pid=$(cat /var/run/docker.pid)
        if [ -d "/proc/$pid" ] && grep -q dockerd "/proc/$pid/comm" 2>/dev/null; then
            echo "$pid"
            return
        fi
    fi
    pidof dockerd 2>/dev/null | awk '{print $1}'
}

start_docker() {
    changed=$1
    pid=$(dockerd_pid)
    if [ -n "$pid" ]; then
        if [ "$changed" = "changed" ]; then
            say "docker: daemon.json changed, reloading dockerd (pid $pid)"
            kill -HUP "$pid"
        fi
    elif have_systemd && systemctl list-unit-files docker.service >/dev/null 2>&1; then
        say "docker: starting docker.service"
        systemctl start docker.service
    else
        flags=$(dockerd_flags)
        say "docker: starting dockerd $flags (log: $DOCKERD_LOG)"
        # shellcheck disable=SC2086
        setsid nohup dockerd $flags >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    waited=0
    until docker_answers; do
        if [ "$waited" -ge "$DOCKERD_WAIT" ]; then
            tail -n 20 "$DOCKERD_LOG" 2>/dev/null >&2 || true
            die "dockerd did not answer within ${DOCKERD_WAIT}s (see $DOCKERD_LOG)"
        fi
        sleep 1
        waited=$((waited + 1))
    done
    if ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
        # The reload is asynchronous; give it a moment before complaining.
        sleep 1
        docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' \
            || say "docker: warning: runsc runtime not registered (check $DAEMON_JSON)"
    fi
    say "docker: ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
}

if [ "${KAROTTE_SKIP_APT:-0}" != "1" ]; then
    install_packages
    install_runsc_backport
fi
command -v python3 >/dev/null || die "python3 is needed to merge /etc/docker/daemon.json (apt-get install python3)"
configure_podman
if [ "${KAROTTE_SKIP_CGROUPS:-0}" != "1" ]; then
    configure_cgroups
fi
docker_changed=$(configure_docker)
if [ "$docker_changed" = "changed" ]; then
    say "docker: runsc runtime registered in $DAEMON_JSON"
fi
if [ "${KAROTTE_SKIP_DOCKERD:-0}" != "1" ]; then
    start_docker "$docker_changed"
fi
say "done"
