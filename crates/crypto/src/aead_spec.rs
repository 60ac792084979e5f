//! The names of dm-crypt's authenticated modes, as the crypto API spells them (the
//! sector cipher is [`crate::aead`]).

use crate::iv::IvMode;
use crate::mode::ChainMode;
use crate::CryptoError;

/// The hash of an `authenc(hmac(H),...)` spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacHash {
    /// `hmac(sha1)`.
    Sha1,
    /// `hmac(sha256)`.
    Sha256,
    /// `hmac(sha512)`.
    Sha512,
}

impl MacHash {
    /// The digest size, which is also the HMAC key's size in the table's key.
    pub fn digest_size(self) -> usize {
        match self {
            MacHash::Sha1 => 20,
            MacHash::Sha256 => 32,
            MacHash::Sha512 => 64,
        }
    }

    /// The hash's kernel name (`sha256`).
    pub fn name(self) -> &'static str {
        match self {
            MacHash::Sha1 => "sha1",
            MacHash::Sha256 => "sha256",
            MacHash::Sha512 => "sha512",
        }
    }
}

/// Which authenticated mode a spec names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AeadKind {
    /// `authenc(hmac(H),xts(aes))`.
    AuthencXts(MacHash),
    /// `gcm(aes)`.
    Gcm,
    /// `rfc7539(chacha20,poly1305)`.
    ChaCha20Poly1305,
}

impl AeadKind {
    /// The IV size the kernel's AEAD takes (16 for XTS, 12 for GCM and ChaCha20-Poly1305).
    pub fn iv_size(self) -> usize {
        match self {
            AeadKind::AuthencXts(_) => 16,
            AeadKind::Gcm | AeadKind::ChaCha20Poly1305 => 12,
        }
    }
}

fn spec_err(spec: &str, reason: impl Into<String>) -> CryptoError {
    CryptoError::Spec {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// Parses the crypto API name `alg` of `capi:ALG-IV` when it is an authenticated mode;
/// `None` when it is not one.
pub(crate) fn parse(
    text: &str,
    alg: &str,
    iv: Option<&IvMode>,
) -> Option<Result<(AeadKind, &'static str, ChainMode), CryptoError>> {
    let (kind, cipher, mode) = if let Some(rest) = alg.strip_prefix("authenc(") {
        let Some(inner) = rest.strip_suffix(')') else {
            return Some(Err(spec_err(text, "unbalanced parentheses")));
        };
        let Some((mac, enc)) = inner.split_once(',') else {
            return Some(Err(spec_err(text, "authenc takes (hmac(HASH),CIPHER)")));
        };
        let mac = match mac {
            "hmac(sha1)" => MacHash::Sha1,
            "hmac(sha256)" => MacHash::Sha256,
            "hmac(sha512)" => MacHash::Sha512,
            other => {
                return Some(Err(CryptoError::Unsupported(format!(
                    "the authenc MAC \"{other}\" (hmac(sha1), hmac(sha256) and hmac(sha512) are)"
                ))))
            }
        };
        if enc != "xts(aes)" {
            return Some(Err(CryptoError::Unsupported(format!(
                "authenc with \"{enc}\" (authenc(hmac(...),xts(aes)) is)"
            ))));
        }
        (AeadKind::AuthencXts(mac), "aes", ChainMode::Xts)
    } else if alg == "gcm(aes)" {
        (AeadKind::Gcm, "aes", ChainMode::Ctr)
    } else if alg == "rfc7539(chacha20,poly1305)" {
        (AeadKind::ChaCha20Poly1305, "chacha20", ChainMode::Chacha20)
    } else if alg.starts_with("gcm(")
        || alg.starts_with("rfc7539(")
        || alg.starts_with("rfc4106(")
        || alg.starts_with("ccm(")
    {
        return Some(Err(CryptoError::Unsupported(format!(
            "the authenticated mode \"{alg}\" (gcm(aes), rfc7539(chacha20,poly1305) and \
             authenc(hmac(...),xts(aes)) are)"
        ))));
    } else {
        return None;
    };
    match (&kind, iv) {
        (AeadKind::AuthencXts(_), Some(IvMode::Plain | IvMode::Plain64 | IvMode::Plain64Be)) => {}
        (AeadKind::AuthencXts(_), other) => {
            return Some(Err(CryptoError::Unsupported(format!(
                "authenc with IV mode {} (plain, plain64 and plain64be are)",
                other.map_or_else(|| "(none)".into(), IvMode::name)
            ))))
        }
        (_, Some(IvMode::Random)) => {}
        (_, other) => {
            return Some(Err(CryptoError::Unsupported(format!(
                "{alg} with IV mode {} (a counter-mode AEAD needs a fresh IV per write: \
                 random)",
                other.map_or_else(|| "(none)".into(), IvMode::name)
            ))))
        }
    }
    Some(Ok((kind, cipher, mode)))
}
