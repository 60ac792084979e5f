#!/bin/sh
# Guest side of docs/vm.md's check: the host attached a ucrypt NBD export as the first
# virtio disk and a ucrypt FUSE file (holding an ext4 with host.txt) as the second.
set -eu
ls -l /dev/vda /dev/vdb
mkdir -p /mnt/a /mnt/b
mkfs.ext4 -q /dev/vda
mount /dev/vda /mnt/a
echo "from the guest (nbd export)" > /mnt/a/guest.txt
umount /mnt/a
mount /dev/vdb /mnt/b
cat /mnt/b/host.txt
echo "from the guest (fuse file)" > /mnt/b/guest.txt
umount /mnt/b
sync
echo GUEST-OK
