//! The engine's knobs, named as dm-crypt names them so a grep finds the kernel concept.
//!
//! | field | dm-crypt | meaning here |
//! |---|---|---|
//! | `no_read_workqueue` | same | decrypt reads in the thread that received them |
//! | `no_write_workqueue` | same | encrypt (and submit) writes in the receiving thread |
//! | `same_cpu_crypt` | same | a request's crypto goes to the worker pinned to the receiving thread's CPU; off = any idle worker (the unbound workqueue) |
//! | `submit_from_crypt_cpus` | same | workers write their encrypted chunks themselves; off = one ordered submitter |
//! | `write_order` | (2013 patches) | the submitter releases writes in issue order (Tejun Heo) or sorted by sector (Mikulas Patocka's rb-tree) |
//! | `split_bytes` | (max crypt chunk) | large requests are cut into chunks of this size for the workers |
//! | `auto` | — | beyond dm-crypt: choose inline or split per request |

/// Order in which the ordered submitter releases encrypted writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteOrder {
    /// Issue order, each request (plug) released whole when its last chunk is encrypted.
    #[default]
    Issue,
    /// Whatever is ready, sorted by sector before submission.
    Sorted,
}

/// Where one request's crypto runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In the thread that received the request.
    Inline,
    /// On the worker pool, cut into `split_bytes` chunks (one chunk for small requests);
    /// dm-crypt's workqueue.
    Workers,
    /// Cut into `split_bytes` chunks shared by the workers and the receiving thread, which
    /// works too and submits the write itself (the automatic policy's choice for large
    /// requests).
    Split,
}

/// How buffers for encrypted writes are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Buffers allocated up front, all at once.
    pub buffers: usize,
    /// Bytes per buffer (requests larger than this use several).
    pub buffer_bytes: usize,
    /// Allocate a fresh buffer per request instead (the 2022 per-page-allocation baseline,
    /// for the `alloc` benchmark only).
    pub per_request_alloc: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        // Why these bounds: 64 × 256 KiB = 16 MiB caps the memory held for writes in
        // flight; more concurrent writers wait (backpressure) instead of allocating.
        PoolOptions {
            buffers: 64,
            buffer_bytes: 256 * 1024,
            per_request_alloc: false,
        }
    }
}

/// The automatic placement policy (beyond dm-crypt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoPolicy {
    /// Requests at least this large are split across workers when CPUs are idle.
    pub split_min_bytes: usize,
}

impl Default for AutoPolicy {
    fn default() -> Self {
        AutoPolicy {
            split_min_bytes: 256 * 1024,
        }
    }
}

/// Every engine option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Decrypt reads inline (dm-crypt `no_read_workqueue`).
    pub no_read_workqueue: bool,
    /// Encrypt writes inline (dm-crypt `no_write_workqueue`).
    pub no_write_workqueue: bool,
    /// Keep a request's crypto on the receiving CPU's worker (dm-crypt `same_cpu_crypt`).
    pub same_cpu_crypt: bool,
    /// Workers submit writes themselves, unordered (dm-crypt `submit_from_crypt_cpus`).
    pub submit_from_crypt_cpus: bool,
    /// Release order of the ordered submitter.
    pub write_order: WriteOrder,
    /// Chunk size for splitting requests across workers (the kernel's default is 128 KiB).
    pub split_bytes: usize,
    /// Worker threads (default: one per CPU).
    pub workers: usize,
    /// Automatic placement; when set it overrides the workqueue flags per request.
    pub auto: Option<AutoPolicy>,
    /// Write buffers.
    pub pool: PoolOptions,
    /// How many nice levels the workers run below the thread that starts them (0: the
    /// same priority). Reencryption's `journal` pass lowers them so its I/O thread, whose
    /// chain of writes and syncs bounds the pass, gets a CPU as soon as it wakes.
    pub worker_nice: i32,
}

impl Default for EngineOptions {
    /// The measured default: automatic placement (see BENCHMARKING.md).
    fn default() -> Self {
        EngineOptions {
            no_read_workqueue: false,
            no_write_workqueue: false,
            same_cpu_crypt: false,
            submit_from_crypt_cpus: false,
            write_order: WriteOrder::Issue,
            split_bytes: 128 * 1024,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            auto: Some(AutoPolicy::default()),
            pool: PoolOptions::default(),
            worker_nice: 0,
        }
    }
}

impl EngineOptions {
    /// dm-crypt's behaviour: everything through the worker pool, ordered submission.
    pub fn kernel_default() -> Self {
        EngineOptions {
            auto: None,
            ..Self::default()
        }
    }

    /// Whether the engine needs worker threads at all.
    pub fn needs_workers(&self) -> bool {
        self.auto.is_some() || !self.no_read_workqueue || !self.no_write_workqueue
    }
}
