//! Attaches a dm-crypt table's decrypted view to a kernel front end, for the kernel-lab
//! tests and benchmarks (the same front ends `ucrypt open DEV NAME --device ...` uses).
//!
//! ```text
//! attach ublk|nbd TABLE_FILE [--name NAME] [--workers N] [--recover DEV_ID|auto] [--no-recovery]
//!                            [--unpin-queues] [--poll-us N]
//!                            [--queues N] [--depth N] [--conns N] [--direct] [--ready FILE]
//!                            [--export volume|raw|zero]
//! ```
//!
//! TABLE_FILE holds one dm-crypt table line (`0 LEN crypt CIPHER KEY IV DEV OFFSET ...`,
//! what `ucrypt luksOpen --print-table` prints). Its performance flags (`no_read_workqueue`,
//! `no_write_workqueue`, `same_cpu_crypt`, `submit_from_crypt_cpus`) place the crypto as
//! `ucrypt open` places it (any of them replaces the automatic placement); `--direct` opens
//! the device with O_DIRECT; `--unpin-queues` lets ublk's queue threads run on any CPU
//! (`UblkOptions::pin_queues` off). The node (`/dev/ublkbN`, `/dev/nbdN`) is
//! printed on stdout once it serves, and written to `--ready FILE` (atomically). SIGTERM
//! or SIGINT detach (flush, remove the node) and exit; SIGKILL leaves a ublk device
//! waiting for `--recover N`.
//!
//! `--export` picks what the front end serves, for measuring the front end alone: `volume`
//! (the default) the table's decrypted view; `raw` the table's device as it is, no cipher
//! and no engine (dm-linear's role); `zero` nothing at all (reads of zeros, writes dropped:
//! dm-zero's role), so that only the front end's round trip is left.

use std::io::Write;
use std::sync::Arc;
use ucrypt_backend::file::{FileBackend, FileOptions};
use ucrypt_device::{AttachOptions, Attachment, FrontendKind};
use ucrypt_engine::{EngineOptions, Volume, VolumeConfig};
use ucrypt_format::{OptParam, TableLine, ValidateOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("attach: {e}");
        std::process::exit(1);
    }
}

