//! Per-client counters: every request carries its client's [`IoCtx`], so the engine can
//! say who issued what (the userspace analogue of dm-crypt forwarding the bio's cgroup).
//!
//! Fixed slots of atomics, indexed by client number modulo the slot count: no lock and no
//! allocation per request. Clients beyond the slot count share slots (documented, rare).
//! Unattributed requests (client 0: the offline commands, in-process benchmarks) are not
//! counted, so they pay nothing for it.

use std::sync::atomic::{AtomicU64, Ordering};
use ucrypt_backend::IoCtx;

/// Number of per-client slots.
pub const CLIENT_SLOTS: usize = 64;

#[derive(Default)]
struct Slot {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
}

/// Counters for one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Client number (slot).
    pub client: u32,
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
}

/// All clients' counters.
pub(crate) struct Stats {
    slots: [Slot; CLIENT_SLOTS],
}

impl Stats {
    pub(crate) fn new() -> Self {
        Stats {
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }

    fn slot(&self, ctx: IoCtx) -> &Slot {
        &self.slots[ctx.client as usize % CLIENT_SLOTS]
    }

    pub(crate) fn read(&self, ctx: IoCtx, bytes: usize) {
        if ctx.client == 0 {
            return;
        }
        let s = self.slot(ctx);
        s.reads.fetch_add(1, Ordering::Relaxed);
        s.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn write(&self, ctx: IoCtx, bytes: usize) {
        if ctx.client == 0 {
            return;
        }
        let s = self.slot(ctx);
        s.writes.fetch_add(1, Ordering::Relaxed);
        s.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Clients that issued anything.
    pub(crate) fn snapshot(&self) -> Vec<ClientStats> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| ClientStats {
                client: i as u32,
                reads: s.reads.load(Ordering::Relaxed),
                read_bytes: s.read_bytes.load(Ordering::Relaxed),
                writes: s.writes.load(Ordering::Relaxed),
                write_bytes: s.write_bytes.load(Ordering::Relaxed),
            })
            .filter(|c| c.reads + c.writes > 0)
            .collect()
    }
}
