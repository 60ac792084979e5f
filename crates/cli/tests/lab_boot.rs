//! A real boot with systemd as PID 1: `tests/lab/boot.sh` run by the repository's VM
//! harness with `LAB_EXEC=1` (the script is PID 1 and execs `/lib/systemd/systemd
//! --unit=lab.target`). Installed as the README says: the binary, `ucrypt-generator`,
//! `ucrypt@.service` and `udev/99-ucrypt.rules`; one `/etc/ucrypttab` line (ublk) and an
//! fstab line naming `/dev/ucrypt/data`. Checked inside the boot: the generated unit is
//! active with the server as its main process, udev made `/dev/ucrypt/data`
//! (`dev-ucrypt-data.device` active), cryptsetup.target reached, the mount active with the
//! file made before boot; `systemctl stop` closes the instance and the link goes.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn systemd_boots_a_ucrypttab_volume_and_mounts_it_by_its_udev_link() {
    let root = ucrypt_testkit::repo_root();
    let Some(out) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/boot.sh"),
        [
            env!("CARGO_BIN_EXE_ucrypt").to_string(),
            root.display().to_string(),
        ],
        &[("LAB_TIMEOUT", "900"), ("LAB_EXEC", "1")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
