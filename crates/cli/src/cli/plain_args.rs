//! Plain-mode options (`--type plain`) shared by `open`, `luksOpen` and the TCRYPT commands
//! (whose system-encryption and hidden-volume paths fall back to them), and by loop-AES
//! (`--type loopaes`), which takes the same names with its own defaults.

/// Plain-mode options (`--type plain`), cryptsetup's names and 2.6 defaults.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct PlainArgs {
    /// Cipher (plain default aes-cbc-essiv:sha256; loop-AES: the block cipher, default aes).
    #[arg(short, long)]
    pub(crate) cipher: Option<String>,
    /// Key size in bits (plain default 256; loop-AES: of each key, default 256).
    #[arg(short = 's', long)]
    pub(crate) key_size: Option<u32>,
    /// Passphrase hash (plain default ripemd160, "plain" for none; loop-AES: the hash of
    /// each key line, default by key size: sha256, sha384, sha512).
    #[arg(long)]
    pub(crate) hash: Option<String>,
    /// Data start on the device in 512-byte sectors.
    #[arg(short = 'o', long, default_value_t = 0)]
    pub(crate) offset: u64,
    /// IV offset in 512-byte sectors (plain default 0; loop-AES default --offset).
    #[arg(short = 'p', long)]
    pub(crate) skip: Option<u64>,
    /// Plain mode: mapping size in 512-byte sectors (default 0: to the end).
    #[arg(short = 'b', long)]
    pub(crate) size: Option<u64>,
    /// Plain mode: encryption sector size in bytes (default 512).
    #[arg(long)]
    pub(crate) sector_size: Option<u32>,
    /// Count IVs in sector-size units (plain mode).
    #[arg(long)]
    pub(crate) iv_large_sectors: bool,
    /// Plain mode: take SIZE as the device's size instead of its real one (bytes, or with
    /// a unit: S = 512-byte sectors, K/M/G/T binary), as cryptsetup's --device-size.
    #[arg(long, value_name = "SIZE", value_parser = ucrypt::format::parse_size)]
    pub(crate) device_size: Option<u64>,
}

impl PlainArgs {
    /// The options as the library's unlock takes them (which checks them against the type
    /// and applies cryptsetup's defaults).
    pub(crate) fn inputs(&self) -> ucrypt::unlock::PlainInputs {
        ucrypt::unlock::PlainInputs {
            cipher: self.cipher.clone(),
            key_size: self.key_size,
            hash: self.hash.clone(),
            offset: self.offset,
            skip: self.skip,
            size: self.size,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
            device_size: self.device_size,
        }
    }
}
