//! `clevis` tokens, as `clevis luks bind` writes them into a LUKS2 header and `clevis luks
//! unlock` reads them: `{"type":"clevis","keyslots":["N"],"jwe":{...}}`, the JWE in JSON
//! form. Unlocking runs `clevis decrypt` with the JWE in compact form on its standard input
//! (what `jose jwe fmt -i- -c` makes of the token's `jwe`); its output, with trailing
//! newlines dropped as the shell's `$(...)` in `clevis luks unlock` drops them, is the
//! passphrase of the token's keyslots. Which pin (tang, tpm2, sss) is clevis's business.

use crate::error::{Error, Result};
use crate::secret::{read_key, Secret};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one `clevis decrypt` may run when no `--token-timeout` is given: a tang server
/// that does not answer (packets dropped) would otherwise hold the open for curl's
/// minutes-long connect timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A clevis token's JWE, compact (its keyslots are read from the header like every
/// token's, [`super::unlock`]).
pub(crate) struct ClevisToken {
    /// The JWE in compact serialisation (five base64url parts joined by dots).
    pub(crate) compact: String,
}

impl ClevisToken {
    /// Reads a clevis token's JSON.
    ///
    /// # Errors
    /// Not a JSON object with `keyslots` and a `jwe` that has a compact form (a protected
    /// header, `iv`, `ciphertext` and `tag`, no unprotected header or several recipients).
    pub(crate) fn parse(json: &str) -> Result<ClevisToken> {
        let bad = |why: &str| Error::Invalid(format!("malformed clevis token: {why}"));
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| bad(&format!("not JSON ({e})")))?;
        v.get("keyslots")
            .and_then(|k| k.as_array())
            .ok_or_else(|| bad("no keyslots array"))?
            .iter()
            .map(|k| {
                k.as_str()
                    .and_then(|s| s.parse::<u32>().ok())
                    .ok_or_else(|| bad("a keyslot that is not a number in a string"))
            })
            .collect::<Result<Vec<u32>>>()?;
        let jwe = v.get("jwe").ok_or_else(|| bad("no jwe"))?;
        if ["header", "unprotected", "recipients", "aad"]
            .iter()
            .any(|k| jwe.get(k).is_some())
        {
            return Err(bad(
                "its JWE has an unprotected header, several recipients or AAD (no compact form)",
            ));
        }
        let part = |name: &str, required: bool| -> Result<&str> {
            match jwe.get(name) {
                Some(serde_json::Value::String(s)) if is_base64url(s) => Ok(s.as_str()),
                None if !required => Ok(""),
                _ => Err(bad(&format!(
                    "its JWE's {name} is missing or not base64url"
                ))),
            }
        };
        let compact = [
            part("protected", true)?,
            part("encrypted_key", false)?,
            part("iv", true)?,
            part("ciphertext", true)?,
            part("tag", true)?,
        ]
        .join(".");
        Ok(ClevisToken { compact })
    }
}

/// The characters of unpadded base64url: a token's parts go to `clevis` on a pipe, never
/// anything else.
fn is_base64url(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Where `clevis` is: the first executable `clevis` on `PATH`.
pub(crate) fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("clevis"))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs `clevis decrypt` on `compact` and returns its output as a [`Secret`], trailing
/// newlines dropped. The process and everything it starts (pins, curl) are killed when it
/// runs past `timeout`.
///
/// # Errors
/// `clevis` cannot be started, fails (its first error line is in the message: tang
/// unreachable, no TPM...), times out, or prints nothing.
pub(crate) fn decrypt(
    clevis: &std::path::Path,
    compact: &str,
    timeout: Duration,
) -> Result<Secret> {
    let mut child = Command::new(clevis)
        .arg("decrypt")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout ends the pins and curl it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Invalid(format!("cannot run {}: {e}", clevis.display())))?;
    let pgid = child.id();
    // The JWE is public (it is in the header); a pin that exits early closes the pipe.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(compact.as_bytes());
    }
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // The passphrase is read while clevis runs (a pipe is bounded); so is its stderr, on
    // a thread of its own.
    let err_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.take(64 * 1024).read_to_end(&mut text);
        }
        text
    });
    let out_reader = std::thread::spawn(move || match stdout.as_mut() {
        Some(o) => read_key(o, "the output of clevis decrypt", 0, 0),
        None => Ok(Secret::new()),
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                kill_group(pgid);
                let _ = child.wait();
                return Err(Error::Invalid(format!("waiting for clevis decrypt: {e}")));
            }
        }
    };
    // Pins it started may still hold the pipes: the group goes in any case.
    kill_group(pgid);
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.wait();
            let _ = out_reader.join();
            let _ = err_reader.join();
            return Err(Error::Invalid(format!(
                "clevis decrypt gave no answer within {} s (tang server unreachable?)",
                timeout.as_secs()
            )));
        }
    };
    let out = out_reader
        .join()
        .map_err(|_| Error::Invalid("reading the output of clevis decrypt failed".into()))?;
    let err = err_reader.join().unwrap_or_default();
    if !status.success() {
        let text = String::from_utf8_lossy(&err);
        let first = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no message");
        return Err(Error::Invalid(format!(
            "clevis decrypt failed ({status}): {first}"
        )));
    }
    let mut pass = out?;
    while pass.last() == Some(&b'\n') {
        pass.pop();
    }
    if pass.is_empty() {
        return Err(Error::Invalid(
            "clevis decrypt gave an empty passphrase".into(),
        ));
    }
    Ok(pass)
}

/// Sends SIGKILL to process group `pgid` (one this module started; gone already is fine).
fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) on a process group this module created; no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_form_of_a_clevis_token() {
        let t = ClevisToken::parse(
            r#"{"type":"clevis","keyslots":["4"],"jwe":{"ciphertext":"Y3Q","encrypted_key":"","iv":"aXY","protected":"cHJvdA","tag":"dGFn"}}"#,
        )
        .unwrap();
        assert_eq!(t.compact, "cHJvdA..aXY.Y3Q.dGFn");
    }

    #[test]
    fn refuses_what_has_no_compact_form() {
        for json in [
            r#"{"type":"clevis","keyslots":["1"]}"#,
            r#"{"type":"clevis","keyslots":[1],"jwe":{"protected":"a","iv":"b","ciphertext":"c","tag":"d"}}"#,
            r#"{"type":"clevis","keyslots":["1"],"jwe":{"protected":"a","iv":"b","ciphertext":"c"}}"#,
            r#"{"type":"clevis","keyslots":["1"],"jwe":{"protected":"a","iv":"b","ciphertext":"c","tag":"d","header":{}}}"#,
            r#"{"type":"clevis","keyslots":["1"],"jwe":{"protected":"a;rm","iv":"b","ciphertext":"c","tag":"d"}}"#,
        ] {
            assert!(ClevisToken::parse(json).is_err(), "{json}");
        }
    }
}
