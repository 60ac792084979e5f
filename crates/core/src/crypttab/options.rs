//! The fourth field: crypttab(5)'s options, each honoured (mapped onto what `ucrypt open`
//! does) or refused by name with the reason. Nothing is ignored: an option that would not
//! do what the line says is an error, not a silent difference.

use super::device::DeviceSpec;
use crate::VolumeType;
use std::path::PathBuf;
use std::time::Duration;

/// How the opened volume is served (`x-ucrypt-device=`; `open --device`).
pub use crate::instance::frontend::FrontendKind as Frontend;

/// A security-device option (`tpm2-device=`, `fido2-device=`, `pkcs11-uri=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDevice {
    /// Not given.
    Unset,
    /// `auto`: the token's plugin finds the device.
    Auto,
}

/// The tokens a line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOptions {
    /// `tpm2-device=auto`: `systemd-tpm2` tokens.
    pub tpm2: TokenDevice,
    /// `fido2-device=auto`: `systemd-fido2` tokens.
    pub fido2: TokenDevice,
    /// `pkcs11-uri=auto`: `systemd-pkcs11` tokens.
    pub pkcs11: TokenDevice,
    /// `token-timeout=`: how long to wait for a security device to appear.
    pub timeout: Option<Duration>,
}

/// systemd-cryptsetup's `token-timeout=` when a line names a security device but no timeout.
pub const DEFAULT_TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

impl TokenOptions {
    /// How long `open` waits for the security devices the line names (`--token-timeout`):
    /// `token-timeout=`, else systemd's 30 s when a device is named, else none.
    pub fn wait(&self) -> Option<Duration> {
        let named = [self.tpm2, self.fido2, self.pkcs11]
            .iter()
            .any(|d| *d != TokenDevice::Unset);
        self.timeout
            .or_else(|| named.then_some(DEFAULT_TOKEN_TIMEOUT))
    }
}

impl Default for TokenOptions {
    fn default() -> Self {
        TokenOptions {
            tpm2: TokenDevice::Unset,
            fido2: TokenDevice::Unset,
            pkcs11: TokenDevice::Unset,
            timeout: None,
        }
    }
}

