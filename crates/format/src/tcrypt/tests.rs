use super::header::parse;
use super::search::try_chain;
use super::*;
use ChainMode::{CbcTcrypt, CbcTcw, Cbci, Lrw, Xts};

/// A VeraCrypt-style XTS header (version 5, data at 128 KiB) for the geometry rules.
fn xts_header(volume_size: u64) -> TcryptHeader {
    TcryptHeader {
        vera: true,
        version: 5,
        version_tc: 0x010b,
        hidden_volume_size: 0,
        volume_size,
        mk_offset: 131_072,
        mk_size: volume_size,
        flags: 0,
        sector_size: 512,
        kdf: KDFS[0],
        chain: CHAINS
            .iter()
            .find(|c| c.mode == Xts && c.ciphers.len() == 1)
            .expect("a single-cipher XTS chain"),
        header_offset: 0,
        keys: Zeroizing::new([0u8; 256]),
    }
}

#[test]
fn data_areas_follow_cryptsetups_geometry_rules() {
    let h = xts_header(1 << 20);
    let dev = 4 << 20;
    let g = Geometry {
        header_device_bytes: dev,
        data_device_bytes: dev,
        ..Geometry::default()
    };
    let normal = TcryptOptions::default();
    // A file container: data and IVs from the header's offset, its stated length.
    assert_eq!(
        h.data_area(&normal, &g, "c.tc").unwrap(),
        DataArea {
            offset: 256,
            iv_offset: 256,
            sectors: 2048
        }
    );
    let system = TcryptOptions {
        system: true,
        ..TcryptOptions::default()
    };
    // System encryption on a partition: from its start, IVs from the drive's sectors.
    let part = Geometry {
        partition_start: Some(2048),
        ..g
    };
    assert_eq!(
        h.data_area(&system, &part, "sda1").unwrap(),
        DataArea {
            offset: 0,
            iv_offset: 2048,
            sectors: dev / 512
        }
    );
    // A copy of the partition with the header beside it: offset 0, to the end.
    let detached = Geometry {
        detached_header: true,
        ..g
    };
    assert_eq!(h.data_area(&system, &detached, "p.img").unwrap().offset, 0);
    // The whole drive with the header on it: the encrypted area the header states.
    assert_eq!(h.data_area(&system, &g, "sda").unwrap().sectors, 2048);
    // A device too small for what the header states is refused, naming it.
    let small = Geometry {
        header_device_bytes: 512 << 10,
        data_device_bytes: 512 << 10,
        ..g
    };
    let e = h
        .data_area(&normal, &small, "c.tc")
        .unwrap_err()
        .to_string();
    assert!(e.contains("c.tc") && e.contains("does not fit"), "{e}");
}

#[test]
fn pim_costs() {
    let sha512 = KDFS[5];
    assert_eq!(sha512.costs(Some(1234)), (15000 + 1_234_000, 0));
    let boot = KDFS[8];
    assert_eq!(boot.costs(Some(3)), (6144, 0));
    let argon = KDFS[9];
    assert_eq!(argon.costs(Some(8)), (5, 294_912));
    assert_eq!(argon.costs(Some(33)), (15, 1024 * 1024));
    assert_eq!(argon.costs(None), (6, 425_984));
}

#[test]
fn hints_filter() {
    let o = TcryptOptions {
        hash: Some("xxxx".into()),
        ..TcryptOptions::default()
    };
    assert!(kdf_candidates(&o).is_empty());
    let o = TcryptOptions {
        hash: Some("sha512".into()),
        veracrypt: false,
        ..TcryptOptions::default()
    };
    assert_eq!(kdf_candidates(&o).len(), 1);
    let o = TcryptOptions {
        cipher: Some("serpent".into()),
        ..TcryptOptions::default()
    };
    assert!(chain_candidates(&o)
        .iter()
        .all(|c| c.long_name.contains("serpent")));
}

#[test]
fn chain_key_sizes_are_consistent() {
    for c in CHAINS {
        let sum: usize = c.ciphers.iter().map(|a| a.key_size + a.key_extra).sum();
        match c.mode {
            Xts | Lrw => assert_eq!(sum, c.chain_key_size, "{}", c.long_name),
            _ => assert!(sum <= c.chain_key_size + 64, "{}", c.long_name),
        }
    }
}

