use super::queue::{execute, QueueLoad, Request};
use super::*;
use std::sync::Arc;
use ucrypt_backend::{BackendInfo, Caps, IoKind, MemoryBackend};

fn opts(logical_block: u32, read_only: bool) -> AttachOptions {
    AttachOptions {
        name: "t".into(),
        read_only,
        logical_block,
        queues: 1,
        queue_depth: 4,
        workers: 0,
    }
}

fn req(op: u32, offset: u64, len: u64) -> Request {
    Request {
        op,
        fua: false,
        offset,
        len,
        client: 1,
    }
}

/// A backend that records which operations reached it, over a memory backend.
struct Recorder {
    inner: MemoryBackend,
    info: BackendInfo,
    calls: Mutex<Vec<String>>,
}

impl Recorder {
    fn new(size: u64, discard: Support, write_zeroes: Support) -> Self {
        let inner = MemoryBackend::new(size).expect("memory backend");
        let mut info = inner.info().clone();
        info.logical_block = 4096;
        info.caps = Caps {
            flush: Support::Native,
            discard,
            write_zeroes,
            read_only: false,
        };
        Recorder {
            inner,
            info,
            calls: Mutex::new(Vec::new()),
        }
    }
    fn log(&self, s: String) {
        self.calls.lock().expect("lock").push(s);
    }
}

impl Backend for Recorder {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let (offset, fua) = (io.offset, io.fua);
        match io.kind {
            IoKind::Read(buf) => {
                self.log(format!("read {offset} {}", buf.len()));
                self.inner.read_at(buf, offset)
            }
            IoKind::Write(buf) => {
                self.log(format!("write {offset} {} fua={fua}", buf.len()));
                self.inner.write_at(buf, offset, fua)
            }
            IoKind::Discard(len) => {
                self.log(format!("discard {offset} {len}"));
                Ok(())
            }
            IoKind::WriteZeroes(len) => {
                self.log(format!("zeroes {offset} {len} fua={fua}"));
                Ok(())
            }
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.log("flush".into());
        Ok(())
    }
}

#[test]
fn params_follow_the_volume() {
    let b = Recorder::new(1 << 20, Support::None, Support::Emulate);
    let p = device_params(&b, &opts(4096, false));
    assert_eq!(p.basic.logical_bs_shift, 12, "logical block = sector size");
    assert_eq!(p.basic.dev_sectors, (1 << 20) >> 9);
    assert_ne!(
        p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE,
        0,
        "flush reaches us"
    );
    assert_ne!(p.basic.attrs & sys::UBLK_ATTR_FUA, 0);
    assert_eq!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
    assert_eq!(
        p.discard.max_discard_sectors, 0,
        "no discard without allow_discards"
    );
    assert_ne!(p.discard.max_write_zeroes_sectors, 0);
    assert_eq!(p.discard.max_discard_segments, 1, "the driver wants 1");

    let b = Recorder::new(1 << 20, Support::Native, Support::Native);
    let p = device_params(&b, &opts(512, true));
    assert_eq!(
        p.basic.logical_bs_shift, 12,
        "never below the backend's block"
    );
    assert_ne!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
    assert_eq!(
        p.types & sys::UBLK_PARAM_TYPE_DISCARD,
        0,
        "read-only: no discard"
    );
}

#[test]
fn requests_map_to_backend_calls() {
    let b = Recorder::new(1 << 20, Support::Native, Support::Native);
    let mut buf = vec![0x5au8; 64 * 1024];
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_WRITE, 8192, 4096), &mut buf),
        4096
    );
    let mut fua = req(sys::UBLK_IO_OP_WRITE, 0, 4096);
    fua.fua = true;
    assert_eq!(execute(&b, fua, &mut buf), 4096);
    buf.fill(0);
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_READ, 8192, 4096), &mut buf),
        4096
    );
    assert!(
        buf[..4096].iter().all(|&x| x == 0x5a),
        "read back what was written"
    );
    assert_eq!(execute(&b, req(sys::UBLK_IO_OP_FLUSH, 0, 0), &mut buf), 0);
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_DISCARD, 0, 8192), &mut buf),
        0
    );
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_WRITE_ZEROES, 4096, 4096), &mut buf,),
        0
    );
    let calls = b.calls.lock().expect("lock").clone();
    assert_eq!(
        calls,
        [
            "write 8192 4096 fua=false",
            "write 0 4096 fua=true",
            "read 8192 4096",
            "flush",
            "discard 0 8192",
            "zeroes 4096 4096 fua=false"
        ]
    );
}

#[test]
fn bad_requests_are_refused_not_served() {
    let b = Recorder::new(1 << 20, Support::Native, Support::Native);
    let mut buf = vec![0u8; 8192];
    // Past the end, larger than the buffer, overflowing, unknown op.
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_READ, 1 << 20, 4096), &mut buf,),
        -libc::EINVAL
    );
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_WRITE, 0, 16384), &mut buf),
        -libc::EINVAL
    );
    assert_eq!(
        execute(
            &b,
            req(sys::UBLK_IO_OP_DISCARD, u64::MAX - 10, 4096),
            &mut buf,
        ),
        -libc::EINVAL
    );
    assert_eq!(
        execute(&b, req(sys::UBLK_IO_OP_ZONE_OPEN, 0, 4096), &mut buf),
        -libc::EOPNOTSUPP
    );
    assert!(
        b.calls.lock().expect("lock").is_empty(),
        "nothing reached the backend"
    );
    // A backend error comes back as its errno.
    let ro = MemoryBackend::new(1 << 20).expect("memory");
    let ro = ucrypt_backend::FaultyBackend::new(Arc::new(ro));
    ro.fail_writes_in(0..4096);
    let res = execute(&ro, req(sys::UBLK_IO_OP_WRITE, 0, 4096), &mut buf);
    assert!(res < 0, "a failed write is not acknowledged: {res}");
}