impl TokenOptions {
    /// The one token type to try when the line names exactly one kind of security device
    /// (as systemd-cryptsetup tries only that kind); none when it names none (every token
    /// is tried, then the passphrase) or several.
    pub fn only_type(&self) -> Option<&'static str> {
        let named: Vec<&'static str> = [
            (self.tpm2, "systemd-tpm2"),
            (self.fido2, "systemd-fido2"),
            (self.pkcs11, "systemd-pkcs11"),
        ]
        .into_iter()
        .filter(|(d, _)| *d == TokenDevice::Auto)
        .map(|(_, t)| t)
        .collect();
        match named.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// The options of one crypttab line, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `luks`, `plain`, `tcrypt`, `bitlk`, `fvault2`; none: detected (LUKS, BitLocker,
    /// FileVault2 by their signatures).
    pub kind: Option<VolumeType>,
    /// `header=`: a detached header.
    pub header: Option<DeviceSpec>,
    /// `keyfile-offset=` (bytes).
    pub keyfile_offset: u64,
    /// `keyfile-size=` (bytes; 0: all).
    pub keyfile_size: u64,
    /// `key-slot=`.
    pub key_slot: Option<u32>,
    /// `tries=` (default 3; `tries=0` is "until right", here `u32::MAX`).
    pub tries: u32,
    /// `timeout=`: how long a passphrase prompt waits (seconds, rounded up; none: forever).
    pub timeout_secs: Option<u32>,
    /// `readonly`, `read-only`.
    pub read_only: bool,
    /// `discard`.
    pub discard: bool,
    /// `sector-size=` (plain mode).
    pub sector_size: Option<u32>,
    /// `cipher=` (plain mode; a TCRYPT search hint).
    pub cipher: Option<String>,
    /// `size=`: the key size in bits (plain mode).
    pub key_size: Option<u32>,
    /// `hash=` (plain mode; a TCRYPT search hint).
    pub hash: Option<String>,
    /// `offset=` (plain mode: data start in 512-byte sectors).
    pub offset: Option<u64>,
    /// `skip=` (plain mode: IV offset in 512-byte sectors).
    pub skip: Option<u64>,
    /// `tcrypt-hidden`.
    pub tcrypt_hidden: bool,
    /// `tcrypt-system`.
    pub tcrypt_system: bool,
    /// `tcrypt-veracrypt` (ucrypt tries VeraCrypt headers anyway; accepted as a no-op that
    /// says the same).
    pub tcrypt_veracrypt: bool,
    /// `veracrypt-pim=`.
    pub veracrypt_pim: Option<u32>,
    /// `tcrypt-keyfile=` (repeatable).
    pub tcrypt_keyfiles: Vec<PathBuf>,
    /// `same-cpu-crypt`, `submit-from-crypt-cpus`, `no-read-workqueue`,
    /// `no-write-workqueue`: the engine's dm-crypt flags.
    pub same_cpu_crypt: bool,
    /// See `same_cpu_crypt`.
    pub submit_from_crypt_cpus: bool,
    /// See `same_cpu_crypt`.
    pub no_read_workqueue: bool,
    /// See `same_cpu_crypt`.
    pub no_write_workqueue: bool,
    /// Security-device tokens.
    pub tokens: TokenOptions,
    /// `headless`: never ask for a passphrase (tokens and key files only).
    pub headless: bool,
    /// `nofail`: boot goes on if the volume does not open.
    pub nofail: bool,
    /// `noauto`: not opened at boot, nor by `crypttab open` without names.
    pub noauto: bool,
    /// `_netdev`: the device is on the network (ordered after the network).
    pub netdev: bool,
    /// `x-systemd.device-timeout=`: how long boot waits for the device.
    pub device_timeout: Option<Duration>,
    /// `x-ucrypt-device=`: the front end (default: `ucrypt open`'s automatic choice).
    pub frontend: Option<Frontend>,
    /// `x-ucrypt-ublk-poll=USECS`: ublk's hybrid polling (`open --ublk-poll`).
    pub ublk_poll: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kind: None,
            header: None,
            keyfile_offset: 0,
            keyfile_size: 0,
            key_slot: None,
            tries: 3,
            timeout_secs: None,
            read_only: false,
            discard: false,
            sector_size: None,
            cipher: None,
            key_size: None,
            hash: None,
            offset: None,
            skip: None,
            tcrypt_hidden: false,
            tcrypt_system: false,
            tcrypt_veracrypt: false,
            veracrypt_pim: None,
            tcrypt_keyfiles: Vec::new(),
            same_cpu_crypt: false,
            submit_from_crypt_cpus: false,
            no_read_workqueue: false,
            no_write_workqueue: false,
            tokens: TokenOptions::default(),
            headless: false,
            nofail: false,
            noauto: false,
            netdev: false,
            device_timeout: None,
            frontend: None,
            ublk_poll: None,
        }
    }
}

/// Options crypttab(5) defines that ucrypt does not do, with the reason.
const REFUSED: &[(&str, &str)] = &[
    (
        "swap",
        "ucrypt does not run mkswap on the opened volume; open it and run mkswap yourself",
    ),
    (
        "tmp",
        "ucrypt does not run mkfs on the opened volume; open it and run mkfs yourself",
    ),
    (
        "verify",
        "passphrases are asked once at open; verification is for new passphrases",
    ),
    ("password-echo", "ucrypt never echoes a passphrase"),
    ("keyfile-erase", "ucrypt does not erase key files"),
    (
        "keyfile-timeout",
        "ucrypt does not wait for a key file's device to appear",
    ),
    (
        "tpm2-pcrs",
        "the PCRs are in the systemd-tpm2 token, which its plugin reads",
    ),
    (
        "tpm2-pin",
        "the systemd-tpm2 token says whether it needs a PIN",
    ),
    (
        "tpm2-signature",
        "PCR signatures are the systemd-tpm2 plugin's, set at enrolment",
    ),
    (
        "tpm2-pcrlock",
        "pcrlock policies are the systemd-tpm2 plugin's, set at enrolment",
    ),
    (
        "tpm2-measure-pcr",
        "ucrypt does not measure volume keys into a PCR",
    ),
    (
        "tpm2-measure-bank",
        "ucrypt does not measure volume keys into a PCR",
    ),
    (
        "fido2-cid",
        "FIDO2 credentials are read from the systemd-fido2 token",
    ),
    (
        "fido2-rp",
        "the FIDO2 relying party is read from the systemd-fido2 token",
    ),
    (
        "try-empty-password",
        "ucrypt does not try an empty passphrase on its own",
    ),
    ("x-initrd.attach", "ucrypt is not part of the initrd"),
    (
        "link-volume-key",
        "use `ucrypt open --link-vk-to-keyring` by hand",
    ),
    ("silent", "ucrypt does not suppress its prompts"),
    (
        "loopaes",
        "crypttab has no loop-AES mode (its key files need `ucrypt loopaesOpen`)",
    ),
    (
        "luks1",
        "crypttab's mode is `luks` (the version is read from the header)",
    ),
    (
        "luks2",
        "crypttab's mode is `luks` (the version is read from the header)",
    ),
    (
        "integrity",
        "dm-integrity under dm-crypt is not supported by ucrypt yet",
    ),
];

