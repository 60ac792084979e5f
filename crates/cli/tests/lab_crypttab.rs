//! Two volumes of one crypttab on a real kernel: `tests/lab/crypttab.sh` run by the
//! repository's VM harness `tests/lab/run.sh` (Debian's 6.12 kernel with `ublk_drv` and
//! `nbd`, under QEMU/TCG), in one guest boot. One entry by path on ublk, one by LUKS UUID
//! (resolved through blkid, the guest has no udev) on kernel NBD: `crypttab open`, mkfs,
//! mount, write; `crypttab ls` and `close` (refused while mounted, then both devices gone);
//! opened again with the files intact; `crypttab open --notify` sends READY=1 with the
//! device up and stops on `close`.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn two_volumes_of_one_crypttab_on_ublk_and_kernel_nbd() {
    let lab = ucrypt_testkit::repo_root().join("tests/lab");
    let Some(out) = ucrypt_testkit::run_in_vm(
        &lab.join("crypttab.sh"),
        [env!("CARGO_BIN_EXE_ucrypt").to_string()],
        &[("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
