#!/usr/bin/env bash
# VM runtimes (qemu; the guest kernel is shared with firecracker): QEMU, the tools that build the
# guest's drives and initramfs, and a Debian guest kernel. Idempotent; run as root on Debian 12.
#
# The kernel package is NOT installed into the host's /boot: it is fetched with `apt-get download`
# and unpacked (dpkg-deb -x) into $KAROTTE_VM_KERNEL_DIR (default /var/cache/karotte/vm/kernel).
# karotte itself turns it into the uncompressed vmlinux and the initramfs at first use (cached).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-vm.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

KERNEL_DIR="${KAROTTE_VM_KERNEL_DIR:-/var/cache/karotte/vm/kernel}"
KERNEL_META="${KAROTTE_VM_KERNEL_PACKAGE:-linux-image-cloud-amd64}"

want=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || want+=(qemu-system-x86)
[ -x /bin/busybox ] || want+=(busybox-static)
command -v cpio >/dev/null 2>&1 || want+=(cpio)
command -v lz4 >/dev/null 2>&1 || want+=(lz4)
command -v mkfs.ext4 >/dev/null 2>&1 || want+=(e2fsprogs)
command -v zstd >/dev/null 2>&1 || want+=(zstd)
command -v xz >/dev/null 2>&1 || want+=(xz-utils)

updated=0
if [ "${#want[@]}" -gt 0 ]; then
    apt-get update -qq
    updated=1
    apt-get install -y -qq --no-install-recommends "${want[@]}"
fi

# the guest kernel: the newest linux-image-*-cloud-amd64 the meta package points at
if ! ls "$KERNEL_DIR"/boot/vmlinuz-* >/dev/null 2>&1; then
    [ "$updated" -eq 1 ] || apt-get update -qq
    pkg=$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image-/ {print $2; exit}')
    if [ -z "$pkg" ]; then
        echo "setup-vm.sh: cannot resolve $KERNEL_META to a kernel package" >&2
        exit 1
    fi
    work=$(mktemp -d)
    chmod 755 "$work"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download -qq "$pkg")
    mkdir -p "$KERNEL_DIR.tmp"
    dpkg-deb -x "$work"/*.deb "$KERNEL_DIR.tmp"
    rm -rf "$KERNEL_DIR"
    mv "$KERNEL_DIR.tmp" "$KERNEL_DIR"
    echo "guest kernel: $pkg in $KERNEL_DIR"
fi

qemu-system-x86_64 --version | head -1
ls "$KERNEL_DIR"/boot/vmlinuz-*
