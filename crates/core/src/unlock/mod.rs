//! The unlock policy: from a device and what the user gave (a key file, a keyslot, tokens,
//! TCRYPT options, a volume key file...), what is tried in which order, what is asked
//! for, and how often, until the volume is unlocked or the answer is no. The command's
//! `open` (served or `--test-passphrase`) and `luksOpen` (`--print-table`) both run it;
//! secrets are asked for only through a [`Prompt`].
//!
//! ```text
//!  Request::unlock ── attempt, again while a typed passphrase is wrong (--tries)
//!    type: named, else detected (LUKS, BitLocker, FileVault2); options it has no use
//!      for refused; no signature and no --type: refused before anything is asked
//!    --volume-key-file ─► header::unlock_by_volume_key
//!    LUKS2 tokens ─► token::volume_key (cryptsetup's order by keyslot priority; each
//!      token's handler called once: the kernel keyring, a libcryptsetup plugin, clevis;
//!      a PIN asked for, or the key file's under --token-only) ─► header::unlock_by_volume_key
//!    the secret: key file, or Prompt::passphrase (TCRYPT: key files mixed in, PIM)
//!    --test-passphrase (LUKS, local): the keyslots checked, nothing unlocked
//!    header::unlock (TCRYPT: the header search) ─► Unlocked
//!    --link-vk-to-keyring: the volume key added to a kernel keyring
//! ```
//!
//! Errors are the library's; their [`crate::ErrorKind`] is what cryptsetup's exit code
//! says (a wrong passphrase is [`crate::ErrorKind::Permission`]).

mod inputs;
pub mod token;

pub use crate::prompt::{with_retries, Prompt, Step};
pub use crate::secret::{read_key, read_key_file, Secret, MAX_KEY_FILE};
pub use inputs::{
    existing, query_pim, question, read_key_input, KeyFile, PlainInputs, TcryptInputs,
};
pub use token::Tokens;

use crate::error::{Error, ErrorKind, Result};
use crate::header::{HeaderOptions, Unlocked, VolumeType};
use crate::keyring::KeyringLink;
use std::path::PathBuf;
use ucrypt_format::tcrypt::TcryptOptions;

/// What to unlock and with what: cryptsetup's options of `open`.
#[derive(Debug, Clone)]
pub struct Request {
    /// The device (a path or an NBD URI), as the user named it.
    pub device: PathBuf,
    /// A detached header (`--header`).
    pub header: Option<PathBuf>,
    /// The type (`--type`); none: LUKS with a detached header, else detected (LUKS,
    /// BitLocker or FileVault2 by their signatures).
    pub kind: Option<VolumeType>,
    /// Where the passphrase comes from (TCRYPT: key files, see [`TcryptInputs`]).
    pub key: KeyFile,
    /// Only this keyslot (`--key-slot`).
    pub key_slot: Option<u32>,
    /// Open with the volume key in this file instead (`--volume-key-file`, LUKS only).
    pub volume_key_file: Option<PathBuf>,
    /// Which LUKS2 tokens to try first.
    pub tokens: Tokens,
    /// Plain-mode and loop-AES options; TCRYPT's hash and cipher hints.
    pub plain: PlainInputs,
    /// TCRYPT options.
    pub tcrypt: TcryptInputs,
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// INSECURE: accept `cipher_null` keyslots or data (`--insecure-allow-null-cipher`).
    pub allow_null_cipher: bool,
    /// How often a typed passphrase is asked for (`--tries`; a key file or a script is
    /// tried once, see [`Prompt::interactive`]).
    pub tries: u32,
    /// Only check the passphrase (`--test-passphrase`): the outcome is
    /// [`Outcome::Checked`] unless `volume_wanted`.
    pub test_passphrase: bool,
    /// With `test_passphrase`: the caller wants the unlocked volume too (`luksOpen
    /// --print-table`), so the passphrase is checked by unlocking.
    pub volume_wanted: bool,
    /// With `test_passphrase`: the passphrase may open an unbound LUKS2 keyslot
    /// (`--unbound`; LUKS only).
    pub unbound: bool,
    /// Derive under cryptsetup's global memory-hard PBKDF lock
    /// (`--serialize-memory-hard-pbkdf`).
    pub serialize_memory_hard_pbkdf: bool,
    /// Add the unlocked volume key to a kernel keyring (`--link-vk-to-keyring
    /// KEYRING::KEY`).
    pub link_vk_to_keyring: Option<String>,
    /// A crashed LUKS2 reencryption hotzone may be recovered first (a read-write open
    /// that holds the image lock; never with `test_passphrase`).
    pub recover_reencryption: bool,
}