/// What went wrong with one option.
pub(super) fn parse(items: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut kinds: Vec<&str> = Vec::new();
    for item in items {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item.as_str(), None),
        };
        let need = || value.ok_or_else(|| format!("option {key} needs a value ({key}=...)"));
        let flag = |o: &str| -> Result<bool, String> {
            match value {
                None => Ok(true),
                Some(v) => parse_bool(v).ok_or_else(|| format!("{o}={v}: not a boolean")),
            }
        };
        match key {
            "luks" | "plain" | "tcrypt" | "bitlk" | "fvault2" if value.is_none() => {
                kinds.push(key);
                o.kind = Some(key.parse().expect("a known type name"));
            }
            "header" => {
                o.header = Some(DeviceSpec::parse(need()?).map_err(|e| format!("header=: {e}"))?);
            }
            "keyfile-offset" => o.keyfile_offset = number(key, need()?)?,
            "keyfile-size" => o.keyfile_size = number(key, need()?)?,
            "key-slot" | "keyslot" => o.key_slot = Some(number(key, need()?)?),
            "tries" => {
                let n: u32 = number(key, need()?)?;
                o.tries = if n == 0 { u32::MAX } else { n };
            }
            "timeout" => {
                let d = duration(key, need()?)?;
                o.timeout_secs = (!d.is_zero())
                    .then(|| u32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)))
                    .transpose()
                    .map_err(|_| format!("timeout={}: too long", need().unwrap_or("")))?;
            }
            "readonly" | "read-only" => o.read_only = flag(key)?,
            "discard" => o.discard = flag(key)?,
            "sector-size" => o.sector_size = Some(number(key, need()?)?),
            "cipher" => o.cipher = Some(nonempty(key, need()?)?),
            "size" => o.key_size = Some(number(key, need()?)?),
            "hash" => o.hash = Some(nonempty(key, need()?)?),
            "offset" => o.offset = Some(number(key, need()?)?),
            "skip" => o.skip = Some(number(key, need()?)?),
            "tcrypt-hidden" => o.tcrypt_hidden = flag(key)?,
            "tcrypt-system" => o.tcrypt_system = flag(key)?,
            "tcrypt-veracrypt" => o.tcrypt_veracrypt = flag(key)?,
            "veracrypt-pim" => o.veracrypt_pim = Some(number(key, need()?)?),
            "tcrypt-keyfile" => o
                .tcrypt_keyfiles
                .push(PathBuf::from(nonempty(key, need()?)?)),
            "same-cpu-crypt" => o.same_cpu_crypt = flag(key)?,
            "submit-from-crypt-cpus" => o.submit_from_crypt_cpus = flag(key)?,
            "no-read-workqueue" => o.no_read_workqueue = flag(key)?,
            "no-write-workqueue" => o.no_write_workqueue = flag(key)?,
            "tpm2-device" => o.tokens.tpm2 = token_device(key, need()?, "systemd-tpm2")?,
            "fido2-device" => o.tokens.fido2 = token_device(key, need()?, "systemd-fido2")?,
            "pkcs11-uri" => o.tokens.pkcs11 = token_device(key, need()?, "systemd-pkcs11")?,
            "token-timeout" => o.tokens.timeout = Some(duration(key, need()?)?),
            "headless" => o.headless = flag(key)?,
            "nofail" if value.is_none() => o.nofail = true,
            "fail" if value.is_none() => o.nofail = false,
            "noauto" if value.is_none() => o.noauto = true,
            "auto" if value.is_none() => o.noauto = false,
            "_netdev" if value.is_none() => o.netdev = true,
            "x-systemd.device-timeout" => o.device_timeout = Some(duration(key, need()?)?),
            "x-ucrypt-device" => o.frontend = Some(frontend(need()?)?),
            "x-ucrypt-ublk-poll" => {
                let v = need()?;
                let us: u32 = number(key, v)?;
                if !(1..=100_000).contains(&us) {
                    return Err(format!(
                        "{key}={v}: microseconds out of range (1 to 100000)"
                    ));
                }
                o.ublk_poll = Some(us);
            }
            _ => {
                if let Some((_, why)) = REFUSED.iter().find(|(name, _)| *name == key) {
                    return Err(format!("option {item} is not supported: {why}"));
                }
                return Err(format!("unknown option {item}"));
            }
        }
    }
    if kinds.len() > 1 {
        return Err(format!(
            "options {} name more than one volume type",
            kinds.join(", ")
        ));
    }
    check(&o)?;
    if o.ublk_poll.is_some() && o.frontend.is_some_and(|f| f != Frontend::Ublk) {
        return Err(
            "option x-ucrypt-ublk-poll= needs x-ucrypt-device=ublk (or no x-ucrypt-device=)".into(),
        );
    }
    Ok(o)
}

