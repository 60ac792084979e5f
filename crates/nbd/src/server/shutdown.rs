//! Stopping [`serve`] from another thread: [`Shutdown`] and the hooks it runs once.

use super::*;

type Hook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct ShutdownInner {
    triggered: AtomicBool,
    /// Run once on trigger: wake the accept loop, shut connections' read sides. A lock
    /// because `serve` registers while another thread may be triggering.
    hooks: Mutex<Vec<Hook>>,
}

/// A handle that stops [`serve`]: clone it into a signal thread or a supervisor.
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("triggered", &self.is_triggered())
            .finish()
    }
}

impl Shutdown {
    /// Asks the server to stop: no new connections or requests; in-flight requests finish,
    /// the export is flushed, [`serve`] returns. Idempotent.
    pub fn trigger(&self) {
        if self.inner.triggered.swap(true, Ordering::SeqCst) {
            return;
        }
        let hooks = std::mem::take(&mut *lock(&self.inner.hooks));
        for h in hooks {
            h();
        }
    }

    /// Whether [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// Runs `hook` on trigger (at once if already triggered).
    pub(super) fn on_trigger(&self, hook: Hook) {
        let mut hooks = lock(&self.inner.hooks);
        if self.is_triggered() {
            drop(hooks);
            hook();
        } else {
            hooks.push(hook);
        }
    }
}
