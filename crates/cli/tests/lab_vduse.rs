//! `ucrypt open DEV NAME --device vduse` on a real kernel: `tests/lab/vduse.sh` in one boot
//! of the repository's VM harness `tests/lab/run.sh` (Debian's 6.12 kernel, which builds
//! VDUSE as the `vduse` module, under QEMU/TCG). The refusals first: without the `vduse`
//! module (naming it), without `virtio_vdpa` (naming it), for a caller who is not root. Then
//! a LUKS2 volume of 4096-byte sectors with `--allow-discards` and two queues as the guest
//! kernel's own `/dev/vdX` (VDUSE + `virtio_vdpa` + `virtio_blk`, served by the vhost-user
//! front end's virtio-blk code): logical block, capacity, two hardware queues, mkfs.ext4,
//! mount, write with fsync, `close` refused with exit code 5 while mounted, direct writes
//! from both CPUs at once, `blkdiscard` and `blkdiscard -z`, close (the `vdX` and the VDUSE
//! device gone); the kernel's dm-crypt (cryptsetup) then finds the file, the raw writes and
//! the zeroes in the image. Read-only (`blockdev --getro`, a write fails, the file reads
//! back), resize (the new capacity reaches `/dev/vdX` through a configuration interrupt),
//! and `close` of an instance whose server was killed with SIGKILL.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

#[test]
fn open_as_vduse_on_a_real_kernel() {
    let lab = ucrypt_testkit::repo_root().join("tests/lab");
    let Some(out) = ucrypt_testkit::run_in_vm(
        &lab.join("vduse.sh"),
        [env!("CARGO_BIN_EXE_ucrypt").to_string()],
        &[("LAB_TIMEOUT", "1200")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
