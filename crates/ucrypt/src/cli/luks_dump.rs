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
    /// Only this keyslot's passphrase (with --dump-volume-key).
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    #[command(flatten)]
    key: KeyFileArgs,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(a.kind)?;
    if a.dump_json_metadata {
        let json = cd.dump_json().cs()?;
        println!("{json}");
        return Ok(());
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
        cd.volume_key(a.key_slot, &pass)
    })
    .cs()?;
    let info = cd.info();
    if key.is_empty() {
        return Err(anyhow::anyhow!("empty volume key")).code(EXIT_PARAMS);
    }
    let mut out = String::new();
    out.push_str(&format!(
        "LUKS header information for {}\n",
        a.dev.device.display()
    ));
    out.push_str(&format!("Cipher name:   \t{}\n", info.cipher));
    out.push_str(&format!("Cipher mode:   \t{}\n", info.cipher_mode));
    out.push_str(&format!("Payload offset:\t{}\n", info.data_offset));
    out.push_str(&format!(
        "UUID:          \t{}\n",
        info.uuid.as_deref().unwrap_or("")
    ));
    out.push_str(&format!("MK bits:       \t{}\n", key.len() * 8));
    out.push_str("MK dump:\t");
    for (i, b) in key.as_bytes().iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            out.push_str("\n\t\t");
        }
        out.push_str(&format!("{b:02x} "));
    }
    out.push('\n');
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}
