//! The VDUSE user API (`include/uapi/linux/vduse.h`, API version 0, Linux ≥ 5.15) and the
//! vDPA generic-netlink names (`include/uapi/linux/vdpa.h`), written out here: no
//! maintained crate binds VDUSE (the rust-vmm crates cover vhost and vhost-user only; the
//! `libc` crate has neither header), and the few structures and request numbers below
//! are stable kernel ABI. Each layout is checked against the C header's sizes and request
//! numbers in the tests at the end.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

const VDUSE_BASE: u64 = 0x81;

/// `_IOC(dir, VDUSE_BASE, nr, size)` of `asm-generic/ioctl.h`.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (VDUSE_BASE << 8) | nr
}
const NONE: u64 = 0;
const WRITE: u64 = 1;
const READ: u64 = 2;

/// `VDUSE_API_VERSION`.
pub(super) const API_VERSION: u64 = 0;
/// `VDUSE_NAME_MAX`: the device name with its NUL.
pub(super) const NAME_MAX: usize = 256;

pub(super) const SET_API_VERSION: u64 = ioc(WRITE, 0x01, 8);
pub(super) const CREATE_DEV: u64 = ioc(WRITE, 0x02, std::mem::size_of::<DevConfig>());
pub(super) const DESTROY_DEV: u64 = ioc(WRITE, 0x03, NAME_MAX);
pub(super) const IOTLB_GET_FD: u64 = ioc(READ | WRITE, 0x10, std::mem::size_of::<IotlbEntry>());
pub(super) const DEV_GET_FEATURES: u64 = ioc(READ, 0x11, 8);
pub(super) const DEV_SET_CONFIG: u64 = ioc(WRITE, 0x12, 8);
pub(super) const DEV_INJECT_CONFIG_IRQ: u64 = ioc(NONE, 0x13, 0);
pub(super) const VQ_SETUP: u64 = ioc(WRITE, 0x14, std::mem::size_of::<VqConfig>());
pub(super) const VQ_GET_INFO: u64 = ioc(READ | WRITE, 0x15, std::mem::size_of::<VqInfo>());
pub(super) const VQ_SETUP_KICKFD: u64 = ioc(WRITE, 0x16, std::mem::size_of::<VqEventfd>());
pub(super) const VQ_INJECT_IRQ: u64 = ioc(WRITE, 0x17, 4);

/// `struct vduse_dev_config`, without its trailing configuration space (which follows it
/// in the ioctl's buffer).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DevConfig {
    pub name: [u8; NAME_MAX],
    pub vendor_id: u32,
    pub device_id: u32,
    pub features: u64,
    pub vq_num: u32,
    pub vq_align: u32,
    pub reserved: [u32; 13],
    pub config_size: u32,
}

/// `struct vduse_iotlb_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct IotlbEntry {
    pub offset: u64,
    pub start: u64,
    pub last: u64,
    pub perm: u8,
}

/// `struct vduse_vq_config`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct VqConfig {
    pub index: u32,
    pub max_size: u16,
    pub reserved: [u16; 13],
}

/// `struct vduse_vq_info` with the split-ring member of its state union (the packed
/// member's 8 bytes are the union's size).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct VqInfo {
    pub index: u32,
    pub num: u32,
    pub desc_addr: u64,
    pub driver_addr: u64,
    pub device_addr: u64,
    pub avail_index: u16,
    pub state_rest: [u16; 3],
    pub ready: u8,
}

/// `struct vduse_vq_eventfd`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VqEventfd {
    pub index: u32,
    pub fd: i32,
}

/// `enum vduse_req_type`.
pub(super) const REQ_GET_VQ_STATE: u32 = 0;
pub(super) const REQ_SET_STATUS: u32 = 1;
pub(super) const REQ_UPDATE_IOTLB: u32 = 2;
/// `VDUSE_REQ_RESULT_OK`, `VDUSE_REQ_RESULT_FAILED`.
pub(super) const RESULT_OK: u32 = 0;
pub(super) const RESULT_FAILED: u32 = 1;

/// Bytes of `struct vduse_dev_request` and of `struct vduse_dev_response`: a 24-byte
/// head (`type`/`request_id`, `request_id`/`result`, 4 reserved words) and a 128-byte
/// union.
pub(super) const MSG_LEN: usize = 152;
/// Where the union starts.
pub(super) const MSG_UNION: usize = 24;

/// `VIRTIO_ID_BLOCK`.
pub(super) const VIRTIO_ID_BLOCK: u32 = 2;
/// `VIRTIO_F_ACCESS_PLATFORM`: VDUSE requires it (the driver's buffers reach the device
/// through VDUSE's IOVA domain).
pub(super) const VIRTIO_F_ACCESS_PLATFORM: u32 = 33;
/// `VIRTIO_CONFIG_S_DRIVER_OK`.
pub(super) const STATUS_DRIVER_OK: u8 = 4;

/// `ioctl(fd, request, arg)`, its error as `io::Error`.
///
/// # Safety
/// `arg` must point to what `request` reads or writes, of its size.
pub(super) unsafe fn ioctl<T>(fd: &File, request: u64, arg: *mut T) -> io::Result<i32> {
    // SAFETY: the caller's promise; the descriptor is open (borrowed).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The request numbers and sizes the C header gives (`gcc` on `linux/vduse.h`,
    /// x86-64): what the hand-written layouts must reproduce.
    #[test]
    fn layouts_and_request_numbers_are_the_headers() {
        assert_eq!(size_of::<DevConfig>(), 336);
        assert_eq!(size_of::<IotlbEntry>(), 32);
        assert_eq!(size_of::<VqConfig>(), 32);
        assert_eq!(size_of::<VqInfo>(), 48);
        assert_eq!(offset_of!(VqInfo, avail_index), 32);
        assert_eq!(offset_of!(VqInfo, ready), 40);
        assert_eq!(SET_API_VERSION, 0x4008_8101);
        assert_eq!(CREATE_DEV, 0x4150_8102);
        assert_eq!(DESTROY_DEV, 0x4100_8103);
        assert_eq!(IOTLB_GET_FD, 0xc020_8110);
        assert_eq!(DEV_GET_FEATURES, 0x8008_8111);
        assert_eq!(DEV_SET_CONFIG, 0x4008_8112);
        assert_eq!(DEV_INJECT_CONFIG_IRQ, 0x8113);
        assert_eq!(VQ_SETUP, 0x4020_8114);
        assert_eq!(VQ_GET_INFO, 0xc030_8115);
        assert_eq!(VQ_SETUP_KICKFD, 0x4008_8116);
        assert_eq!(VQ_INJECT_IRQ, 0x4004_8117);
    }
}