fn arg_value(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(front), Some(table_file)) = (args.first(), args.get(1)) else {
        return Err("usage: attach ublk|nbd TABLE_FILE [options]".into());
    };
    let num = |name: &str, default: usize| -> Result<usize, String> {
        arg_value(&args, name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name}: not a number: {v}"))
        })
    };
    // Block the stop signals before any thread starts, so every thread inherits the mask
    // and sigwait below is the only taker.
    // SAFETY: sigset_t is plain data; the calls only write the set and the mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };

    let line = std::fs::read_to_string(table_file).map_err(|e| format!("{table_file}: {e}"))?;
    let table: TableLine = line.trim().parse().map_err(|e| format!("table: {e}"))?;
    let cipher = table
        .build_cipher(ValidateOptions::default())
        .map_err(|e| format!("table: {e}"))?;
    let file_opts = FileOptions {
        direct: args.iter().any(|a| a == "--direct"),
        ..FileOptions::default()
    };
    let backend: ucrypt_device::Export = Arc::new(
        FileBackend::open(table.device.to_string(), file_opts)
            .map_err(|e| format!("{}: {e}", table.device))?,
    );
    // The table's placement flags, as `ucrypt open` reads them (ucrypt::config).
    let mut engine = EngineOptions {
        no_read_workqueue: table.has(OptParam::NoReadWorkqueue),
        no_write_workqueue: table.has(OptParam::NoWriteWorkqueue),
        same_cpu_crypt: table.has(OptParam::SameCpuCrypt),
        submit_from_crypt_cpus: table.has(OptParam::SubmitFromCryptCpus),
        ..EngineOptions::default()
    };
    if engine.no_read_workqueue
        || engine.no_write_workqueue
        || engine.same_cpu_crypt
        || engine.submit_from_crypt_cpus
    {
        engine.auto = None;
    }
    let volume = Volume::with_options(
        Arc::from(cipher),
        Arc::clone(&backend),
        VolumeConfig {
            data_offset_bytes: table.offset_bytes(),
            length_bytes: table.length_bytes(),
            read_only: false,
            allow_discards: table.has(OptParam::AllowDiscards),
        },
        engine,
    )
    .map_err(|e| format!("volume: {e}"))?;
    let logical_block = table.sector_size_bytes();
    let export: ucrypt_device::Export = match arg_value(&args, "--export").as_deref() {
        None | Some("volume") => Arc::new(volume),
        // The raw export is the whole device: only a table that maps all of it from 0.
        Some("raw")
            if table.offset_bytes() == 0 && table.length_bytes() == backend.info().size_bytes =>
        {
            backend
        }
        Some("raw") => {
            return Err(format!(
                "--export raw: the table must map the whole device from offset 0 \
                 ({} bytes at {}; the device has {})",
                table.length_bytes(),
                table.offset_bytes(),
                backend.info().size_bytes
            ))
        }
        Some("zero") => Arc::new(ucrypt_backend::zero::ZeroBackend::new(table.length_bytes())),
        Some(other) => return Err(format!("--export: {other} (volume, raw or zero)")),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let opts = AttachOptions {
        name: arg_value(&args, "--name").unwrap_or_else(|| "attach".into()),
        read_only: false,
        logical_block,
        queues: u16::try_from(num("--queues", cpus)?).unwrap_or(1),
        queue_depth: u16::try_from(num("--depth", 128)?).unwrap_or(128),
        workers: num("--vq-workers", 0)?,
    };
    let attachment: Box<dyn Attachment> = match FrontendKind::from_name(front) {
        Some(FrontendKind::Ublk) => {
            let uopts = ucrypt_device::ublk::UblkOptions {
                workers: num("--workers", 0)?,
                spill: args.iter().any(|a| a == "--spill"),
                user_recovery: !args.iter().any(|a| a == "--no-recovery"),
                pin_queues: !args.iter().any(|a| a == "--unpin-queues"),
                poll: arg_value(&args, "--poll-us")
                    .map(|v| v.parse().map(std::time::Duration::from_micros))
                    .transpose()
                    .map_err(|_| "--poll-us: not a number".to_string())?,
            };
            let a = match arg_value(&args, "--recover") {
                Some(id) => {
                    // `--recover auto`: the waiting device of this instance name.
                    let id: u32 = if id == "auto" {
                        ucrypt_device::ublk::find_waiting(&opts.name)
                            .map_err(|e| e.to_string())?
                            .ok_or_else(|| format!("no ublk device of {} waits", opts.name))?
                    } else {
                        id.parse().map_err(|_| format!("--recover: {id}"))?
                    };
                    ucrypt_device::ublk::recover(export, id, &opts, &uopts)
                }
                None => ucrypt_device::ublk::attach(export, &opts, &uopts),
            }
            .map_err(|e| e.to_string())?;
            Box::new(a)
        }
        Some(FrontendKind::Nbd) => {
            let nopts = ucrypt_device::nbd_kernel::NbdOptions {
                connections: num("--conns", 1)?,
                workers: num("--workers", 8)?,
                ..Default::default()
            };
            Box::new(
                ucrypt_device::nbd_kernel::attach(export, &opts, &nopts)
                    .map_err(|e| e.to_string())?,
            )
        }
        _ => return Err(format!("unknown front end {front}")),
    };
    let node = attachment.node().display().to_string();
    if let Some(ready) = arg_value(&args, "--ready") {
        let tmp = format!("{ready}.tmp");
        std::fs::write(&tmp, format!("{node}\n")).map_err(|e| format!("{tmp}: {e}"))?;
        std::fs::rename(&tmp, &ready).map_err(|e| format!("{ready}: {e}"))?;
    }
    println!("{node}");
    let _ = std::io::stdout().flush();
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is an initialised signal set and `sig` a live int.
    unsafe { libc::sigwait(&set, &mut sig) };
    attachment.detach().map_err(|e| e.to_string())?;
    Ok(())
}
