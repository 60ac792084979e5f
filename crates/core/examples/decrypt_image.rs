//! Decrypts one sector of an image through the library, the way `ucrypt read` does.
//!
//! ```sh
//! cargo run -p ucrypt --example decrypt_image -- '0 2048 crypt aes-xts-plain64 <hexkey> 0 disk.img 0' 7
//! ```
//! prints 512-byte sector 7 of the plaintext view as hex.

use ucrypt_backend::Backend;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(table), sector) = (args.next(), args.next()) else {
        anyhow::bail!("usage: decrypt_image '<table line>' [SECTOR]");
    };
    let sector: u64 = sector.as_deref().unwrap_or("0").parse()?;
    let opened = ucrypt::open_table(
        &table,
        ucrypt::OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let mut buf = [0u8; 512];
    opened.volume.read_at(&mut buf, sector * 512)?;
    for line in buf.chunks(32) {
        println!(
            "{}",
            line.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
    }
    Ok(())
}
