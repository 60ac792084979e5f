//! The kernel's ublk devices seen from outside: whether the driver is there, which devices
//! exist and whose they are, and removing them.

use super::*;

/// libublk sends control commands through a per-thread io_uring, created by the thread
/// that builds a `UblkCtrl`; any other thread that uses the same control (the server
/// thread, whoever detaches) needs its own ring first.
pub(super) fn ctrl_ring() -> Result<(), UblkError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                    .build(16)
                    .map_err(UblkError::IOError)?,
            );
        }
        Ok(())
    })
}

/// Whether this kernel has the ublk driver loaded (`/dev/ublk-control` exists).
///
/// # Errors
/// [`DeviceError::Unavailable`] naming what is missing.
pub fn available() -> Result<(), DeviceError> {
    if Path::new(CONTROL).exists() {
        Ok(())
    } else {
        Err(DeviceError::Unavailable {
            frontend: "ublk",
            why: format!("{CONTROL} does not exist (modprobe ublk_drv; Linux 6.0 or later)"),
        })
    }
}

/// The state of an existing ublk device, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Added, not started (or stopped).
    Dead,
    /// Served.
    Live,
    /// Its server died; waiting for [`recover`].
    Quiesced,
    /// Its server died and the device fails I/O.
    FailIo,
    /// A state this code does not know.
    Other(u16),
}

/// What [`query`] reports about an existing ublk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device number (`/dev/ublkbN`).
    pub dev_id: u32,
    /// Driver state.
    pub state: DeviceState,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub logical_block: u32,
    /// Pid of the server that started it.
    pub server_pid: i32,
}

/// Asks the driver about device `dev_id`.
///
/// # Errors
/// The device does not exist, or the driver refuses.
pub fn query(dev_id: u32) -> Result<DeviceInfo, DeviceError> {
    available()?;
    let id = i32::try_from(dev_id).map_err(|_| DeviceError::Unavailable {
        frontend: "ublk",
        why: format!("device id {dev_id} out of range"),
    })?;
    ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
    let ctrl =
        UblkCtrl::new_simple(id).map_err(|e| ublk_err(&format!("ublk device {dev_id}"), e))?;
    let info = ctrl.dev_info();
    let mut params = sys::ublk_params {
        len: std::mem::size_of::<sys::ublk_params>() as u32,
        types: sys::UBLK_PARAM_TYPE_BASIC,
        ..Default::default()
    };
    ctrl.get_params(&mut params).map_err(|e| {
        ublk_err(
            &format!("reading the parameters of ublk device {dev_id}"),
            e,
        )
    })?;
    let state = match u32::from(info.state) {
        sys::UBLK_S_DEV_DEAD => DeviceState::Dead,
        sys::UBLK_S_DEV_LIVE => DeviceState::Live,
        sys::UBLK_S_DEV_QUIESCED => DeviceState::Quiesced,
        sys::UBLK_S_DEV_FAIL_IO => DeviceState::FailIo,
        _ => DeviceState::Other(info.state),
    };
    // The controlling handle must not delete the device when dropped: it was not added here.
    ctrl.disown();
    Ok(DeviceInfo {
        dev_id,
        state,
        size_bytes: params.basic.dev_sectors << 9,
        logical_block: 1u32 << params.basic.logical_bs_shift.min(31),
        server_pid: info.ublksrv_pid,
    })
}

/// The instance name a ucrypt ublk device was created for (kept by libublk in
/// `/run/ublksrvd/N.json`), if any.
pub(super) fn instance_name(dev_id: u32) -> Option<String> {
    let ctrl = UblkCtrl::new_simple(i32::try_from(dev_id).ok()?).ok()?;
    let name = ctrl
        .get_target_data_from_json()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string));
    ctrl.disown();
    name
}

/// The ublk devices that exist (numbers N of `/dev/ublkcN`), from sysfs.
fn device_ids() -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_dir("/sys/class/ublk-char")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("ublkc"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The instance name in the JSON libublk exported for device `dev_id`
/// (`/run/ublksrvd/NNNN.json`, kept until the device is deleted), read as a file: no
/// control command, so it can run before `ucrypt open` forks.
fn exported_name(dev_id: u32) -> Option<String> {
    let path = format!("{}/{dev_id:04}.json", UblkCtrl::run_dir());
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    // Another libublk server's device may carry a name too: only ucrypt's target counts.
    if v.get("target")?.get("tgt_type")?.as_str()? != TARGET {
        return None;
    }
    v.get("target_data")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

/// Whether some process has `/dev/ublkc{dev_id}` open: a live server always does.
fn served(dev_id: u32) -> bool {
    let Ok(numbers) = std::fs::read_to_string(format!("/sys/class/ublk-char/ublkc{dev_id}/dev"))
    else {
        return false;
    };
    let Some((major, minor)) = numbers
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
    else {
        return false;
    };
    crate::device_open_anywhere(libc::makedev(major, minor), false, None)
}

/// The ublk devices of instance `name` that no server serves (what a server killed with
/// `-9` leaves: quiesced, its I/O held for [`recover`]). Files only: sysfs, the exported
/// JSON, `/proc`.
pub fn orphans_of(name: &str) -> Vec<u32> {
    device_ids()
        .into_iter()
        .filter(|&id| exported_name(id).as_deref() == Some(name) && !served(id))
        .collect()
}

/// Every ucrypt ublk device that no server serves, with the instance name it carries.
pub fn all_orphans() -> Vec<(String, u32)> {
    device_ids()
        .into_iter()
        .filter_map(|id| Some((exported_name(id)?, id)))
        .filter(|&(_, id)| !served(id))
        .collect()
}

/// Stops and deletes device `dev_id`, whose server is gone: its held I/O fails. The
/// deletion does not wait for the last opener (a filesystem still mounted on it).
///
/// # Errors
/// The driver refused.
pub fn remove(dev_id: u32) -> Result<(), DeviceError> {
    available()?;
    let id = i32::try_from(dev_id).map_err(|_| DeviceError::Unavailable {
        frontend: "ublk",
        why: format!("device id {dev_id} out of range"),
    })?;
    ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
    let ctrl =
        UblkCtrl::new_simple(id).map_err(|e| ublk_err(&format!("ublk device {dev_id}"), e))?;
    let stopped = ctrl
        .kill_dev()
        .map(|_| ())
        .map_err(|e| ublk_err(&format!("stopping /dev/ublkb{dev_id}"), e));
    let deleted = ctrl
        .del_dev_async()
        .or_else(|_| ctrl.del_dev())
        .map(|_| ())
        .map_err(|e| ublk_err(&format!("deleting /dev/ublkb{dev_id}"), e));
    ctrl.disown();
    stopped.and(deleted)
}

/// The device of instance `name` whose server died and which waits for [`recover`]
/// (`ucrypt open --recover NAME` finds it by name: no state of the dead server needed).
///
/// # Errors
/// [`DeviceError::Unavailable`] without the driver.
pub fn find_waiting(name: &str) -> Result<Option<u32>, DeviceError> {
    available()?;
    Ok(device_ids().into_iter().find(|&id| {
        query(id).is_ok_and(|i| i.state == DeviceState::Quiesced)
            && instance_name(id).as_deref() == Some(name)
    }))
}
