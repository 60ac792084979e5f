//! The vDPA bus's generic-netlink commands (`include/uapi/linux/vdpa.h`), what
//! `vdpa dev add name NAME mgmtdev vduse` and `vdpa dev del NAME` send, through `neli` as
//! the kernel NBD front end does; and the sysfs steps that bind the device to
//! `virtio_vdpa` (a host virtio device) rather than `vhost_vdpa` (a VM's).

use crate::DeviceError;
use neli::consts::{nl::NlmF, socket::NlFamily};
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::neli_enum;
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;
use std::path::Path;

const FAMILY: &str = "vdpa";
/// `VDPA_GENL_VERSION`.
const VERSION: u8 = 1;

/// `enum vdpa_command` (the ones used).
#[neli_enum(serialized_type = "u8")]
pub enum VdpaCmd {
    /// `VDPA_CMD_UNSPEC`
    Unspec = 0,
    /// `VDPA_CMD_DEV_NEW`
    DevNew = 3,
    /// `VDPA_CMD_DEV_DEL`
    DevDel = 4,
}
impl neli::consts::genl::Cmd for VdpaCmd {}

/// `enum vdpa_attr` (the ones used).
#[neli_enum(serialized_type = "u16")]
pub enum VdpaAttr {
    /// `VDPA_ATTR_UNSPEC`
    Unspec = 0,
    /// `VDPA_ATTR_MGMTDEV_DEV_NAME` (string): the management device, `vduse`.
    MgmtdevDevName = 2,
    /// `VDPA_ATTR_DEV_NAME` (string)
    DevName = 4,
}
impl neli::consts::genl::NlAttrType for VdpaAttr {}

fn netlink_err(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::io(what, std::io::Error::other(e.to_string()))
}

fn string_attr(kind: VdpaAttr, s: &str) -> Result<Nlattr<VdpaAttr, Buffer>, DeviceError> {
    let mut bytes = s.as_bytes().to_vec();
    bytes.push(0);
    NlattrBuilder::default()
        .nla_type(
            AttrTypeBuilder::default()
                .nla_type(kind)
                .build()
                .map_err(|e| netlink_err("building a netlink attribute", e))?,
        )
        .nla_payload(Buffer::from(bytes))
        .build()
        .map_err(|e| netlink_err("building a netlink attribute", e))
}

fn call(cmd: VdpaCmd, attrs: GenlBuffer<VdpaAttr, Buffer>, what: &str) -> Result<(), DeviceError> {
    let (sock, _) = NlRouter::connect(NlFamily::Generic, Some(0), Groups::empty())
        .map_err(|e| netlink_err("opening a generic netlink socket", e))?;
    let family = sock
        .resolve_genl_family(FAMILY)
        .map_err(|e| DeviceError::Unavailable {
            frontend: "vduse",
            why: format!("the kernel has no \"{FAMILY}\" netlink family ({e}); modprobe vdpa"),
        })?;
    let msg = GenlmsghdrBuilder::default()
        .cmd(cmd)
        .version(VERSION)
        .attrs(attrs)
        .build()
        .map_err(|e| netlink_err("building a netlink message", e))?;
    let recv = sock
        .send::<_, _, u16, Genlmsghdr<VdpaCmd, VdpaAttr>>(
            family,
            NlmF::ACK,
            NlPayload::Payload(msg),
        )
        .map_err(|e| netlink_err(what, e))?;
    for reply in recv {
        reply.map_err(|e| match e {
            neli::err::RouterError::Nlmsgerr(m) => {
                DeviceError::io(what, std::io::Error::from_raw_os_error(-*m.error()))
            }
            e => netlink_err(what, e),
        })?;
    }
    Ok(())
}

/// `vdpa dev add name NAME mgmtdev vduse`: the VDUSE device `name` on the vDPA bus. Its
/// driver probes it before this returns (feature negotiation and status changes come to
/// the device's control thread meanwhile, which must be running).
pub(super) fn add(name: &str) -> Result<(), DeviceError> {
    let mut attrs = GenlBuffer::new();
    attrs.push(string_attr(VdpaAttr::MgmtdevDevName, "vduse")?);
    attrs.push(string_attr(VdpaAttr::DevName, name)?);
    call(
        VdpaCmd::DevNew,
        attrs,
        &format!("adding vDPA device {name} (vdpa dev add)"),
    )
}

/// `vdpa dev del NAME`.
pub(super) fn del(name: &str) -> Result<(), DeviceError> {
    let mut attrs = GenlBuffer::new();
    attrs.push(string_attr(VdpaAttr::DevName, name)?);
    call(
        VdpaCmd::DevDel,
        attrs,
        &format!("removing vDPA device {name} (vdpa dev del)"),
    )
}

/// Whether vDPA device `name` exists.
pub(super) fn exists(name: &str) -> bool {
    Path::new("/sys/bus/vdpa/devices").join(name).exists()
}

/// Makes `virtio_vdpa` the driver of vDPA device `name`: where `vhost_vdpa` took it (both
/// loaded, and it came first), it is unbound from there and bound here.
pub(super) fn bind_virtio(name: &str) -> Result<(), DeviceError> {
    let dev = Path::new("/sys/bus/vdpa/devices").join(name);
    let driver = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
    if driver.as_deref() == Some("virtio_vdpa") {
        return Ok(());
    }
    let write = |path: &Path| {
        std::fs::write(path, name)
            .map_err(|e| DeviceError::io(format!("writing {}", path.display()), e))
    };
    if let Some(d) = driver {
        write(&Path::new("/sys/bus/vdpa/drivers").join(d).join("unbind"))?;
    }
    write(Path::new("/sys/bus/vdpa/drivers/virtio_vdpa/bind"))
}
