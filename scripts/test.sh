#!/usr/bin/env bash
# Runs every check CI runs: set-up, formatting, lints, all tests (golden vectors are
# mandatory when CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --all-targets --quiet
cargo test --workspace --doc --quiet