impl Request {
    /// A request for `device` with cryptsetup's defaults (type detected, a passphrase asked
    /// for up to 3 times).
    pub fn new(device: impl Into<PathBuf>) -> Request {
        Request {
            device: device.into(),
            header: None,
            kind: None,
            key: KeyFile::default(),
            key_slot: None,
            volume_key_file: None,
            tokens: Tokens::default(),
            plain: PlainInputs::default(),
            tcrypt: TcryptInputs::default(),
            allow_discards: false,
            allow_null_cipher: false,
            tries: 3,
            test_passphrase: false,
            volume_wanted: false,
            unbound: false,
            serialize_memory_hard_pbkdf: false,
            link_vk_to_keyring: None,
            recover_reencryption: false,
        }
    }
}

/// What an unlock gives.
#[derive(Debug)]
pub enum Outcome {
    /// `--test-passphrase`: the passphrase (or token, or volume key) checked out.
    Checked,
    /// The volume, and the header options that unlock it again (resume, resize, refresh).
    Unlocked(Box<Unlocked>, Box<HeaderOptions>),
}

/// cryptsetup's memory-hard PBKDF lock: libcryptsetup flocks this file (`crypt_write_lock`
/// on resource `memory-hard-access` in its lock directory).
const SERIALIZE_LOCK: &str = "/run/cryptsetup/memory-hard-access";

