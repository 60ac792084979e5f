//! `ucrypt bench --table LINE`: a volume measured against its own device in one process,
//! with one load generator ([`load::run_queued`]) for both: the volume of the table line
//! (`ucrypt`) and the line's device without the crypt layer over the same data area
//! (`raw`). For an RBD image this is ucrypt's engine over librbd next to librbd itself,
//! with no NBD hop on either side: what encryption costs over the device, where
//! `bench/rbd.sh`'s NBD columns add the hop (BENCHMARKING.md, "Ceph RBD").
//!
//! Both sides share the one device handle the line opens (one librbd image handle, so one
//! cache mode), which is flushed once before the first measurement: librbd leaves its
//! writethrough start-up mode at a handle's first flush, as fio's rbd engine makes it do.

use super::load::{self, Op, Pattern, QueuedSample};
use crate::error::{bail, Result};
use crate::open::{open_table, OpenOptions};
use std::sync::Arc;
use ucrypt_backend::Backend;

/// One workload: fio's `rw` and block size at a queue depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// fio's name for the direction and order (`randread`, `randwrite`, `read`, `write`).
    pub rw: &'static str,
    /// Read or write.
    pub op: Op,
    /// Random or sequential offsets.
    pub pattern: Pattern,
    /// Bytes per request.
    pub block: usize,
    /// Requests in flight.
    pub depth: usize,
}

impl Workload {
    /// `rw` as fio spells it, or `None`.
    pub fn new(rw: &str, block: usize, depth: usize) -> Option<Workload> {
        let (rw, op, pattern) = match rw {
            "randread" => ("randread", Op::Read, Pattern::Random),
            "randwrite" => ("randwrite", Op::Write, Pattern::Random),
            "read" => ("read", Op::Read, Pattern::Sequential),
            "write" => ("write", Op::Write, Pattern::Sequential),
            _ => return None,
        };
        Some(Workload {
            rw,
            op,
            pattern,
            block,
            depth,
        })
    }

    /// `bench/rbd.sh`'s name for it: `4k-randread-qd32`, `1M-write-qd32`.
    pub fn name(&self) -> String {
        let size = if self.block >= 1 << 20 && self.block % (1 << 20) == 0 {
            format!("{}M", self.block >> 20)
        } else if self.block % 1024 == 0 {
            format!("{}k", self.block >> 10)
        } else {
            format!("{}b", self.block)
        };
        format!("{size}-{}-qd{}", self.rw, self.depth)
    }
}

/// The four workloads of the RBD issue: 4 KiB random reads and writes, 1 MiB sequential
/// reads and writes, at `depth`.
pub fn rbd_workloads(depth: usize) -> Vec<Workload> {
    [
        ("randread", 4096),
        ("randwrite", 4096),
        ("read", 1 << 20),
        ("write", 1 << 20),
    ]
    .into_iter()
    .filter_map(|(rw, b)| Workload::new(rw, b, depth))
    .collect()
}

/// The two sides of a table line.
pub struct Sides {
    /// The line's device (its backend as the volume uses it).
    pub raw: Arc<dyn Backend>,
    /// The volume.
    pub volume: Arc<dyn Backend>,
    /// Where the data area starts on the device, in bytes.
    pub data_offset: u64,
    /// The data area's length in bytes.
    pub length: u64,
}

/// Opens `line` (as `ucrypt open --table` does: same engine options) and flushes it once.
///
/// # Errors
/// As [`open_table`]; a failing first flush.
pub fn open_sides(line: &str, opts: OpenOptions) -> Result<Sides> {
    let opened = open_table(line, opts)?;
    let raw = Arc::clone(opened.volume.backend());
    let data_offset = opened.table.offset_bytes();
    let length = opened.table.length_bytes();
    if length == 0 {
        bail!("the table line maps no sectors");
    }
    if !opts.read_only {
        raw.flush()?;
    }
    let volume: Arc<dyn Backend> = opened.volume;
    Ok(Sides {
        raw,
        volume,
        data_offset,
        length,
    })
}

/// Which side to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The device over the data area.
    Raw,
    /// The volume.
    Ucrypt,
}

impl Side {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Side::Raw => "raw",
            Side::Ucrypt => "ucrypt",
        }
    }
}

/// Runs `w` on one side for `secs`.
///
/// # Errors
/// A request that failed, or a block larger than the data area.
pub fn measure(sides: &Sides, side: Side, w: &Workload, secs: f64) -> Result<QueuedSample> {
    if w.block == 0 || w.block as u64 > sides.length {
        bail!(
            "a {}-byte request does not fit the {}-byte data area",
            w.block,
            sides.length
        );
    }
    let (dev, base) = match side {
        Side::Raw => (&sides.raw, sides.data_offset),
        Side::Ucrypt => (&sides.volume, 0),
    };
    load::run_queued(
        dev,
        base,
        sides.length,
        w.op,
        w.pattern,
        w.block,
        w.depth,
        secs,
    )
    .map_err(|e| crate::error::Error::Invalid(format!("{} {}: {e}", side.name(), w.name())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn workloads_are_named_as_rbd_sh_names_them() {
        let names: Vec<String> = rbd_workloads(32).iter().map(Workload::name).collect();
        assert_eq!(
            names,
            [
                "4k-randread-qd32",
                "4k-randwrite-qd32",
                "1M-read-qd32",
                "1M-write-qd32"
            ]
        );
        assert!(Workload::new("trim", 4096, 1).is_none());
        assert_eq!(
            Workload::new("read", 65536, 4).unwrap().name(),
            "64k-read-qd4"
        );
    }

    #[test]
    fn both_sides_of_a_file_table_complete_requests_and_cost_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        // 1 MiB of header, then a 4 MiB data area.
        std::fs::write(&path, vec![0u8; 5 << 20]).unwrap();
        let key = "0123456789abcdef".repeat(8);
        let line = format!(
            "0 8192 crypt aes-xts-plain64 {key} 0 {} 2048 1 sector_size:4096",
            path.display()
        );
        let sides = open_sides(&line, OpenOptions::default()).unwrap();
        assert_eq!((sides.data_offset, sides.length), (1 << 20, 4 << 20));
        // CPU time is read from getrusage around a 20 ms window: on a loaded machine one
        // window can see none of it, so the cost is asserted over all of them.
        let mut cpu_us = 0.0;
        for w in rbd_workloads(4) {
            for side in [Side::Raw, Side::Ucrypt] {
                let q = measure(&sides, side, &w, 0.02).unwrap();
                assert!(q.sample.ops > 0, "{} {}", side.name(), w.name());
                assert!(q.cpu_us >= 0.0, "{} {}", side.name(), w.name());
                cpu_us += q.cpu_us;
            }
        }
        assert!(cpu_us > 0.0, "no CPU time measured in any window");
        // The raw side stays inside the data area: the header's first MiB is untouched.
        let img = std::fs::read(&path).unwrap();
        assert!(img[..1 << 20].iter().all(|&b| b == 0));
        let too_big = Workload::new("read", 8 << 20, 1).unwrap();
        assert!(measure(&sides, Side::Raw, &too_big, 0.01).is_err());
    }
}
