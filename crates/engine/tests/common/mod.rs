//! Volumes over a memory backend in every engine configuration.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use ucrypt_backend::{Backend, FaultyBackend, MemoryBackend};
use ucrypt_crypto::{CipherSpec, SectorCipher, SectorParams, SectorSize, VolumeKey};
use ucrypt_engine::{AutoPolicy, EngineOptions, PoolOptions, Volume, VolumeConfig, WriteOrder};

pub const KEY: [u8; 64] = {
    let mut k = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        k[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    k
};

pub fn cipher(spec: &str, sector: u32) -> Arc<dyn SectorCipher> {
    let key_len = if spec.contains("xts") {
        64
    } else if spec.contains("cipher_null") {
        0
    } else {
        32
    };
    let c = spec
        .parse::<CipherSpec>()
        .unwrap()
        .build(
            &VolumeKey::new(KEY[..key_len].to_vec()),
            SectorParams {
                sector_size: SectorSize::new_extended(sector).unwrap(),
                ..Default::default()
            },
        )
        .unwrap();
    Arc::from(c)
}

/// Every placement × write order the engine offers, named.
pub fn configs() -> Vec<(&'static str, EngineOptions)> {
    let base = EngineOptions {
        auto: None,
        split_bytes: 8192,
        ..EngineOptions::default()
    };
    let small_pool = PoolOptions {
        buffers: 4,
        buffer_bytes: 16384,
        per_request_alloc: false,
    };
    vec![
        (
            "inline",
            EngineOptions {
                no_read_workqueue: true,
                no_write_workqueue: true,
                ..base
            },
        ),
        ("workers-any-ordered", base),
        (
            "workers-same-cpu",
            EngineOptions {
                same_cpu_crypt: true,
                ..base
            },
        ),
        (
            "workers-submit-from-crypt-cpus",
            EngineOptions {
                submit_from_crypt_cpus: true,
                ..base
            },
        ),
        (
            "workers-sorted",
            EngineOptions {
                write_order: WriteOrder::Sorted,
                ..base
            },
        ),
        (
            "auto",
            EngineOptions {
                auto: Some(AutoPolicy {
                    split_min_bytes: 16384,
                }),
                ..base
            },
        ),
        (
            "small-pool",
            EngineOptions {
                pool: small_pool,
                ..base
            },
        ),
        (
            "per-request-alloc",
            EngineOptions {
                pool: PoolOptions {
                    per_request_alloc: true,
                    ..PoolOptions::default()
                },
                ..base
            },
        ),
    ]
}

pub fn volume(
    backend: Arc<dyn Backend>,
    c: Arc<dyn SectorCipher>,
    offset: u64,
    opts: EngineOptions,
) -> Volume {
    let len = backend.info().size_bytes - offset;
    Volume::with_options(
        c,
        backend,
        VolumeConfig {
            data_offset_bytes: offset,
            length_bytes: len,
            read_only: false,
            allow_discards: true,
        },
        opts,
    )
    .unwrap()
}

pub fn memory(bytes: u64) -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new(bytes).unwrap())
}

/// Every engine configuration over each kind of memory backend a volume treats
/// differently: the bare one, whose calls are atomic per chunk (the volume takes no range
/// locks), and the same behind a wrapper that hides that (the volume locks ranges).
pub fn configs_over_memory(bytes: u64) -> Vec<(String, EngineOptions, Arc<dyn Backend>)> {
    let mut out = Vec::new();
    for (name, opts) in configs() {
        out.push((format!("{name} atomic"), opts, memory(bytes)));
        let hidden: Arc<dyn Backend> = Arc::new(FaultyBackend::new(memory(bytes)));
        out.push((format!("{name} locked"), opts, hidden));
    }
    out
}
