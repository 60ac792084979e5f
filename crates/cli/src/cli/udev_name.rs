//! `ucrypt udev-name KERNEL`: the name of root's live instance serving `/dev/KERNEL`, for
//! udev's rule (`udev/99-ucrypt.rules`: `PROGRAM="... udev-name %k", SYMLINK+="ucrypt/%c"`).
//! Prints nothing and exits 1 when no instance serves it. Read-only
//! ([`ucrypt::instance::runtime::owner_of_node`]): udev runs it for every event of every
//! ublk and NBD device.

use super::CliError;

/// Arguments of `ucrypt udev-name`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The device's kernel name (`ublkb0`, `nbd3`: udev's %k) or its path.
    #[arg(value_name = "KERNEL")]
    kernel: String,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let node = match a.kernel.strip_prefix("/dev/") {
        Some(_) => std::path::PathBuf::from(&a.kernel),
        None => std::path::Path::new("/dev").join(&a.kernel),
    };
    match ucrypt::instance::runtime::owner_of_node(&node) {
        Some(name) => {
            println!("{name}");
            Ok(())
        }
        None => Err(CliError {
            code: super::exit::EXIT_PARAMS,
            err: super::exit::Printed.into(),
        }),
    }
}
