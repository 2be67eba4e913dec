#!/usr/bin/env bash
# Runs every cargo-fuzz target briefly: N seconds each (the first argument,
# default 20), starting from its seed corpus, failing on any crash.
#
# Needs a nightly toolchain (`cargo +nightly`); without one it says so and
# exits 0: the stable test `cargo test --test all fuzz_seeds` already ran
# every target over its seeds and their mutations.
#
#   fuzz/run-briefly.sh        # 20 s per target
#   fuzz/run-briefly.sh 600    # 10 min per target
set -euo pipefail

seconds="${1:-20}"
fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$fuzz_dir"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "=================================================================" >&2
    echo "fuzz/run-briefly.sh: NO NIGHTLY TOOLCHAIN (cargo +nightly failed)." >&2
    echo "cargo-fuzz needs nightly; the fuzz targets did NOT run." >&2
    echo "Install one with: rustup toolchain install nightly" >&2
    echo "=================================================================" >&2
    exit 0
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# The targets' own directory, not a shared CARGO_TARGET_DIR: sanitizer
# builds would otherwise replace the regular ones.
unset CARGO_TARGET_DIR

targets=$(cargo +nightly fuzz list)
cargo +nightly fuzz build
status=0
for target in $targets; do
    echo "--- fuzzing $target for ${seconds}s" >&2
    mkdir -p "corpus/$target" "target/run-corpus/$target"
    # New inputs go to a scratch corpus; the committed seeds stay as they are.
    if ! cargo +nightly fuzz run "$target" "target/run-corpus/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1; then
        echo "fuzz target $target FAILED: see fuzz/artifacts/$target/" >&2
        status=1
    fi
done
exit "$status"
