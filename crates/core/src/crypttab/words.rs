//! crypttab(5)'s lexical rules, as systemd reads the file: fields separated by white
//! space, single or double quotes around (parts of) a field, a backslash taking the next
//! character literally; options separated by commas, `\,` a literal comma.

/// Splits one line into its fields. `Err` names what is malformed.
pub(super) fn fields(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                let Some(next) = chars.next() else {
                    return Err("a backslash ends the line".into());
                };
                cur.push(next);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated quote {q}"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Splits the options field at commas (`\,` is a comma inside an option). Empty items
/// (`luks,,discard`) are dropped, as systemd drops them.
pub(super) fn options(field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => cur.push(next),
                None => cur.push('\\'),
            },
            ',' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_quotes_and_escapes() {
        assert_eq!(
            fields("  data  UUID=1234   none  luks,discard ").unwrap(),
            ["data", "UUID=1234", "none", "luks,discard"]
        );
        assert_eq!(
            fields(r#"home "/srv/my disk.img" '/etc/key file' luks"#).unwrap(),
            ["home", "/srv/my disk.img", "/etc/key file", "luks"]
        );
        assert_eq!(
            fields(r"x /srv/a\ b.img LABEL=My\ Disk").unwrap(),
            ["x", "/srv/a b.img", "LABEL=My Disk"]
        );
        assert_eq!(fields(r#"x LABEL="a b"c"#).unwrap(), ["x", "LABEL=a bc"]);
        assert_eq!(fields(r#"x "" luks"#).unwrap(), ["x", "", "luks"]);
        assert!(fields(r#"x "open"#).is_err());
        assert!(fields(r"x y\").is_err());
    }

    #[test]
    fn options_split_at_unescaped_commas() {
        assert_eq!(options("luks,discard"), ["luks", "discard"]);
        assert_eq!(
            options(r"pkcs11-uri=pkcs11:token=a\,b,nofail"),
            ["pkcs11-uri=pkcs11:token=a,b", "nofail"]
        );
        assert_eq!(options(",luks,,"), ["luks"]);
    }
}
