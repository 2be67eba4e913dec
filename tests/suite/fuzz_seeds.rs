//! The fuzz targets' entry points (`keel_testing::fuzzing`) on the stable
//! toolchain: each over its whole seed corpus (`fuzz/corpus/<target>/`,
//! regression seeds included), then over a few thousand random mutations of
//! the seeds, from a fixed seed so that a failure repeats. Coverage-guided
//! fuzzing itself runs with `fuzz/run-briefly.sh` (nightly).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use keel_testing::fuzzing::TARGETS;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Mutated inputs per target.
const MUTATIONS: usize = 2_000;

/// Byte strings worth splicing in: the structure the parsers look for.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"data: ",
    b"event: ",
    b"error: ",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b"null",
    b"[DONE]",
    b"\xff",
    b"\xe2\x82",
    b"\\u0000",
    b"\\ud800",
    b"18446744073709551615",
    b"-1",
    b"1e999",
    b"\x01",
    b"\x00\x00\x00\x00\x00\x00\x00\x00",
    b"\xff\xff\xff\xff\xff\xff\xff\xff",
    b"=",
    b"[[",
    b"\"\"\"",
];

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let directory = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&directory)
        .unwrap_or_else(|error| panic!("{}: {error}", directory.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seeds in {}", directory.display());
    paths.iter().map(|path| std::fs::read(path).expect("seed")).collect()
}

/// Runs `entry` on `input`; a panic fails the test naming the input.
fn run(target: &str, entry: fn(&[u8]), what: &str, input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| entry(input))).is_err() {
        panic!(
            "fuzz target {target} panicked on {what}: {:?}",
            String::from_utf8_lossy(input)
        );
    }
}

fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut input = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=input.len());
        match rng.random_range(0..7) {
            // Flip a byte.
            0 if !input.is_empty() => {
                let index = rng.random_range(0..input.len());
                input[index] ^= 1 << rng.random_range(0..8);
            }
            // A random byte.
            1 => input.insert(at, rng.random()),
            // Cut a range out.
            2 if !input.is_empty() => {
                let end = rng.random_range(at..=input.len().min(at + 64));
                input.drain(at..end);
            }
            // Repeat a range.
            3 if !input.is_empty() => {
                let start = rng.random_range(0..input.len());
                let end = rng.random_range(start..=input.len().min(start + 64));
                let piece = input[start..end].to_vec();
                input.splice(at..at, piece);
            }
            // Truncate.
            4 => input.truncate(at),
            // A piece of another seed.
            5 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                if !other.is_empty() {
                    let start = rng.random_range(0..other.len());
                    let end = rng.random_range(start..=other.len());
                    input.splice(at..at, other[start..end].iter().copied());
                }
            }
            // A token the parsers look for.
            _ => {
                let token = TOKENS[rng.random_range(0..TOKENS.len())];
                input.splice(at..at, token.iter().copied());
            }
        }
    }
    input
}

#[test]
fn every_fuzz_target_survives_its_seeds_and_their_mutations() {
    for (index, (target, entry)) in TARGETS.iter().enumerate() {
        let seeds = corpus(target);
        for (number, seed) in seeds.iter().enumerate() {
            run(target, *entry, &format!("seed {number}"), seed);
        }
        let mut rng = StdRng::seed_from_u64(0x6b65_656c + index as u64);
        for round in 0..MUTATIONS {
            let input = mutate(&mut rng, &seeds);
            run(target, *entry, &format!("mutation {round}"), &input);
        }
    }
}

/// Inputs the fuzzers found that once failed, kept as a test of their own
/// (they are in the corpora too).
#[test]
fn regressions_found_by_fuzzing_stay_fixed() {
    let found: &[(&str, &[u8])] = &[
        // A log row whose last sequence is `u64::MAX`: `last + 1` overflowed
        // in `store::rows::decode_batch` (a panic with overflow checks).
        (
            "store_codec",
            b"\x01\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff\xff[]",
        ),
        (
            "store_codec",
            b"\xfe\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff\xff\xff\xff\xff\xff\
              [{\"submission_id\": null, \"msg\": {\"type\": \"warning\", \"message\": \"w\"}}]",
        ),
    ];
    for (target, input) in found {
        let (_, entry) = TARGETS.iter().find(|(name, _)| name == target).expect("a known target");
        run(target, *entry, "a regression", input);
    }
}
