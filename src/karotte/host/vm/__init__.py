"""The VM layer shared by every VM runtime (``qemu`` now, ``firecracker`` on the same pieces).

* :mod:`.paths` — where the cache (kernel, initramfs, root drives) and the sandboxes' state live;
* :mod:`.kernel` — the Debian guest kernel: the uncompressed ``vmlinux`` and the initramfs with
  the modules and the stage-1 init, prepared at first use and cached;
* :mod:`.drives` — the image exported to a read-only ext4 root drive (cached by image id, LRU
  evicted, never while in use), the per-run scratch drive, the io drive (in) and the out drive;
* :mod:`.channel` — the host↔guest channel without vsock: framed lines on a virtio-serial port or
  a serial line, carrying the harness's stdout/stderr, heartbeats and the exit code;
* :mod:`.sizing` — guest memory and CPUs from the sandbox's budget;
* :mod:`.supervisor` — one host process per sandbox that runs the VMM, watches the heartbeats
  (the watchdog), and copies ``/out`` back (regular files only);
* :mod:`.guest_init` — PID 1 inside the guest (stdlib only; runs with the image's python3).
"""

# The VM runtimes (registered by karotte.host.runtimes) import this layer, and the layer imports
# the runtimes' base: load the runtimes first, so that importing any module of this package
# first (a test, the supervisor) does not meet a half-initialised module.
import karotte.host.runtimes  # noqa: F401
