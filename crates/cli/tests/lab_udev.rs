//! `/dev/ucrypt/NAME` made by udev: `tests/lab/udev.sh` run by the repository's VM harness
//! `tests/lab/run.sh` (Debian's 6.12 kernel with `ublk_drv` and `nbd`, under QEMU/TCG), in
//! one guest boot. The guest has no udev of its own; the script starts the host's
//! `systemd-udevd` with `udev/99-ucrypt.rules` (its PROGRAM pointed at this binary's
//! `udev-name`): ucrypt's own link without udevd, then udev's for a ublk and a kernel NBD
//! instance (`DEVLINKS`, `UCRYPT_NAME`, `udevadm test`), back after a change event, gone on
//! close.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn udev_names_ublk_and_nbd_instances_under_dev_ucrypt() {
    let root = ucrypt_testkit::repo_root();
    let Some(out) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/udev.sh"),
        [
            env!("CARGO_BIN_EXE_ucrypt").to_string(),
            root.join("udev/99-ucrypt.rules").display().to_string(),
        ],
        &[("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
