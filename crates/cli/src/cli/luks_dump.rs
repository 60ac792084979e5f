//! `ucrypt luksDump <device>`: the header as cryptsetup prints it (libcryptsetup's own
//! `crypt_dump`), the LUKS2 JSON metadata, or the volume key (only when confirmed).

use super::luks::{luks_type, CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;

/// Arguments of `ucrypt luksDump`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Expected LUKS type: luks (any), luks1, luks2.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    /// Print the LUKS2 JSON metadata instead of the text dump.
    #[arg(long)]
    dump_json_metadata: bool,
    /// Print the volume key (needs the passphrase, and --batch-mode or a typed YES).
    #[arg(long, alias = "dump-master-key")]
    dump_volume_key: bool,
    /// Confirms --dump-volume-key without a question.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// With --unbound: the unbound keyslot to dump. (Like cryptsetup 2.6,
    /// --dump-volume-key takes the volume key from whichever keyslot the passphrase opens.)
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Print the key of the unbound keyslot --key-slot (needs its passphrase, and
    /// --batch-mode or a typed YES), or write it to --volume-key-file.
    #[arg(long, requires = "key_slot")]
    unbound: bool,
    #[command(flatten)]
    key: KeyFileArgs,
    /// With --dump-volume-key (or --unbound): write the key to this new file (owner
    /// read-only) instead of printing it.
    #[arg(long, value_name = "FILE", alias = "master-key-file")]
    volume_key_file: Option<std::path::PathBuf>,
}

/// Writes `key` to a new file (never overwritten), readable by its owner only, as
/// cryptsetup's `tools_write_mk`.
fn write_key_file(f: &std::path::Path, key: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(f)
        .and_then(|mut file| file.write_all(key))
        .map_err(|e| anyhow::anyhow!("cannot write the key to {}: {e}", f.display()))?;
    Ok(())
}

/// `key` as cryptsetup's `crypt_log_hex(.., " ", 16, "\n\t\t")` prints it.
fn hex_lines(out: &mut String, key: &[u8]) {
    for (i, b) in key.iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            out.push_str("\n\t\t");
        }
        out.push_str(&format!("{b:02x} "));
    }
    out.push('\n');
}

/// `luksDump --unbound -S N`: the key of unbound keyslot N, as cryptsetup's
/// `luksDump_with_unbound_key` prints it.
fn dump_unbound(a: &Args, cd: &mut ucrypt::luks::CryptDevice) -> Result<(), CliError> {
    let slot = a.key_slot.expect("clap requires --key-slot with --unbound");
    if cd.keyslot_status(slot) != ucrypt::luks::KeyslotStatus::Unbound {
        return Err(anyhow::anyhow!(
            "keyslot {slot} does not contain an unbound key"
        ))
        .code(EXIT_PARAMS);
    }
    secret::confirm(
        a.batch_mode,
        "The header dump with unbound key is sensitive information. This dump should be \
         stored encrypted in a safe place",
    )?;
    let pass = secret::existing(&a.key, &a.dev.device)?;
    let key =
        super::progress::searching("Unlocking the unbound key", || cd.unbound_key(slot, &pass))
            .cs()?;
    let info = cd.info();
    let mut out = format!(
        "LUKS header information for {}\nUUID:    \t{}\nKeyslot: \t{slot}\nKey bits:\t{}\n",
        a.dev.header_path().display(),
        info.uuid.as_deref().unwrap_or(""),
        key.len() * 8
    );
    if let Some(f) = &a.volume_key_file {
        write_key_file(f, key.as_bytes())?;
        out.push_str(&format!("Key stored to file {}.\n", f.display()));
        print!("{out}");
        return Ok(());
    }
    out.push_str("Unbound Key:\t");
    hex_lines(&mut out, key.as_bytes());
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(a.kind)?;
    if a.dump_json_metadata {
        let json = cd.dump_json().cs()?;
        println!("{json}");
        return Ok(());
    }
    if a.volume_key_file.is_some() && !a.dump_volume_key && !a.unbound {
        return Err(anyhow::anyhow!(
            "--volume-key-file needs --dump-volume-key or --unbound"
        ))
        .code(EXIT_PARAMS);
    }
    if a.unbound && !a.dump_volume_key {
        return dump_unbound(&a, &mut cd);
    }
    if !a.dump_volume_key {
        print!("{}", super::luks::shown(cd.dump().cs()?));
        return Ok(());
    }
    secret::confirm(
        a.batch_mode,
        "Header dump with volume key is sensitive information that allows access to the \
         encrypted partition without a passphrase. This dump should always be stored \
         encrypted in a safe place",
    )?;
    let pass = secret::existing(&a.key, &a.dev.device)?;
    let (_, key) = super::progress::searching("Unlocking the volume key", || {
        // Any keyslot, as cryptsetup 2.6 (it reads --key-slot only for --unbound).
        cd.volume_key(None, &pass)
    })
    .cs()?;
    let info = cd.info();
    if key.is_empty() {
        return Err(anyhow::anyhow!("empty volume key")).code(EXIT_PARAMS);
    }
    let mut out = String::new();
    out.push_str(&format!(
        "LUKS header information for {}\n",
        // The header's location, as cryptsetup's crypt_get_device_name.
        a.dev.header_path().display()
    ));
    out.push_str(&format!("Cipher name:   \t{}\n", info.cipher));
    out.push_str(&format!("Cipher mode:   \t{}\n", info.cipher_mode));
    out.push_str(&format!("Payload offset:\t{}\n", info.data_offset));
    out.push_str(&format!(
        "UUID:          \t{}\n",
        info.uuid.as_deref().unwrap_or("")
    ));
    out.push_str(&format!("MK bits:       \t{}\n", key.len() * 8));
    if let Some(f) = &a.volume_key_file {
        // As cryptsetup: a new file (never overwritten), readable by its owner only.
        write_key_file(f, key.as_bytes())?;
        out.push_str(&format!("Key stored to file {}.\n", f.display()));
        print!("{out}");
        return Ok(());
    }
    out.push_str("MK dump:\t");
    hex_lines(&mut out, key.as_bytes());
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}
