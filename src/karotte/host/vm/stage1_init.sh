#!/bin/busybox sh
# Stage 1 of the karotte guest (PID 1 in the initramfs): load the modules, find the drives by
# their serial (or karotte.<name>=/dev/vdX on the kernel command line), mount the read-only root
# with the scratch drive as an overlay, and hand over to the stage-2 init (karotte_init.py, run by
# the image's python3) in the new root. Any failure powers the VM off with a message on the
# console (the host then reports an infra error with the console's last lines).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "karotte-init: $*" > /dev/console
    sync
    reboot -f
    sleep 1000
}

if grep -q 'karotte.probe' /proc/cmdline; then
    echo "KAROTTE-BOOT-OK" > /dev/console
    reboot -f
    sleep 1000
fi

while read -r m; do insmod "/modules/$m" 2>/dev/null; done < /modules/order

arg() {
    for word in $(cat /proc/cmdline); do
        case "$word" in "$1="*) echo "${word#*=}"; return ;; esac
    done
}

dev_of() {
    for b in /sys/block/vd*; do
        [ -e "$b" ] || continue
        if [ "$(cat "$b/serial" 2>/dev/null)" = "karotte-$1" ]; then echo "/dev/${b##*/}"; return; fi
    done
    arg "karotte.$1"
}

i=0
while [ -z "$(dev_of in)" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
ROOT=$(dev_of root); SCRATCH=$(dev_of scratch); IN=$(dev_of in); OUT=$(dev_of out)
[ -n "$ROOT" ] && [ -n "$SCRATCH" ] && [ -n "$IN" ] || fail "drives not found: root=$ROOT scratch=$SCRATCH in=$IN"

mount -t ext4 -o ro "$ROOT" /mnt/root || fail "cannot mount the root drive $ROOT"
mount -t ext4 "$SCRATCH" /mnt/scratch || fail "cannot mount the scratch drive $SCRATCH"
mkdir -p /mnt/scratch/upper /mnt/scratch/work
mount -t overlay overlay \
    -o "lowerdir=/mnt/root,upperdir=/mnt/scratch/upper,workdir=/mnt/scratch/work" /newroot \
    || fail "cannot mount the root overlay"
mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp
mount -t tmpfs -o mode=0755,size=64m tmpfs /newroot/run
mkdir -p -m 0700 /newroot/run/karotte /newroot/run/karotte/in
mount -t ext4 -o ro "$IN" /newroot/run/karotte/in || fail "cannot mount the io drive $IN"
cp /bin/busybox /karotte_init.py /newroot/run/karotte/
echo "$OUT" > /newroot/run/karotte/out-device
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev

for py in /usr/bin/python3 /usr/local/bin/python3 /root/.venv/bin/python; do
    if [ -x "/newroot$py" ] || [ -L "/newroot$py" ]; then
        exec switch_root /newroot "$py" -I -S /run/karotte/karotte_init.py
    fi
done
fail "the image has no python3 (needed by the guest init)"
