use super::*;

/// cryptsetup 2.6.1's `--encrypt --reduce-device-size 32M --init-only` of a 64 MiB
/// device (salts and digests as it wrote them).
const SHIFT_INIT: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"tEy1HxkIcmasl2c96PnWeRqQ+Js31+Atl5ljQjs94p8="}},"1":{"area":{"offset":"290816","size":"4096","type":"datashift","shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"linear","offset":"16777216","size":"16777216"},"2":{"type":"linear","offset":"50331648","size":"16777216","flags":["backup-moved-segment"]},"3":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"4":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["4"],"hash":"sha256","iterations":1000,"salt":"dL9EwjAoE6PayRYg4lbGswnrEBYvkCKF9ASqZizN/W4=","digest":"wAYFppCYNTU50gQH4c+oEHt59GpoqbluV+IOi++GdIQ="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":[],"hash":"sha256","iterations":1000,"salt":"Tdn07qfZIJpFWLQ9ZzRbcTglIM2TpgDeBcon12tDL4k=","digest":"Xm5dAoXS9XfVihSpt/DoBOT8tIIGC9v/7P9qyQWQ3aY="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#;
const M: u64 = 1 << 20;

#[test]
fn a_data_shift_walks_cryptsetups_hotzones_and_segments() {
    let mut json = Json::parse(SHIFT_INIT).unwrap();
    // The data area as ucrypt measures it: the device less the data offset.
    let st = Reencrypt::load(&json, 48 * M).unwrap();
    assert_eq!(st.resilience, Resilience::Datashift { shift: 16 * M });
    let len = st.data_length(48 * M);
    assert_eq!(len, 32 * M);
    assert_eq!(st.progress, Progress::Clean { done: 0 });
    // Backward, a shift at a time, the last one from the moved copy.
    assert_eq!(st.next_hotzone(0, len, 4 * M), (16 * M, 16 * M));
    assert_eq!(st.old_offset(16 * M), 16 * M);
    assert_eq!(st.next_hotzone(16 * M, len, 4 * M), (0, 16 * M));
    assert_eq!(st.old_offset(0), 48 * M);
    // Data not a multiple of the shift: a shorter hotzone before the moved one.
    assert_eq!(st.next_hotzone(0, 40 * M, 0), (24 * M, 16 * M));
    assert_eq!(st.next_hotzone(16 * M, 40 * M, 0), (16 * M, 8 * M));
    assert_eq!(st.next_hotzone(24 * M, 40 * M, 0), (0, 16 * M));
    // The first hotzone's "post" segments (as cryptsetup's header after it), which
    // load back as 16 MiB done.
    st.set_done(&mut json, 16 * M, len);
    let text = json.to_compact();
    assert!(
        text.contains(r#""segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"crypt","offset":"33554432","size":"16777216","iv_tweak":"32768","encryption":"aes-xts-plain64","sector_size":512},"2":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"3":{"type":"crypt","offset":"16777216","size":"dynamic""#),
        "{text}"
    );
    assert!(text.contains(r#""segments":["3","1"]"#), "{text}");
    let back = Reencrypt::load(&json, 48 * M).unwrap();
    assert_eq!(back.progress, Progress::Clean { done: 16 * M });
    // The moved copy's hotzone: a crash there loads as that hotzone.
    st.set_hot(&mut json, 0, 16 * M, len);
    let crashed = Reencrypt::load(&json, 48 * M).unwrap();
    assert_eq!(
        crashed.progress,
        Progress::Crashed {
            offset: 0,
            length: 16 * M
        }
    );
    assert_eq!(crashed.done_before(0, 16 * M, len), 16 * M);
    // A moved segment with any other mode is refused.
    let other = SHIFT_INIT.replace(r#""mode":"encrypt""#, r#""mode":"reencrypt""#);
    assert!(Reencrypt::load(&Json::parse(&other).unwrap(), 48 * M).is_err());
}
/// cryptsetup 2.6.1's `--decrypt --header NEW --init-only` of a 64 MiB device whose
/// LUKS2 header (16 MiB data offset) was attached: the header exported, the first
/// 16 MiB of ciphertext moved to the device's head.
const DECRYPT_SHIFT_INIT: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"l2FTBLCfBTgE8manvblN57J+XT7SCCQNgXig8os6HTQ="}},"1":{"area":{"offset":"290816","size":"16486400","type":"datashift-checksum","hash":"sha256","sector_size":4096,"shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"decrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512},"1":{"type":"crypt","offset":"33554432","size":"dynamic","iv_tweak":"32768","encryption":"aes-xts-plain64","sector_size":512},"2":{"type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-moved-segment"]},"3":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-previous"]},"4":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0","1","2","3"],"hash":"sha256","iterations":1000,"salt":"6JzJMvMv/TwIrIzWjMlxuRSnToRLTkYf7dMLkZrz9wM=","digest":"p76G6HDw/uXtLV+lqHv51y+LWXc8E45SeUkcf9nBL1I="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":[],"hash":"sha256","iterations":66601,"salt":"j28YJCbv/DH4pbSX7Lf3dbiah9p+aPBUhxH4iHAIFEo=","digest":"wPXwwm35RqhMA5r9N95c9EasUTE85FfjExZVBfrM6hE="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v3"]}}}"#;

