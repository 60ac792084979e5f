//! What rebuilds a running instance's volume when `resume`, `resize` or `refresh` asks
//! for it again: an instance opened from a header takes a volume key from one of its
//! LUKS2 tokens, else its passphrase; one opened from a table line takes that line again.
//! [`secret`] and [`token_key`] decide from the instance's [`Description`] which the caller
//! must give, and refuse the other with the reason; [`resume_with_retries`] decides whether
//! a wrong passphrase is asked for again.

use super::runtime::Description;
use crate::luks::VolumeKey;
use crate::prompt::{with_retries, Prompt};
use crate::unlock::{KeyFile, Tokens};
use crate::{Error, Result, VolumeType};
use std::path::PathBuf;

/// What the caller gives to rebuild the volume when no token did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    /// The table line it was opened from, again.
    Table,
    /// The passphrase (or key file) of the header on `device`.
    Passphrase {
        /// The device the description names (a prompt names it).
        device: PathBuf,
    },
}

/// Which secret instance `name`, described by `desc`, needs; `table_given`: the caller
/// has a table line (`--table`, `--table-file`).
///
/// # Errors
/// [`Error::Invalid`] when the caller has the wrong one: a table line for an instance
/// opened from a header, or none for one opened from a table line.
pub fn secret(desc: &Description, name: &str, table_given: bool) -> Result<Secret> {
    match (table_given, desc.from_header) {
        (true, false) => Ok(Secret::Table),
        (false, true) => Ok(Secret::Passphrase {
            device: PathBuf::from(&desc.device),
        }),
        (true, true) => Err(Error::Invalid(format!(
            "{name} was opened from a header: give its passphrase, not a table line"
        ))),
        (false, false) => Err(Error::Invalid(format!(
            "{name} was opened from a table line: give it again with --table-file"
        ))),
    }
}

/// Where a token may unlock instance `name`'s volume: its device, detached header and
/// type; `None` when tokens do not apply (a table line given, or an instance opened from
/// one).
///
/// # Errors
/// [`Error::Invalid`] for `token_only` (`--token-only`) where tokens do not apply.
fn token_source(
    desc: &Description,
    name: &str,
    table_given: bool,
    token_only: bool,
) -> Result<Option<(PathBuf, Option<PathBuf>, VolumeType)>> {
    if table_given || !desc.from_header {
        if token_only {
            return Err(Error::Invalid(format!(
                "{name} was opened from a table line: --token-only needs a LUKS2 header"
            )));
        }
        return Ok(None);
    }
    // A type that has no tokens ends in the token policy's own refusal (--token-only) or
    // None.
    let kind = desc
        .kind
        .to_ascii_lowercase()
        .parse()
        .unwrap_or(VolumeType::Plain);
    Ok(Some((
        PathBuf::from(&desc.device),
        desc.header.as_ref().map(PathBuf::from),
        kind,
    )))
}

/// The volume key of instance `name`'s volume through one of its LUKS2 tokens (the token
/// policy of `open`: clevis, libcryptsetup's plugins with their PINs), or `None` to go on
/// with [`secret`]. Under `--token-only` the key file (`key_file`) holds a PIN, not a
/// passphrase.
///
/// # Errors
/// [`token_source`]'s refusal, or the token policy's error.
pub fn token_key(
    desc: &Description,
    name: &str,
    table_given: bool,
    mut tokens: Tokens,
    key_file: KeyFile,
    prompt: &mut dyn Prompt,
) -> Result<Option<VolumeKey>> {
    let Some((device, header, kind)) = token_source(desc, name, table_given, tokens.only)? else {
        return Ok(None);
    };
    if tokens.only && key_file.path.is_some() {
        tokens.pin_file = Some(key_file);
    }
    crate::unlock::token::volume_key(&device, header.as_deref(), kind, &tokens, prompt)
}

