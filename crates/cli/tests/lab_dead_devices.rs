//! Dead instances' kernel devices and `resize` of the block front ends on a real kernel:
//! `tests/lab/deadblock.sh` run by the repository's VM harness `tests/lab/run.sh` (Debian's
//! 6.12 kernel with `ublk_drv` and `nbd`, under QEMU/TCG), in one guest boot. For ublk and
//! kernel NBD: `kill -9` of the server under a mounted filesystem, then `ls`, `ls --json`
//! and `status` show the instance as dead with its device and what to do; `open` of the
//! name or of the image under another name is refused (exit 5) without a second device;
//! `close` is refused while mounted; `open --recover` serves it again with the data
//! intact; `close` of a dead instance with nothing mounted removes its device; with its
//! runtime directory removed (the instance's, then the whole base with the name locks)
//! `ls` and `status` still find it through its kernel device and `close` removes it.
//! `resize` shrinks and grows `/dev/nbdN`; on ublk (6.12 has no `UBLK_CMD_UPDATE_SIZE`) it
//! is refused with exit 5 while the device is mounted or held open (sizes unchanged), and
//! otherwise re-adds the device at the new size under the same number (the file system
//! mounts again intact; recovery after `kill -9` still works). A start-up failure after
//! the device existed leaves no device behind. Root's stable name `/dev/ucrypt/NAME`: made
//! by `open`, shown by `status`, pointing to the node, mkfs and mount by it, gone after
//! `close`.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn dead_instances_devices_and_resize_on_a_real_kernel() {
    let lab = ucrypt_testkit::repo_root().join("tests/lab");
    let Some(out) = ucrypt_testkit::run_in_vm(
        &lab.join("deadblock.sh"),
        [env!("CARGO_BIN_EXE_ucrypt").to_string()],
        &[("LAB_TIMEOUT", "1800")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
