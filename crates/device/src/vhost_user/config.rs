//! What the device offers the VM: virtio feature bits, vhost-user protocol features and the
//! virtio-blk configuration space (virtio 1.2, 5.2.4), written out field by field in the
//! specification's little-endian layout.

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Bytes of the configuration space up to and including the write-zeroes fields (the last
/// feature offered); a larger read is answered with zeroes past it.
pub(crate) const CONFIG_LEN: usize = 60;

/// Largest discard or write-zeroes request, in 512-byte sectors (1 GiB): bounds the time
/// one request holds its queue.
pub(super) const MAX_ZERO_SECTORS: u32 = 1 << 21;

/// Segments per discard or write-zeroes request.
pub(super) const MAX_ZERO_SEGMENTS: u32 = 16;

/// The device's fixed facts, decided at attach.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// Logical block size: the volume's sector size.
    pub logical_block: u32,
    /// Request queues.
    pub queues: u16,
    /// Descriptors per queue the VM may use at most.
    pub queue_size: u16,
    pub read_only: bool,
    /// The volume discards (`allow_discards`).
    pub discard: bool,
}

impl Geometry {
    /// The virtio feature bits offered to a VM: the device's and vhost-user's
    /// protocol-features bit.
    pub(super) fn features(&self) -> u64 {
        self.virtio_features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    /// The virtio-blk device's own feature bits (virtio 1.2, 5.2.3), whatever carries
    /// them.
    pub(crate) fn virtio_features(&self) -> u64 {
        let mut f = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_MQ;
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else {
            f |= 1 << VIRTIO_BLK_F_WRITE_ZEROES;
            if self.discard {
                f |= 1 << VIRTIO_BLK_F_DISCARD;
            }
        }
        f
    }

    /// The vhost-user protocol features offered: the configuration space (QEMU's
    /// vhost-user-blk refuses a back end without it), several queues, acknowledged
    /// requests, inflight I/O tracking (a restarted server resubmits what the dead one had
    /// in flight) and the back end's request channel (a new capacity told to the VM).
    pub(super) fn protocol_features() -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::BACKEND_REQ
    }

    /// The configuration space for a volume of `size_bytes`, `CONFIG_LEN` bytes.
    pub(crate) fn config_space(&self, size_bytes: u64) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let mut put = |at: usize, bytes: &[u8]| c[at..at + bytes.len()].copy_from_slice(bytes);
        // capacity is in 512-byte sectors whatever the block size (5.2.4).
        put(0, &(size_bytes / 512).to_le_bytes());
        // size_max (4) and geometry (16) stay zero: their features are not offered.
        // Two descriptors of a request are its header and status.
        put(
            12,
            &u32::from(self.queue_size.saturating_sub(2)).to_le_bytes(),
        );
        put(20, &self.logical_block.to_le_bytes());
        put(34, &self.queues.to_le_bytes());
        if !self.read_only {
            let align = (self.logical_block / 512).max(1);
            if self.discard {
                put(36, &MAX_ZERO_SECTORS.to_le_bytes());
                put(40, &MAX_ZERO_SEGMENTS.to_le_bytes());
                put(44, &align.to_le_bytes());
            }
            put(48, &MAX_ZERO_SECTORS.to_le_bytes());
            put(52, &MAX_ZERO_SEGMENTS.to_le_bytes());
            // write_zeroes_may_unmap (56) stays 0: a zeroed range is written, never
            // discarded (discarded ciphertext would read back as noise).
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;
    use virtio_bindings::virtio_blk::virtio_blk_config;

    /// The hand-written offsets are the kernel header's.
    #[test]
    fn offsets_are_the_kernel_headers() {
        assert_eq!(offset_of!(virtio_blk_config, seg_max), 12);
        assert_eq!(offset_of!(virtio_blk_config, blk_size), 20);
        assert_eq!(offset_of!(virtio_blk_config, num_queues), 34);
        assert_eq!(offset_of!(virtio_blk_config, max_discard_sectors), 36);
        assert_eq!(offset_of!(virtio_blk_config, max_discard_seg), 40);
        assert_eq!(offset_of!(virtio_blk_config, discard_sector_alignment), 44);
        assert_eq!(offset_of!(virtio_blk_config, max_write_zeroes_sectors), 48);
        assert_eq!(offset_of!(virtio_blk_config, max_write_zeroes_seg), 52);
        assert_eq!(offset_of!(virtio_blk_config, write_zeroes_may_unmap), 56);
        assert_eq!(
            offset_of!(virtio_blk_config, max_secure_erase_sectors),
            CONFIG_LEN
        );
    }

    #[test]
    fn config_and_features_follow_the_volume() {
        let g = Geometry {
            logical_block: 4096,
            queues: 2,
            queue_size: 128,
            read_only: false,
            discard: false,
        };
        let c = g.config_space(1 << 30);
        assert_eq!(u64::from_le_bytes(c[0..8].try_into().expect("8")), 1 << 21);
        assert_eq!(u32::from_le_bytes(c[20..24].try_into().expect("4")), 4096);
        assert_eq!(u16::from_le_bytes(c[34..36].try_into().expect("2")), 2);
        assert_eq!(&c[36..48], &[0; 12], "no discard without allow_discards");
        let f = g.features();
        assert_eq!(f & (1 << VIRTIO_BLK_F_DISCARD), 0);
        assert_ne!(f & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_RO), 0);
        let ro = Geometry {
            read_only: true,
            discard: true,
            ..g
        };
        assert_ne!(ro.features() & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(ro.features() & (1 << VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(ro.features() & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
        let d = Geometry { discard: true, ..g };
        assert_ne!(d.features() & (1 << VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(
            u32::from_le_bytes(d.config_space(0)[44..48].try_into().expect("4")),
            8
        );
    }
}
