//! `ucrypt open DEV NAME --device ublk|nbd` on a real kernel: `tests/lab/blockdev.sh` run
//! by the repository's VM harness `tests/lab/run.sh` (Debian's 6.12 kernel with `ublk_drv`,
//! `nbd` and `dm-crypt`, under QEMU/TCG), in one guest boot. For each of ublk and kernel
//! NBD: open by name, the device's logical block is the LUKS2 sector size, mkfs.ext4,
//! mount, write, busy while mounted, `ucrypt close` refused with exit code 5 while mounted
//! (and the volume still served), umount, close, node gone, reopen, data intact; then the
//! kernel's own dm-crypt (the table `luksOpen --print-table` gives) reads what the front
//! end wrote and the front end reads what dm-crypt wrote; the ublk round again with
//! `--ublk-poll 100` (hybrid polling, unpinned inline queue threads). Crash recovery, for ublk (user
//! recovery) and kernel NBD (`NBD_CMD_RECONFIGURE`): `kill -9` of the server under a
//! mounted filesystem doing fsync'd writes, `ucrypt open --recover` (the front end found
//! by the instance's name), every fsync'd file intact, and dm-crypt reads them too.
//! In the same boot, LUKS2 reencryption against cryptsetup's online mode
//! (`tests/lab/reencrypt.sh`): cryptsetup's online pass killed mid-way and finished by
//! ucrypt; ucrypt's pass stopped, or killed, mid-way and finished by cryptsetup online; each
//! time dm-crypt and ucrypt read back the pattern written before. And LUKS1 reencryption
//! against cryptsetup 2.6.1's legacy LUKS1 pass (`tests/lab/reencrypt_luks1.sh`): cryptsetup
//! interrupted and finished by ucrypt, ucrypt interrupted and finished by cryptsetup, ucrypt
//! killed (-9) and finished by ucrypt; dm-crypt and ucrypt read the pattern each time; a
//! decryption by ucrypt, and one by cryptsetup interrupted and finished by ucrypt
//! (`--decrypt --uuid`), leave the pattern as the device; an encryption by ucrypt
//! (`--encrypt --type luks1 --reduce-device-size`) is read by dm-crypt.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn open_by_name_as_ublk_and_kernel_nbd_on_a_real_kernel() {
    let lab = ucrypt_testkit::repo_root().join("tests/lab");
    let Some(out) = ucrypt_testkit::run_in_vm(
        &lab.join("blockdev.sh"),
        [
            env!("CARGO_BIN_EXE_ucrypt").to_string(),
            "cli".into(),
            "ublk".into(),
            "ublk-poll".into(),
            "nbd".into(),
            "recovery".into(),
            "nbd-recovery".into(),
            format!("reencrypt={}", lab.join("reencrypt.sh").display()),
            format!("luks1reenc={}", lab.join("reencrypt_luks1.sh").display()),
        ],
        &[("LAB_TIMEOUT", "1500")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
