#!/usr/bin/env bash
# Runs every check CI runs: set-up, formatting, lints, all tests (golden vectors are
# mandatory when CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
# No module of any crate uses a module that uses it back (ARCHITECTURE.md).
python3 scripts/module-cycles.py crates/*/src
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The developers' documentation builds without a broken link (about 20 s).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --quiet
# --no-fail-fast: one failing test binary must not hide the results of the others.
cargo test --workspace --all-targets --quiet --no-fail-fast
cargo test --workspace --doc --quiet