#[test]
fn write_zeroes_without_backend_support_writes_zeroes() {
    let b = Recorder::new(1 << 20, Support::None, Support::None);
    let mut buf = vec![0x77u8; 8192];
    b.inner.write_at(&[0xffu8; 20480], 0, false).expect("fill");
    let mut r = req(sys::UBLK_IO_OP_WRITE_ZEROES, 0, 20480);
    r.fua = true;
    assert_eq!(execute(&b, r, &mut buf), 0);
    let mut back = vec![1u8; 20480];
    b.inner.read_at(&mut back, 0).expect("read");
    assert!(back.iter().all(|&x| x == 0));
    let calls = b.calls.lock().expect("lock").clone();
    assert_eq!(
        calls,
        ["write 0 20480 fua=false", "flush"],
        "zero-filled writes (backend::emulate), FUA as one flush after them"
    );
}

fn cpu_count(s: &libc::cpu_set_t) -> i32 {
    // SAFETY: CPU_COUNT only reads the live set it is given.
    unsafe { libc::CPU_COUNT(s) }
}

fn cpu_isset(c: usize, s: &libc::cpu_set_t) -> bool {
    // SAFETY: CPU_ISSET only reads the live set it is given (c < CPU_SETSIZE is checked
    // by the macro).
    unsafe { libc::CPU_ISSET(c, s) }
}

/// Pins the calling thread to `cpu`; returns sched_setaffinity's result.
fn pin_self_to(cpu: usize) -> i32 {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes into that live set;
    // sched_setaffinity of the calling thread (0) reads a set of the size passed.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
    }
}

/// A thread pinned to one CPU (as libublk pins each queue thread) may run on every CPU
/// the process may after `unpin_threads` (what `start` does once the device is live,
/// unless `pin_queues`).
#[test]
fn unpinned_threads_may_run_on_every_allowed_cpu() {
    let allowed = super::queue::allowed_cpus().expect("sched_getaffinity");
    let first = (0..libc::CPU_SETSIZE as usize)
        .find(|&c| cpu_isset(c, &allowed))
        .expect("some CPU is allowed");
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let pinned = pin_self_to(first);
        let mine = super::queue::allowed_cpus().expect("sched_getaffinity");
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        tid_tx.send((tid, pinned, cpu_count(&mine))).expect("send");
        go_rx.recv().expect("go");
        super::queue::allowed_cpus().expect("sched_getaffinity")
    });
    let (tid, pinned, pinned_count) = tid_rx.recv().expect("tid");
    assert_eq!(pinned, 0, "pinning the thread to CPU {first}");
    assert_eq!(pinned_count, 1, "the thread was pinned to one CPU");
    super::queue::unpin_threads(&[tid], &allowed);
    go_tx.send(()).expect("go");
    let after = t.join().expect("thread");
    assert_eq!(
        cpu_count(&after),
        cpu_count(&allowed),
        "the thread's CPUs after unpinning"
    );
    assert!(
        (0..libc::CPU_SETSIZE as usize).all(|c| cpu_isset(c, &after) == cpu_isset(c, &allowed)),
        "the thread may run on exactly the process's CPUs"
    );
}

/// `UblkOptions::spill`'s choice: a request ready alone runs inline; of a burst woken
/// together, about `workers / (workers + 1)` go to the workers, whatever order the tasks
/// run in, and once that share is out the rest stay inline.
#[test]
fn spill_sends_a_share_of_a_burst_and_never_a_lone_request() {
    use std::cell::RefCell;
    use std::rc::Rc;
    for (workers, burst, want) in [
        (1, 1, 0),
        (3, 1, 0),
        (1, 2, 1),
        (1, 8, 4),
        (3, 8, 6),
        (1, 32, 16),
    ] {
        let load = Rc::new(QueueLoad::default());
        let spilled = Rc::new(RefCell::new(Vec::new()));
        let exe = smol::LocalExecutor::new();
        let tasks: Vec<_> = (0..burst)
            .map(|_| {
                let (load, spilled) = (Rc::clone(&load), Rc::clone(&spilled));
                exe.spawn(async move {
                    let s = load.spill(workers).await;
                    spilled.borrow_mut().push(s);
                })
            })
            .collect();
        while exe.try_tick() {}
        assert!(
            tasks.iter().all(|t| t.is_finished()),
            "a task did not finish"
        );
        let n = spilled.borrow().iter().filter(|&&s| s).count();
        assert_eq!(n, want, "{workers} workers, a burst of {burst}");
        assert_eq!(load.offloaded.get(), want, "offloaded count");
        // The burst is served: a request arriving alone now runs inline.
        load.offloaded.set(0);
        let lone = exe.spawn({
            let load = Rc::clone(&load);
            async move { load.spill(workers).await }
        });
        while exe.try_tick() {}
        assert!(!smol::block_on(lone), "a lone request was handed off");
    }
}
