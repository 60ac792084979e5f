//! LUKS2 JSON metadata as an ordered tree, for the writers (reencryption): the typed
//! [`super::Metadata`] is for reading; a writer must keep every member it does not touch
//! (tokens of any type, unknown fields) and the member order libcryptsetup's json-c keeps,
//! so that a header ucrypt rewrites reads back field for field as cryptsetup's would.
//!
//! Hand-written because serde_json's own `Value` sorts object members unless the
//! workspace-wide `preserve_order` feature is on, which would change every other JSON
//! output of ucrypt.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One JSON value; objects keep their members in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as serde_json read it.
    Num(serde_json::Number),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, members in order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses text (up to its first NUL, as the header's JSON area is padded).
    ///
    /// # Errors
    /// The parser's message when the text is not JSON.
    pub fn parse(text: &str) -> Result<Json, String> {
        let text = text.split('\0').next().unwrap_or_default();
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// A string value.
    pub fn str(s: &str) -> Json {
        Json::Str(s.to_string())
    }

    /// A 64-bit value as LUKS2 writes it: a decimal string.
    pub fn u64_text(n: u64) -> Json {
        Json::Str(n.to_string())
    }

    /// A small value as LUKS2 writes it: a JSON number.
    pub fn int(n: u64) -> Json {
        Json::Num(n.into())
    }

    /// Member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Member `key` of an object, mutable.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Obj(m) => m.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Sets member `key`: replaced where it is, or appended (json-c's
    /// `json_object_object_add`). No effect on a non-object.
    pub fn set(&mut self, key: &str, value: Json) {
        if let Json::Obj(m) = self {
            if let Some(slot) = m.iter_mut().find(|(k, _)| k == key) {
                slot.1 = value;
            } else {
                m.push((key.to_string(), value));
            }
        }
    }

    /// Removes member `key`; returns it.
    pub fn remove(&mut self, key: &str) -> Option<Json> {
        match self {
            Json::Obj(m) => {
                let i = m.iter().position(|(k, _)| k == key)?;
                Some(m.remove(i).1)
            }
            _ => None,
        }
    }

    /// The members of an object (empty for anything else).
    pub fn members(&self) -> &[(String, Json)] {
        match self {
            Json::Obj(m) => m,
            _ => &[],
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer written as a number or a decimal string.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num(n) => n.as_u64(),
            Json::Str(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The compact text json-c writes with `JSON_C_TO_STRING_PLAIN |
    /// JSON_C_TO_STRING_NOSLASHESCAPE` (what libcryptsetup stores): no spaces, `/` as is.
    pub fn to_compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(&n.to_string()),
            Json::Str(s) => out.push_str(&quote(s)),
            Json::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&quote(k));
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{}\"", s.escape_default()))
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n)
                    .map(Json::Num)
                    .ok_or_else(|| E::custom("number is not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Json::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut m: Vec<(String, Json)> = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Json>()? {
                    // json-c keeps the last of duplicate keys, in the first one's place.
                    if let Some(slot) = m.iter_mut().find(|(kk, _)| *kk == k) {
                        slot.1 = v;
                    } else {
                        m.push((k, v));
                    }
                }
                Ok(Json::Obj(m))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trips_in_order_and_edits_in_place() {
        let text = r#"{"z":1,"a":{"salt":"a/b+c=","n":"123"},"l":[true,null,-2]}"#;
        let mut j = Json::parse(&format!("{text}\0\0")).unwrap();
        assert_eq!(j.to_compact(), text);
        j.get_mut("a").unwrap().set("n", Json::u64_text(7));
        j.set("new", Json::int(4));
        assert_eq!(
            j.to_compact(),
            r#"{"z":1,"a":{"salt":"a/b+c=","n":"7"},"l":[true,null,-2],"new":4}"#
        );
        assert_eq!(j.remove("z"), Some(Json::int(1)));
        assert_eq!(j.get("a").unwrap().get("n").unwrap().as_u64(), Some(7));
        assert!(Json::parse("{").is_err());
    }
}
