//! `ucrypt luksDump <device>`: the header as cryptsetup prints it (libcryptsetup's own
//! `crypt_dump`), the LUKS2 JSON metadata, or the volume key (only when confirmed), as the
//! library's `ucrypt::luks::dump` gives them, printed in cryptsetup's layout.

use super::exit::lib_error;
use super::luks::{luks_type, DeviceArgs};
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use ucrypt::header::VolumeType;
use ucrypt::luks::dump::{self, Output};

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

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(a.kind)?;
    let d = dump::Dump {
        device: a.dev.device.clone(),
        json: a.dump_json_metadata,
        volume_key: a.dump_volume_key,
        unbound: a.key_slot.filter(|_| a.unbound),
        key: a.key.inputs(),
        volume_key_file: a.volume_key_file.clone(),
        batch: a.batch_mode,
    };
    // The header's location, as cryptsetup's crypt_get_device_name.
    let header = a.dev.header_path().display();
    let (mut out, key) =
        match dump::dump(&mut cd, &d, &mut Terminal::default()).map_err(lib_error)? {
            Output::Json(json) => {
                println!("{json}");
                return Ok(());
            }
            Output::Text(text) => {
                print!("{}", super::luks::shown(text));
                return Ok(());
            }
            Output::Unbound(slot, k) => (
                format!(
                    "LUKS header information for {header}\nUUID:    \t{}\nKeyslot: \t{slot}\n\
                 Key bits:\t{}\n",
                    k.info.uuid.as_deref().unwrap_or(""),
                    k.bits
                ),
                k.key.map(|key| ("Unbound Key:\t", key)),
            ),
            Output::VolumeKey(k) => (
                format!(
                    "LUKS header information for {header}\nCipher name:   \t{}\n\
                 Cipher mode:   \t{}\nPayload offset:\t{}\nUUID:          \t{}\n\
                 MK bits:       \t{}\n",
                    k.info.cipher,
                    k.info.cipher_mode,
                    k.info.data_offset,
                    k.info.uuid.as_deref().unwrap_or(""),
                    k.bits
                ),
                k.key.map(|key| ("MK dump:\t", key)),
            ),
        };
    match key {
        Some((label, key)) => {
            out.push_str(label);
            hex_lines(&mut out, key.as_bytes());
        }
        None => {
            let f = d
                .volume_key_file
                .as_deref()
                .unwrap_or(std::path::Path::new(""));
            out.push_str(&format!("Key stored to file {}.\n", f.display()));
        }
    }
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}