/// The options that only some types have a use for, refused on the others (the unlock
/// would refuse them later; here they are refused when the file is read, naming the
/// crypttab option).
fn check(o: &Options) -> Result<(), String> {
    let kind = o.kind;
    let plain = kind == Some(VolumeType::Plain);
    let tcrypt = kind == Some(VolumeType::Tcrypt);
    let plain_only = [
        ("sector-size", o.sector_size.is_some()),
        ("size", o.key_size.is_some()),
        ("offset", o.offset.is_some()),
        ("skip", o.skip.is_some()),
    ];
    for (name, given) in plain_only {
        if given && !plain {
            return Err(mode_message(name, kind, "plain"));
        }
    }
    for (name, given) in [("cipher", o.cipher.is_some()), ("hash", o.hash.is_some())] {
        if given && !plain && !tcrypt {
            return Err(mode_message(
                name,
                kind,
                "plain (or tcrypt, as a search hint)",
            ));
        }
    }
    let tcrypt_only = [
        ("tcrypt-hidden", o.tcrypt_hidden),
        ("tcrypt-system", o.tcrypt_system),
        ("tcrypt-veracrypt", o.tcrypt_veracrypt),
        ("veracrypt-pim", o.veracrypt_pim.is_some()),
        ("tcrypt-keyfile", !o.tcrypt_keyfiles.is_empty()),
    ];
    for (name, given) in tcrypt_only {
        if given && !tcrypt {
            return Err(mode_message(name, kind, "tcrypt"));
        }
    }
    let luks_only = [
        ("header", o.header.is_some()),
        ("key-slot", o.key_slot.is_some()),
        ("tpm2-device", o.tokens.tpm2 != TokenDevice::Unset),
        ("fido2-device", o.tokens.fido2 != TokenDevice::Unset),
        ("pkcs11-uri", o.tokens.pkcs11 != TokenDevice::Unset),
    ];
    for (name, given) in luks_only {
        if given && !matches!(kind, None | Some(VolumeType::Luks)) {
            let what = if name == "header" {
                "luks (a detached LUKS header)"
            } else {
                "luks (LUKS2 keyslots and tokens)"
            };
            return Err(mode_message(name, kind, what));
        }
    }
    Ok(())
}

/// "option X is for MODE volumes; this line ..."
fn mode_message(name: &str, kind: Option<VolumeType>, modes: &str) -> String {
    let this = match kind {
        None => "this line names no type (add the type to the options)".to_string(),
        Some(k) => format!("this line is {}", type_name(k)),
    };
    format!("option {name}= is for {modes} volumes; {this}")
}

/// The crypttab option that names `k`.
pub fn type_name(k: VolumeType) -> &'static str {
    match k {
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2 => "luks",
        VolumeType::Plain => "plain",
        VolumeType::Bitlk => "bitlk",
        VolumeType::Fvault2 => "fvault2",
        VolumeType::Tcrypt => "tcrypt",
        VolumeType::Loopaes => "loopaes",
    }
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{key}={v}: not a number in range"))
}

