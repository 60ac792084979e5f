//! LUKS2 tokens bound to a TPM 2.0 on a real kernel: `tests/lab/tokens.sh` run by the
//! repository's VM harness `tests/lab/run.sh` with `LAB_TPM=1` (swtpm as the guest's
//! `/dev/tpmrm0`), in one guest boot. `systemd-cryptenroll --tpm2-device=auto` and `clevis
//! luks bind ... tpm2 '{}'` enrol on a ucrypt-formatted image; each token alone gives the
//! volume key cryptsetup dumps with the passphrase; a named instance opens by token only.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download, no swtpm: `scripts/setup.sh` installs and fetches them); fails when `CI` is
//! set.

#[test]
fn systemd_tpm2_and_clevis_tpm2_tokens_open_in_the_lab() {
    let lab = ucrypt_testkit::repo_root().join("tests/lab");
    let Some(out) = ucrypt_testkit::run_in_vm(
        &lab.join("tokens.sh"),
        [env!("CARGO_BIN_EXE_ucrypt").to_string()],
        &[("LAB_TIMEOUT", "900"), ("LAB_TPM", "1")],
    ) else {
        return;
    };
    ucrypt_testkit::assert_lab_passed(&out);
}
