"""Which file systems tuimon watches, and which of them many nodes share.

One list for every part that asks: the agent (which mounts it reads), the overview
(which file systems a node reports for the cluster's storage pane), the viewer's storage
aggregates and readout, and `tuimon prom` (which `node_filesystem_*` series it asks
for). A file system type added here is read, summed and queried everywhere at once.
"""

from __future__ import annotations

# Many nodes mount the same one: their reads and writes add up across the cluster, and
# each node's part says who loads it (the storage pane, its top readers and writers).
SHARED_FSTYPES = frozenset({
    "lustre", "gpfs", "nfs", "nfs4", "beegfs", "ceph", "cephfs", "fuse.weka", "wekafs",
    "panfs", "cifs", "smb3", "glusterfs", "fuse.glusterfs", "fuse.juicefs",
})
# One node's own data file systems: capacity on the node screen, not summed.
LOCAL_FSTYPES = frozenset({"xfs", "ext4", "ext3", "btrfs", "zfs"})
# What the agent reads at all: capacity and throughput that matter on a training node.
DATA_FSTYPES = SHARED_FSTYPES | LOCAL_FSTYPES