#[test]
fn an_attached_header_decryption_walks_cryptsetups_hotzones_and_segments() {
    let mut json = Json::parse(DECRYPT_SHIFT_INIT).unwrap();
    // The data area is the whole device (the plaintext starts at 0).
    let st = Reencrypt::load(&json, 64 * M).unwrap();
    assert_eq!(st.version, 3);
    assert_eq!(st.resilience, Resilience::Datashift { shift: 16 * M });
    assert_eq!(
        st.moved_resilience,
        Some(Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 4096
        })
    );
    let len = st.data_length(64 * M);
    assert_eq!(len, 48 * M);
    assert_eq!(st.progress, Progress::Clean { done: 0 });
    assert_eq!(st.shifted_part(len), 32 * M);
    // Forward a shift at a time after the moved 16 MiB, then the moved segment.
    assert_eq!(st.next_hotzone(0, len, 0), (16 * M, 16 * M));
    assert_eq!(st.old_offset(16 * M), 32 * M);
    assert_eq!(st.next_hotzone(16 * M, len, 0), (32 * M, 16 * M));
    assert_eq!(st.next_hotzone(32 * M, len, 0), (0, 16 * M));
    assert_eq!(st.old_offset(0), 0);
    assert_eq!(st.resilience_at(0), st.moved_resilience.as_ref().unwrap());
    assert_eq!(st.resilience_at(16 * M), &st.resilience);
    assert_eq!(st.done_after(32 * M, 16 * M, len), 32 * M);
    assert_eq!(st.done_after(0, 16 * M, len), len);
    // Data not a multiple of the shift: the last hotzone before the moved one shorter.
    assert_eq!(st.next_hotzone(16 * M, 40 * M, 0), (32 * M, 8 * M));
    // The headers cryptsetup writes at each step (read from its killed runs).
    let segs = |j: &Json| {
        let t = j.to_compact();
        let a = t.find("\"segments\":{").unwrap();
        let b = t.find(",\"digests\"").unwrap();
        let d = t.find("\"digests\":{\"0\":").unwrap();
        let e = t[d..].find("\"hash\"").unwrap();
        format!("{} {}", &t[a..b], &t[d..d + e])
    };
    let moved = r#""type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512"#;
    let backups = format!(
        r#"{{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-previous"]}},"{{}}":{{"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]}},"{{}}":{{{moved},"flags":["backup-moved-segment"]}}}}"#
    );
    let tail = |n: u32| {
        backups
            .replacen("{}", &(n + 1).to_string(), 1)
            .replacen("{}", &(n + 2).to_string(), 1)
    };
    st.set_hot(&mut json, 16 * M, 16 * M, len);
    assert_eq!(
        segs(&json),
        format!(
            r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216","flags":["in-reencryption"]}},"2":{{"type":"crypt","offset":"50331648","size":"dynamic","iv_tweak":"65536","encryption":"aes-xts-plain64","sector_size":512}},"3":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["3","5","0","2"],"#,
            tail(3)
        )
    );
    assert_eq!(
        Reencrypt::load(&json, 64 * M).unwrap().progress,
        Progress::Crashed {
            offset: 16 * M,
            length: 16 * M
        }
    );
    st.set_done(&mut json, 16 * M, len);
    assert!(segs(&json).starts_with(&format!(
        r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216"}},"2":{{"type":"crypt","offset":"50331648","size":"dynamic","iv_tweak":"65536""#
    )));
    assert_eq!(
        Reencrypt::load(&json, 64 * M).unwrap().progress,
        Progress::Clean { done: 16 * M }
    );
    st.set_hot(&mut json, 32 * M, 16 * M, len);
    assert_eq!(
        segs(&json),
        format!(
            r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216"}},"2":{{"type":"linear","offset":"33554432","size":"16777216","flags":["in-reencryption"]}},"3":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["3","5","0"],"#,
            tail(3)
        )
    );
    st.set_done(&mut json, 32 * M, len);
    assert_eq!(
        segs(&json),
        format!(
            r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"dynamic"}},"2":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["2","4","0"],"#,
            tail(2)
        )
    );
    assert_eq!(
        Reencrypt::load(&json, 64 * M).unwrap().progress,
        Progress::Clean { done: 32 * M }
    );
    st.set_hot(&mut json, 0, 16 * M, len);
    assert_eq!(
        segs(&json),
        format!(
            r#""segments":{{"0":{{"type":"linear","offset":"0","size":"16777216","flags":["in-reencryption"]}},"1":{{"type":"linear","offset":"16777216","size":"dynamic"}},"2":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["2","4"],"#,
            tail(2)
        )
    );
    let crashed = Reencrypt::load(&json, 64 * M).unwrap();
    assert_eq!(
        crashed.progress,
        Progress::Crashed {
            offset: 0,
            length: 16 * M
        }
    );
    assert_eq!(crashed.done_before(0, 16 * M, len), 32 * M);
    st.set_done(&mut json, len, len);
    assert_eq!(
        segs(&json),
        format!(
            r#""segments":{{"0":{{"type":"linear","offset":"0","size":"dynamic"}},"1":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["1","3"],"#,
            tail(1)
        )
    );
    assert_eq!(
        Reencrypt::load(&json, 64 * M).unwrap().progress,
        Progress::Clean { done: len }
    );
    st.finish(&mut json);
    let t = json.to_compact();
    assert!(
        t.contains(r#""segments":{"0":{"type":"linear","offset":"0","size":"dynamic"}}"#)
            && !t.contains("online-reencrypt")
            && t.contains(r#""keyslots_size":"16744448""#),
        "{t}"
    );
    // The checksum's fields, then the shift, in the digest's data, version 3.
    let st = Reencrypt::load(&Json::parse(DECRYPT_SHIFT_INIT).unwrap(), 64 * M).unwrap();
    let data = st
        .verification_data(&Json::parse(DECRYPT_SHIFT_INIT).unwrap(), &[7; 64], &[])
        .unwrap();
    assert_eq!(&data[..2], b"v3");
    let area = b"decryptforwarddatashift-checksum";
    let at = 2 + 64;
    assert_eq!(&data[at..at + area.len()], area);
    let rest = &data[at + area.len() + 16..];
    assert!(
        rest.starts_with(b"sha256\0\0\x10\0\0\0\0\0\x01\0\0\0crypt"),
        "{rest:?}"
    );
}
