"""Firecracker's control plane: pinned binaries and guest kernel (:mod:`.artifacts`), its HTTP
API over a unix socket (:mod:`.api`), and one VMM process, optionally under the jailer
(:mod:`.vmm`)."""