fn nonempty(key: &str, v: &str) -> Result<String, String> {
    if v.is_empty() {
        return Err(format!("option {key}= is empty"));
    }
    Ok(v.to_string())
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

fn token_device(key: &str, v: &str, token: &str) -> Result<TokenDevice, String> {
    match v {
        "auto" => Ok(TokenDevice::Auto),
        "" => Err(format!("option {key}= is empty")),
        _ => Err(format!(
            "option {key}={v} is not supported: libcryptsetup's {token} token plugin finds the \
             device (or URI) from the token itself; write {key}=auto"
        )),
    }
}

fn frontend(v: &str) -> Result<Frontend, String> {
    Frontend::from_name(v).ok_or_else(|| {
        format!(
            "x-ucrypt-device={v}: unknown front end (ublk, nbd, fuse, vduse, vhost-user or none)"
        )
    })
}

/// A systemd time span: a number with an optional unit (`us`, `ms`, `s`, `sec`, `m`,
/// `min`, `h`, `hr`, `d`; none: seconds), several summed (`1min 30s`), `infinity`
/// refused (use no option).
fn duration(key: &str, v: &str) -> Result<Duration, String> {
    let bad = || format!("{key}={v}: not a time span (e.g. 30, 30s, 2min, 500ms)");
    let mut total = Duration::ZERO;
    let mut rest = v.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(digits);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "us" | "usec" => 1e-6,
            "ms" | "msec" => 1e-3,
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            _ => return Err(bad()),
        };
        total += Duration::try_from_secs_f64(n * scale).map_err(|_| bad())?;
        rest = tail.trim_start();
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Options, String> {
        parse(&super::super::words::options(s))
    }

    #[test]
    fn time_spans() {
        assert_eq!(duration("t", "30").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("t", "2min").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("t", "1min 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(duration("t", "500ms").unwrap(), Duration::from_millis(500));
        assert!(duration("t", "soon").is_err());
        assert!(duration("t", "").is_err());
    }

    #[test]
    fn every_option_honoured() {
        let o = p(
            "plain,cipher=aes-xts-plain64,size=512,hash=sha512,offset=8,skip=16,\
                   sector-size=4096,keyfile-offset=3,keyfile-size=64,tries=0,timeout=1min,\
                   readonly,discard,same-cpu-crypt,submit-from-crypt-cpus,no-read-workqueue,\
                   no-write-workqueue,headless,nofail,noauto,_netdev,\
                   x-systemd.device-timeout=10s,x-ucrypt-device=nbd",
        )
        .unwrap();
        assert_eq!(o.kind, Some(VolumeType::Plain));
        assert_eq!(o.cipher.as_deref(), Some("aes-xts-plain64"));
        assert_eq!(o.key_size, Some(512));
        assert_eq!(o.hash.as_deref(), Some("sha512"));
        assert_eq!(
            (o.offset, o.skip, o.sector_size),
            (Some(8), Some(16), Some(4096))
        );
        assert_eq!((o.keyfile_offset, o.keyfile_size), (3, 64));
        assert_eq!(o.tries, u32::MAX);
        assert_eq!(o.timeout_secs, Some(60));
        assert!(o.read_only && o.discard && o.headless && o.nofail && o.noauto && o.netdev);
        assert!(o.same_cpu_crypt && o.submit_from_crypt_cpus);
        assert!(o.no_read_workqueue && o.no_write_workqueue);
        assert_eq!(o.device_timeout, Some(Duration::from_secs(10)));
        assert_eq!(o.frontend, Some(Frontend::Nbd));

        let l = p(
            "luks,header=UUID=42,key-slot=1,tpm2-device=auto,token-timeout=0,\
                   read-only=false,headless=no,x-ucrypt-device=ublk",
        )
        .unwrap();
        assert_eq!(l.kind, Some(VolumeType::Luks));
        assert_eq!(l.header, Some(DeviceSpec::Uuid("42".into())));
        assert_eq!(l.key_slot, Some(1));
        assert_eq!(l.tokens.only_type(), Some("systemd-tpm2"));
        assert_eq!(l.tokens.timeout, Some(Duration::ZERO));
        assert_eq!(l.tokens.wait(), Some(Duration::ZERO));
        // systemd's default wait for a named device; none without one.
        assert_eq!(
            p("tpm2-device=auto").unwrap().tokens.wait(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            p("token-timeout=5s").unwrap().tokens.wait(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(p("luks").unwrap().tokens.wait(), None);
        assert!(!l.read_only && !l.headless);
        assert_eq!(l.frontend, Some(Frontend::Ublk));
        assert_eq!(
            p("x-ucrypt-device=vhost-user").unwrap().frontend,
            Some(Frontend::VhostUser)
        );
        let two = p("fido2-device=auto,pkcs11-uri=auto").unwrap();
        assert_eq!(two.kind, None);
        assert_eq!(two.tokens.only_type(), None);
        assert_eq!(
            p("pkcs11-uri=auto").unwrap().tokens.only_type(),
            Some("systemd-pkcs11")
        );

        let t = p(
            "tcrypt,tcrypt-hidden,tcrypt-system,tcrypt-veracrypt,veracrypt-pim=7,\
                   tcrypt-keyfile=/k1,tcrypt-keyfile=/k2,hash=sha512,cipher=aes",
        )
        .unwrap();
        assert!(t.tcrypt_hidden && t.tcrypt_system && t.tcrypt_veracrypt);
        assert_eq!(t.veracrypt_pim, Some(7));
        assert_eq!(
            t.tcrypt_keyfiles,
            [PathBuf::from("/k1"), PathBuf::from("/k2")]
        );
        assert_eq!(p("bitlk").unwrap().kind, Some(VolumeType::Bitlk));
        assert_eq!(p("fvault2").unwrap().kind, Some(VolumeType::Fvault2));
        assert_eq!(
            p("x-ucrypt-device=fuse").unwrap().frontend,
            Some(Frontend::Fuse)
        );
        assert_eq!(
            p("x-ucrypt-device=vduse").unwrap().frontend,
            Some(Frontend::Vduse)
        );
        assert!(p("x-ucrypt-device=vdpa")
            .unwrap_err()
            .contains("unknown front end"));
        assert_eq!(
            p("x-ucrypt-device=ublk,x-ucrypt-ublk-poll=200")
                .unwrap()
                .ublk_poll,
            Some(200)
        );
        assert_eq!(p("x-ucrypt-ublk-poll=1").unwrap().ublk_poll, Some(1));
        assert_eq!(p("").unwrap(), Options::default());
        assert!(!p("noauto,auto").unwrap().noauto);
    }

    #[test]
    fn refusals_name_the_option() {
        let cases = [
            ("swap", "option swap is not supported"),
            ("tmp=ext4", "option tmp=ext4 is not supported"),
            ("luks,bogus", "unknown option bogus"),
            ("x-systemd.after=foo", "unknown option x-systemd.after=foo"),
            (
                "tpm2-device=/dev/tpmrm0",
                "tpm2-device=/dev/tpmrm0 is not supported",
            ),
            (
                "fido2-device=/dev/hidraw0",
                "fido2-device=/dev/hidraw0 is not supported",
            ),
            (
                "pkcs11-uri=pkcs11:token=x",
                "pkcs11-uri=pkcs11:token=x is not supported",
            ),
            ("tpm2-pcrs=7", "option tpm2-pcrs=7 is not supported"),
            ("x-ucrypt-device=loop", "unknown front end"),
            (
                "x-ucrypt-ublk-poll=0",
                "x-ucrypt-ublk-poll=0: microseconds out of range (1 to 100000)",
            ),
            (
                "x-ucrypt-ublk-poll=100001",
                "x-ucrypt-ublk-poll=100001: microseconds out of range",
            ),
            (
                "x-ucrypt-ublk-poll=fast",
                "x-ucrypt-ublk-poll=fast: not a number",
            ),
            (
                "x-ucrypt-ublk-poll",
                "option x-ucrypt-ublk-poll needs a value",
            ),
            (
                "x-ucrypt-device=nbd,x-ucrypt-ublk-poll=50",
                "option x-ucrypt-ublk-poll= needs x-ucrypt-device=ublk",
            ),
            ("luks,plain", "more than one volume type"),
            ("cipher=aes-xts-plain64", "option cipher= is for plain"),
            ("luks,size=256", "option size= is for plain"),
            ("luks,offset=8", "option offset= is for plain"),
            ("bitlk,skip=8", "option skip= is for plain"),
            ("luks,sector-size=4096", "option sector-size= is for plain"),
            ("luks,hash=sha256", "option hash= is for plain"),
            ("plain,header=/h", "option header= is for luks"),
            ("plain,tpm2-device=auto", "option tpm2-device= is for luks"),
            (
                "luks,veracrypt-pim=1",
                "option veracrypt-pim= is for tcrypt",
            ),
            ("tries=x", "tries=x: not a number"),
            ("tries", "option tries needs a value"),
            ("timeout=soon", "timeout=soon: not a time span"),
            ("discard=maybe", "discard=maybe: not a boolean"),
            ("luks1", "option luks1 is not supported"),
            ("loopaes", "option loopaes is not supported"),
            ("luks=1", "unknown option luks=1"),
            ("cipher=", "option cipher= is empty"),
        ];
        for (opts, want) in cases {
            let e = p(opts).unwrap_err();
            assert!(e.contains(want), "{opts}: {e}");
        }
    }
}
