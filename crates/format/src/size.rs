//! Size arguments as cryptsetup spells them (`--reduce-device-size 32M`, `--size 8S`), and
//! in ucrypt's memory device `ram:SIZE`.

/// `4096`, `8S`, `4K`, `16M`, `1G`, `2T`: bytes, or S = 512-byte sectors, or binary units
/// (cryptsetup's size arguments).
///
/// # Errors
/// A message naming the argument when it is not such a size or overflows 64 bits.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'S' => 512u64,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size unit in \"{s}\"")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a size (bytes, or K/M/G)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("\"{s}\" is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn units_are_binary_and_s_is_a_sector() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8S"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size(" 1G "), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
    }

    #[test]
    fn bad_sizes_are_named() {
        for bad in ["", "M", "1X", "-1", "1.5G", "99999999999T"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(bad.trim()), "{bad:?}: {e}");
        }
    }
}