/// Reference: VeraCrypt's cascade list (its documentation's "Cascades of ciphers", whose
/// names run from the last cipher applied to the first) and its key layout (`EAInit`
/// keys each cipher of an EA from consecutive 32-byte slots in EA order; the XTS
/// secondary keys follow all primary ones, `EAGetKeySize` bytes in). Every VeraCrypt
/// cascade must be in the search with that layout, including the three no suite image
/// covers (Kuznyechik-AES, Camellia-Serpent, Kuznyechik-Twofish).
#[test]
fn every_veracrypt_xts_cascade_with_veracrypts_key_layout() {
    let veracrypt_ui = [
        "AES-Twofish",
        "AES-Twofish-Serpent",
        "Serpent-AES",
        "Serpent-Twofish-AES",
        "Twofish-Serpent",
        "Camellia-Kuznyechik",
        "Camellia-Serpent",
        "Kuznyechik-AES",
        "Kuznyechik-Serpent-Camellia",
        "Kuznyechik-Twofish",
    ];
    for ui in veracrypt_ui {
        let order: Vec<String> = ui.split('-').rev().map(str::to_lowercase).collect();
        let name = order.join("-");
        let chain = CHAINS
            .iter()
            .find(|c| c.mode == Xts && c.long_name == name)
            .unwrap_or_else(|| panic!("VeraCrypt's {ui} ({name}) is not searched"));
        let n = chain.ciphers.len();
        assert_eq!(chain.chain_key_size, 64 * n, "{name}");
        for (i, (alg, want)) in chain.ciphers.iter().zip(&order).enumerate() {
            assert_eq!(alg.name, want, "{name}: cipher {i}");
            assert_eq!(
                (alg.key_offset, alg.iv_offset, alg.key_size),
                (32 * i, 32 * (n + i), 64),
                "{name}: {} keys",
                alg.name
            );
        }
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_default())
        .collect()
}

/// Reference: TrueCrypt 4.3a's own `EncryptSectors` (Common/Crypto.c), compiled from
/// its source release by `testdata/truecrypt-cbc/make-vectors.sh` (the suite's cascade
/// and Blowfish images have their data area wiped, so only these vectors check the data
/// path of `cbci-tcrypt` and `cbc-tcrypt`). Every legacy CBC chain's layers, stacked as
/// ucrypt serves them (innermost layer first), give TrueCrypt's ciphertext, and decrypt
/// it back.
#[test]
fn legacy_cbc_layers_match_truecrypt_4_3a() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/truecrypt-cbc/vectors.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("testdata/truecrypt-cbc/vectors.jsonl");
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("vector line");
        let name = v["chain"].as_str().unwrap_or_default();
        let mode = match v["mode"].as_str().unwrap_or_default() {
            "outer-cbc" => Cbci,
            "inner-cbc" => CbcTcrypt,
            _ if name == "blowfish" => CbcTcrypt,
            _ => CbcTcw,
        };
        let long = if name == "blowfish" {
            "blowfish_le"
        } else {
            name
        };
        let chain = CHAINS
            .iter()
            .find(|c| c.long_name == long && c.mode == mode)
            .unwrap_or_else(|| panic!("no chain {long} {mode:?}"));
        let mut keys = Zeroizing::new([0u8; 256]);
        let area = unhex(v["key_area_hex"].as_str().unwrap_or_default());
        keys[..area.len()].copy_from_slice(&area);
        let hdr = TcryptHeader {
            vera: false,
            version: 2,
            version_tc: 0x0410,
            hidden_volume_size: 0,
            volume_size: 0,
            mk_offset: 512,
            mk_size: 0,
            flags: 0,
            sector_size: 512,
            kdf: KDFS[0],
            chain,
            header_offset: 0,
            keys,
        };
        let first = Sector512(v["first_sector"].as_u64().unwrap_or_default());
        let index = v["plaintext"]
            .as_str()
            .and_then(|p| p.strip_prefix("i*13+"))
            .and_then(|k| k.parse::<usize>().ok())
            .unwrap_or_default();
        let plain: Vec<u8> = (0..1024usize).map(|i| (i * 13 + index) as u8).collect();
        let want = unhex(v["ciphertext_hex"].as_str().unwrap_or_default());
        let ciphers: Vec<_> = hdr
            .layers()
            .expect("layers")
            .iter()
            .map(|l| {
                let spec: CipherSpec = l.cipher.parse().expect("layer spec");
                spec.build(&l.key, SectorParams::default())
                    .expect("layer cipher")
            })
            .collect();
        let mut data = plain.clone();
        for c in ciphers.iter().rev() {
            c.encrypt(first, &mut data);
        }
        assert!(data == want, "{long} {mode:?} from sector {}", first.0);
        for c in &ciphers {
            c.decrypt(first, &mut data);
        }
        assert!(data == plain, "{long} {mode:?} decrypts back");
        seen.insert(format!("{long}/{}", mode.name()));
    }
    // All 5 outer-CBC cascades, both Blowfish inner-CBC chains, Blowfish alone, and the
    // single ciphers dm-crypt's tcw also serves (a check of the oracle itself).
    assert_eq!(seen.len(), 11, "{seen:?}");
}

#[test]
fn garbage_header_does_not_panic() {
    let enc = [0x5au8; ENC_LEN];
    let key = [1u8; HDR_KEY_LEN];
    for c in CHAINS {
        if let Some(d) = try_chain(c, &key, &enc) {
            assert!(parse(&d, KDFS[0], c, 0).is_none() || &d[..4] == b"TRUE");
        }
    }
}
