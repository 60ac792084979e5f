//! Serves a 64 MiB in-memory disk over NBD on a unix socket until SIGINT/SIGTERM:
//!
//! ```text
//! cargo run -p ucrypt-nbd --example serve_memory -- /tmp/mem.sock
//! nbdinfo 'nbd+unix:///?socket=/tmp/mem.sock'
//! ```
//!
//! Any `Backend` can be served the same way; `ucrypt open` serves the decrypted `Volume`.

use std::sync::Arc;
use ucrypt_nbd::{serve, Listener, ServeOptions, Shutdown};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/ucrypt-memory.sock".into());
    // Before any other thread starts, so only the signal thread takes SIGINT/SIGTERM.
    let shutdown = Shutdown::default();
    ucrypt_nbd::server::shutdown_on_signals(&shutdown)?;
    let export = Arc::new(ucrypt_backend::MemoryBackend::new(64 << 20)?);
    let listener = Listener::bind_unix(&path)?;
    println!("{}", listener.uri());
    serve(
        listener,
        export,
        ServeOptions {
            shutdown,
            ..ServeOptions::default()
        },
    )?;
    Ok(())
}
