//! Where every option goes: the one file that maps table-line parameters and command-line
//! `--perf-*` flags onto the engine's options.
//!
//! | source | option | engine field |
//! |---|---|---|
//! | table / `--perf-no_read_workqueue` | `no_read_workqueue` | `EngineOptions::no_read_workqueue` |
//! | table / `--perf-no_write_workqueue` | `no_write_workqueue` | `EngineOptions::no_write_workqueue` |
//! | table / `--perf-same_cpu_crypt` | `same_cpu_crypt` | `EngineOptions::same_cpu_crypt` |
//! | table / `--perf-submit_from_crypt_cpus` | `submit_from_crypt_cpus` | `EngineOptions::submit_from_crypt_cpus` |
//! | `--write-order issue\|sorted` | — | `EngineOptions::write_order` |
//! | `--split-bytes N` | — (kernel: 128 KiB) | `EngineOptions::split_bytes` |
//! | `--workers N` | — (kernel: one per CPU) | `EngineOptions::workers` |
//! | `--placement auto\|kernel` | — | `EngineOptions::auto` |
//! | table `allow_discards` | | `VolumeConfig::allow_discards` |
//! | table `sector_size`, `iv_large_sectors`, `iv_offset` | | `SectorParams` (crypto) |
//!
//! Without any placement flag ucrypt uses its automatic policy (measured best, see
//! BENCHMARKING.md); any dm-crypt placement flag, or `--placement kernel`, switches to
//! dm-crypt's fixed behaviour with those flags.

use ucrypt_engine::EngineOptions;
pub use ucrypt_engine::WriteOrder;
use ucrypt_format::{OptParam, TableLine};

/// Placement policy choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// Automatic unless a dm-crypt placement flag is given.
    #[default]
    Auto,
    /// dm-crypt's fixed placement (workqueues unless the flags say inline).
    Kernel,
}

/// Engine settings from the command line (cryptsetup's `--perf-*` and ucrypt's own); a
/// running instance receives them with `refresh` (serde).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PerfOptions {
    /// `--perf-no_read_workqueue`.
    pub no_read_workqueue: bool,
    /// `--perf-no_write_workqueue`.
    pub no_write_workqueue: bool,
    /// `--perf-same_cpu_crypt`.
    pub same_cpu_crypt: bool,
    /// `--perf-submit_from_crypt_cpus`.
    pub submit_from_crypt_cpus: bool,
    /// `--write-order`.
    #[serde(with = "write_order")]
    pub write_order: WriteOrder,
    /// `--split-bytes`.
    pub split_bytes: Option<usize>,
    /// `--workers`.
    pub workers: Option<usize>,
    /// `--placement`.
    pub placement: PlacementPolicy,
}

impl PerfOptions {
    /// The libcryptsetup activation flags of the dm-crypt placement options, as
    /// cryptsetup stores them in a LUKS2 header on `open --persistent`
    /// ([`crate::luks::store_persistent_flags`]).
    pub fn activation_flags(&self) -> u32 {
        let mut f = 0;
        for (on, flag) in [
            (
                self.no_read_workqueue,
                ucrypt_cryptsetup::ACTIVATE_NO_READ_WORKQUEUE,
            ),
            (
                self.no_write_workqueue,
                ucrypt_cryptsetup::ACTIVATE_NO_WRITE_WORKQUEUE,
            ),
            (
                self.same_cpu_crypt,
                ucrypt_cryptsetup::ACTIVATE_SAME_CPU_CRYPT,
            ),
            (
                self.submit_from_crypt_cpus,
                ucrypt_cryptsetup::ACTIVATE_SUBMIT_FROM_CRYPT_CPUS,
            ),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }
}

/// [`WriteOrder`] by its `--write-order` name (the engine carries no serde).
mod write_order {
    use serde::{Deserialize, Deserializer, Serializer};
    use ucrypt_engine::WriteOrder;

    pub(super) fn serialize<S: Serializer>(w: &WriteOrder, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match w {
            WriteOrder::Issue => "issue",
            WriteOrder::Sorted => "sorted",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<WriteOrder, D::Error> {
        match String::deserialize(d)?.as_str() {
            "issue" => Ok(WriteOrder::Issue),
            "sorted" => Ok(WriteOrder::Sorted),
            other => Err(serde::de::Error::custom(format!(
                "unknown write order {other:?} (issue or sorted)"
            ))),
        }
    }
}

/// Merges the table's flags and the command line's into engine options.
pub fn engine_options(table: Option<&TableLine>, perf: &PerfOptions) -> EngineOptions {
    let has = |p: OptParam| table.is_some_and(|t| t.has(p));
    let no_read = perf.no_read_workqueue || has(OptParam::NoReadWorkqueue);
    let no_write = perf.no_write_workqueue || has(OptParam::NoWriteWorkqueue);
    let same_cpu = perf.same_cpu_crypt || has(OptParam::SameCpuCrypt);
    let from_crypt = perf.submit_from_crypt_cpus || has(OptParam::SubmitFromCryptCpus);
    let explicit = no_read || no_write || same_cpu || from_crypt;
    let defaults = EngineOptions::default();
    EngineOptions {
        no_read_workqueue: no_read,
        no_write_workqueue: no_write,
        same_cpu_crypt: same_cpu,
        submit_from_crypt_cpus: from_crypt,
        write_order: perf.write_order,
        split_bytes: perf.split_bytes.unwrap_or(defaults.split_bytes),
        workers: perf.workers.unwrap_or(defaults.workers),
        auto: if explicit || perf.placement == PlacementPolicy::Kernel {
            None
        } else {
            defaults.auto
        },
        pool: defaults.pool,
        worker_nice: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(opts: &str) -> TableLine {
        format!("0 8 crypt cipher_null-ecb - 0 d 0{opts}")
            .parse()
            .unwrap()
    }

    #[test]
    fn no_flags_means_the_automatic_policy() {
        let o = engine_options(Some(&table("")), &PerfOptions::default());
        assert!(o.auto.is_some());
    }

    #[test]
    fn table_flags_switch_to_dm_crypt_placement() {
        let o = engine_options(
            Some(&table(" 2 no_read_workqueue same_cpu_crypt")),
            &PerfOptions::default(),
        );
        assert!(
            o.auto.is_none() && o.no_read_workqueue && o.same_cpu_crypt && !o.no_write_workqueue
        );
    }

    #[test]
    fn perf_flags_add_to_the_table() {
        let perf = PerfOptions {
            submit_from_crypt_cpus: true,
            ..Default::default()
        };
        let o = engine_options(Some(&table(" 1 no_write_workqueue")), &perf);
        assert!(o.auto.is_none() && o.no_write_workqueue && o.submit_from_crypt_cpus);
        let perf = PerfOptions {
            placement: PlacementPolicy::Kernel,
            ..Default::default()
        };
        assert!(engine_options(None, &perf).auto.is_none());
    }
}