/// Held while a passphrase is derived; the lock goes with the file when dropped.
struct SerializeLock(#[allow(dead_code)] Option<std::fs::File>);

impl Request {
    /// The type to unlock as: `kind`, else LUKS with a detached header, else detected.
    pub fn volume_type(&self) -> VolumeType {
        match (self.kind, &self.header) {
            (Some(k), _) => k,
            (None, None) => crate::header::detect_type(&self.device),
            (None, Some(_)) => VolumeType::Luks,
        }
    }

    /// The type ([`Request::volume_type`]) after the checks of the options against it:
    /// `--unbound` is for LUKS only, and plain-mode options only for the types that use
    /// them ([`PlainInputs::check_kind`]). [`Request::unlock`] checks the same first.
    ///
    /// # Errors
    /// An option the type has no use for, with cryptsetup's message.
    pub fn check(&self) -> Result<VolumeType> {
        use VolumeType::{Luks, Luks1, Luks2};
        let kind = self.volume_type();
        if self.unbound && !matches!(kind, Luks | Luks1 | Luks2) {
            return Err(Error::Invalid(
                "option --unbound is allowed only for open of LUKS devices".into(),
            ));
        }
        self.plain.check_kind(kind, self.test_passphrase)?;
        Ok(kind)
    }

    /// Unlocks the volume: see the module documentation for the order. A wrong passphrase
    /// typed by someone ([`Prompt::interactive`], no key file) is asked for again, `tries`
    /// times in all, each retry after the notice "No key available with this passphrase.".
    ///
    /// # Errors
    /// The last attempt's: a wrong passphrase ([`ErrorKind::Permission`]), a refused
    /// option, header or device, what the prompt failed with.
    pub fn unlock(&self, prompt: &mut dyn Prompt) -> Result<Outcome> {
        with_retries(prompt, self.tries, self.key.path.is_none(), |p| {
            self.attempt(p)
        })
    }

    /// One attempt of [`Request::unlock`].
    fn attempt(&self, prompt: &mut dyn Prompt) -> Result<Outcome> {
        let kind = self.check()?;
        self.refuse_unsigned(kind)?;
        if let Some(file) = &self.volume_key_file {
            let hopts = HeaderOptions {
                kind,
                header: self.header.clone(),
                plain: self.plain.options(),
                loopaes: self.plain.loopaes_options(),
                allow_discards: self.allow_discards,
                allow_null_cipher: self.allow_null_cipher,
                ..HeaderOptions::default()
            };
            // The whole file; its length must be the header's key size (checked on unlock).
            let vk = read_key_input(file, 0, 0, prompt)?;
            let unlocked = {
                let _busy = prompt.busy(Step::VolumeKey);
                crate::header::unlock_by_volume_key(&self.device, &vk, &hopts)?
            };
            drop(vk);
            return self.finish(unlocked, hopts, prompt);
        }
        if kind != VolumeType::Tcrypt && kind != VolumeType::Plain {
            let mut tokens = self.tokens.clone();
            tokens.pin_tries = self.tries;
            // Under --token-only the key file has no passphrase to give: it holds the PIN.
            if tokens.only && tokens.pin_file.is_none() && self.key.path.is_some() {
                tokens.pin_file = Some(self.key.clone());
            }
            let key =
                token::volume_key(&self.device, self.header.as_deref(), kind, &tokens, prompt)?;
            if let Some(vk) = key {
                let hopts = HeaderOptions {
                    kind,
                    header: self.header.clone(),
                    allow_discards: self.allow_discards,
                    allow_null_cipher: self.allow_null_cipher,
                    ..HeaderOptions::default()
                };
                let unlocked =
                    crate::header::unlock_by_volume_key(&self.device, vk.as_bytes(), &hopts)?;
                return self.finish(unlocked, hopts, prompt);
            }
        }
        let (mut hopts, secret) = if kind == VolumeType::Tcrypt {
            self.tcrypt_inputs(prompt)?
        } else {
            self.inputs(kind, prompt)?
        };
        hopts.allow_null_cipher = self.allow_null_cipher;
        hopts.recover_reencryption = self.recover_reencryption && !self.test_passphrase;
        if self.test_passphrase
            && !self.volume_wanted
            && self.link_vk_to_keyring.is_none()
            && !matches!(kind, VolumeType::Plain | VolumeType::Tcrypt)
            && !crate::remote_header::is_remote(&self.device)
        {
            // The passphrase check alone, exactly as `cryptsetup open --test-passphrase`.
            let mut cd = token::load(&self.device, self.header.as_deref(), kind)?.cd;
            let info = cd.info();
            crate::header::check_luks_ciphers(&mut cd, &info, hopts.allow_null_cipher)?;
            let _lock = self.serialize(prompt)?;
            // cryptsetup: an explicit keyslot or --unbound may be an unbound one.
            let unbound = self.key_slot.is_some() || self.unbound;
            let _busy = prompt.busy(Step::Passphrase);
            cd.check_passphrase_allowing(self.key_slot, &secret, unbound)?;
            return Ok(Outcome::Checked);
        }
        let lock = self.serialize(prompt)?;
        let unlocked = {
            let _busy = prompt.busy(Step::unlocking(kind));
            crate::header::unlock(&self.device, &secret, &hopts)?
        };
        drop(lock);
        drop(secret);
        self.finish(unlocked, hopts, prompt)
    }

    /// No `--type`, no detached header and no signature on a local device: says what to
    /// add before asking for a passphrase that could not help (cryptsetup only says "not a
    /// valid LUKS device"). A device that cannot be read is a device error, not a missing
    /// signature: no `--type` would help.
    fn refuse_unsigned(&self, kind: VolumeType) -> Result<()> {
        let probe = self.kind.is_none()
            && self.header.is_none()
            && kind == VolumeType::Luks
            && !crate::remote_header::is_remote(&self.device);
        if !probe {
            return Ok(());
        }
        let Ok(f) = std::fs::File::open(&self.device) else {
            return Ok(());
        };
        let mut first = [0u8; 4096];
        if let Err(e) = std::os::unix::fs::FileExt::read_at(&f, &mut first, 0) {
            return Err(Error::Invalid(format!(
                "cannot read the header of {}: {e}",
                self.device.display()
            ))
            .with_kind(ErrorKind::Device));
        }
        if token::load(&self.device, None, VolumeType::Luks).is_err() {
            return Err(Error::Invalid(format!(
                "{} is not a LUKS, BitLocker or FileVault2 volume (no signature found); a \
                 TrueCrypt/VeraCrypt volume needs --type tcrypt, plain dm-crypt --type plain",
                self.device.display()
            )));
        }
        Ok(())
    }

    /// The volume unlocked: linked to the keyring if asked, and given back unless only
    /// the passphrase was to be tested.
    fn finish(
        &self,
        unlocked: Unlocked,
        hopts: HeaderOptions,
        prompt: &mut dyn Prompt,
    ) -> Result<Outcome> {
        if let Some(spec) = &self.link_vk_to_keyring {
            let link = KeyringLink::parse(spec)?;
            let id = link.add_unlocked(&unlocked)?;
            prompt.debug(&format!(
                "Volume key linked to keyring {} as {}:{} (key id {id}).",
                link.keyring, link.key_type, link.description
            ));
        }
        if self.test_passphrase && !self.volume_wanted {
            return Ok(Outcome::Checked);
        }
        Ok(Outcome::Unlocked(Box::new(unlocked), Box::new(hopts)))
    }

    /// The header options and the secret for a type other than TCRYPT, read the way
    /// cryptsetup reads them: plain mode takes a key file other than standard input as
    /// the raw key (exactly key-size bytes from the offset; `--hash` and `--keyfile-size`
    /// do not apply); loop-AES keys are a key file's lines, never a typed passphrase.
    fn inputs(&self, kind: VolumeType, prompt: &mut dyn Prompt) -> Result<(HeaderOptions, Secret)> {
        let mut hopts = HeaderOptions {
            kind,
            header: self.header.clone(),
            key_slot: self.key_slot,
            plain: self.plain.options(),
            loopaes: self.plain.loopaes_options(),
            allow_discards: self.allow_discards,
            ..HeaderOptions::default()
        };
        let key = &self.key;
        let secret = match kind {
            VolumeType::Plain => match key.path.as_deref().filter(|p| p.as_os_str() != "-") {
                Some(p) => {
                    hopts.plain_raw_key = true;
                    let bytes = hopts.plain.key_bytes()?;
                    read_key_file(p, key.offset, bytes as u64)?
                }
                None => existing(key, &question(&self.device), prompt)?,
            },
            VolumeType::Loopaes => {
                let Some(p) = key.path.as_deref() else {
                    return Err(Error::Invalid(
                        "loop-AES volumes open with --key-file (their key file's lines are the \
                         keys; `--key-file -` reads standard input, e.g. from `gpg --decrypt \
                         KEYFILE`)"
                            .into(),
                    ));
                };
                read_key_input(p, key.offset, key.size, prompt)?
            }
            _ => existing(key, &question(&self.device), prompt)?,
        };
        Ok((hopts, secret))
    }

    /// The header options and the passphrase of a TCRYPT device: the key file (unless it
    /// is `-`, which gives the passphrase) and `tcrypt.key_files` are TrueCrypt key files;
    /// the passphrase is asked for, then the PIM if `query_pim`; the plain-mode `hash` and
    /// `cipher` are search hints (substrings of the KDF hash and of the cipher chain).
    ///
    /// # Errors
    /// As [`existing`] and [`query_pim`].
    pub fn tcrypt_inputs(&self, prompt: &mut dyn Prompt) -> Result<(HeaderOptions, Secret)> {
        let t = &self.tcrypt;
        let mut key_files = Vec::new();
        let mut pass_from_stdin = false;
        match self.key.path.as_deref() {
            Some(p) if p.as_os_str() == "-" => pass_from_stdin = true,
            Some(p) => key_files.push(p.to_path_buf()),
            None => {}
        }
        key_files.extend(t.key_files.iter().cloned());
        let pass = KeyFile {
            path: pass_from_stdin.then(|| PathBuf::from("-")),
            ..KeyFile::default()
        };
        let mut secret = existing(&pass, &question(&self.device), prompt)?;
        if pass_from_stdin && secret.last() == Some(&b'\n') {
            secret.pop();
        }
        let pim = if t.query_pim {
            Some(query_pim(prompt)?)
        } else {
            t.pim.filter(|&p| p != 0)
        };
        let hopts = HeaderOptions {
            kind: VolumeType::Tcrypt,
            header: self.header.clone(),
            allow_discards: self.allow_discards,
            tcrypt: TcryptOptions {
                veracrypt: t.veracrypt,
                pim,
                hidden: t.hidden,
                system: t.system,
                backup: t.backup,
                hash: self.plain.hash.clone(),
                cipher: self.plain.cipher.clone(),
                key_files,
                progress: prompt.tcrypt_progress(&self.device),
            },
            ..HeaderOptions::default()
        };
        Ok((hopts, secret))
    }

    /// With `serialize_memory_hard_pbkdf`: waits for and takes cryptsetup's global lock.
    ///
    /// # Errors
    /// The lock file cannot be created or locked (cryptsetup's "Failed to acquire global
    /// memory-hard access serialization lock").
    fn serialize(&self, prompt: &mut dyn Prompt) -> Result<SerializeLock> {
        if !self.serialize_memory_hard_pbkdf {
            return Ok(SerializeLock(None));
        }
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let file = std::fs::create_dir_all("/run/cryptsetup")
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(SERIALIZE_LOCK)
            })
            .and_then(|f| {
                prompt.debug(&format!(
                    "Taking global memory-hard access serialization lock {SERIALIZE_LOCK}."
                ));
                // SAFETY: flock on a descriptor this function owns.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    Ok(f)
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
            .map_err(|e| {
                Error::Invalid(format!(
                    "failed to acquire the global memory-hard access serialization lock \
                     {SERIALIZE_LOCK}: {e}"
                ))
            })?;
        Ok(SerializeLock(Some(file)))
    }
}