/// `luksResume`'s retry policy for the secret `attempt` reads and sends: a passphrase
/// someone types (no table line given, no key file) is asked for again after a wrong one,
/// `tries` times in all, while the instance stays suspended; a key file, a pipe or a table
/// line is tried once ([`with_retries`]).
///
/// # Errors
/// The last attempt's error.
pub fn resume_with_retries<T>(
    prompt: &mut dyn Prompt,
    tries: u32,
    table_given: bool,
    key_file: &KeyFile,
    attempt: impl FnMut(&mut dyn Prompt) -> Result<T>,
) -> Result<T> {
    let typed = !table_given && key_file.path.is_none();
    with_retries(prompt, tries, typed, attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(from_header: bool) -> Description {
        Description {
            device: "/img".into(),
            header: Some("/hdr".into()),
            kind: "LUKS2".into(),
            from_header,
            ..Description::default()
        }
    }

    #[test]
    fn a_header_instance_takes_a_passphrase_and_refuses_a_table() {
        let d = described(true);
        assert_eq!(
            secret(&d, "v", false).unwrap(),
            Secret::Passphrase {
                device: "/img".into()
            }
        );
        let e = secret(&d, "v", true).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Invalid);
        assert_eq!(
            e.to_string(),
            "v was opened from a header: give its passphrase, not a table line"
        );
    }

    #[test]
    fn a_table_instance_takes_its_line_again() {
        let d = described(false);
        assert_eq!(secret(&d, "t", true).unwrap(), Secret::Table);
        assert_eq!(
            secret(&d, "t", false).unwrap_err().to_string(),
            "t was opened from a table line: give it again with --table-file"
        );
    }

    #[test]
    fn tokens_apply_to_a_header_instance_only() {
        let (dev, hdr, kind) = token_source(&described(true), "v", false, true)
            .unwrap()
            .unwrap();
        assert_eq!(
            (dev, hdr, kind),
            ("/img".into(), Some("/hdr".into()), VolumeType::Luks2)
        );
        // No tokens: the caller goes on with the secret, unless only tokens were asked for.
        assert!(token_source(&described(true), "v", true, false)
            .unwrap()
            .is_none());
        assert!(token_source(&described(false), "t", false, false)
            .unwrap()
            .is_none());
        for (d, table) in [(described(false), false), (described(true), true)] {
            let e = token_source(&d, "t", table, true).unwrap_err();
            assert_eq!(
                e.to_string(),
                "t was opened from a table line: --token-only needs a LUKS2 header"
            );
        }
    }

    #[test]
    fn an_unknown_type_is_looked_at_as_plain() {
        let d = Description {
            kind: "TABLE".into(),
            ..described(true)
        };
        let (_, _, kind) = token_source(&d, "v", false, false).unwrap().unwrap();
        assert_eq!(kind, VolumeType::Plain);
    }

    /// A terminal: someone types, every passphrase is wrong.
    struct Typing;

    impl Prompt for Typing {
        fn passphrase(&mut self, _prompt: &str) -> Result<crate::secret::Secret> {
            Err(Error::Invalid("unused".into()))
        }

        fn interactive(&self) -> bool {
            true
        }
    }

    #[test]
    fn only_a_typed_passphrase_is_asked_for_again_on_resume() {
        let key_file = |p: Option<&str>| KeyFile {
            path: p.map(PathBuf::from),
            ..KeyFile::default()
        };
        for (table, file, want) in [
            (false, None, 3),
            (true, None, 1),
            (false, Some("/k"), 1),
            (false, Some("-"), 1),
        ] {
            let mut n = 0;
            let r = resume_with_retries(&mut Typing, 3, table, &key_file(file), |_| {
                n += 1;
                Err::<(), _>(Error::Invalid("wrong".into()).with_kind(crate::ErrorKind::Permission))
            });
            assert!(r.is_err());
            assert_eq!(n, want, "table {table}, key file {file:?}");
        }
    }
}
