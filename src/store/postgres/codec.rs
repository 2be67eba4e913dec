//! How JSON values are stored: `bytea` holding JSON text, or an LZ4 block
//! when that pays.
//!
//! Why `bytea` and not `jsonb`: nothing queries inside these values (the
//! columns a query needs, such as the bot or the sequences, have their own),
//! so `jsonb` would only cost the server a parse on every commit and a
//! re-serialization on every read, on the same CPUs the runtime uses, and
//! would not keep the bytes as written. A batch of events repeats its turn
//! and submission ids in every event, so compressing it here sends and logs
//! several times fewer bytes (PostgreSQL's own TOAST compression only starts
//! at 2 kB, after the bytes crossed the wire). The format is the SQLite
//! store's: plain JSON (which starts with `{` or `[`), or the tag `1`, the
//! uncompressed length (`u32`, little endian) and the block.

/// Values shorter than this are stored as they are.
const COMPRESS_FROM_BYTES: usize = 512;

/// The tag of an LZ4-compressed value.
const LZ4_BLOCK: u8 = 1;

/// The largest value a stored one may expand to; guards against a damaged
/// length making the reader allocate without bound.
const MAX_EXPANDED_BYTES: usize = 256 * 1024 * 1024;

/// The stored form of `json`.
pub(super) fn encode(json: String) -> Vec<u8> {
    if json.len() < COMPRESS_FROM_BYTES {
        return json.into_bytes();
    }
    let Ok(length) = u32::try_from(json.len()) else {
        return json.into_bytes();
    };
    let compressed = lz4_flex::block::compress(json.as_bytes());
    if compressed.len() + 5 >= json.len() {
        return json.into_bytes();
    }
    let mut stored = Vec::with_capacity(compressed.len() + 5);
    stored.push(LZ4_BLOCK);
    stored.extend_from_slice(&length.to_le_bytes());
    stored.extend_from_slice(&compressed);
    stored
}

/// The JSON bytes of a stored value, or why it is not one.
pub(super) fn decode(stored: &[u8]) -> Result<Vec<u8>, String> {
    match stored {
        [LZ4_BLOCK, rest @ ..] => {
            let (length, block) = rest.split_first_chunk::<4>().ok_or("truncated compressed value")?;
            let length = u32::from_le_bytes(*length) as usize;
            if length > MAX_EXPANDED_BYTES {
                return Err(format!("compressed value claims {length} bytes"));
            }
            let mut json = vec![0; length];
            match lz4_flex::block::decompress_into(block, &mut json) {
                Ok(written) if written == length => Ok(json),
                Ok(written) => Err(format!("compressed value expands to {written} bytes, not {length}")),
                Err(error) => Err(format!("cannot decompress: {error}")),
            }
        }
        plain => Ok(plain.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_round_trip_compressed_and_small_ones_stay_plain() {
        let small = r#"{"a":1}"#.to_owned();
        assert_eq!(encode(small.clone()), small.clone().into_bytes());
        let large = format!("[{}]", vec![r#"{"turn_id":"0193-aaaa","delta":"x"}"#; 100].join(","));
        let stored = encode(large.clone());
        assert_eq!(stored[0], LZ4_BLOCK);
        assert!(stored.len() < large.len() / 4, "{} of {}", stored.len(), large.len());
        assert_eq!(decode(&stored), Ok(large.into_bytes()));
        assert_eq!(decode(small.as_bytes()), Ok(small.into_bytes()));
    }

    #[test]
    fn damaged_compressed_values_are_errors_not_allocations() {
        let mut huge_claim = vec![LZ4_BLOCK];
        huge_claim.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge_claim).is_err());
        assert!(decode(&[LZ4_BLOCK, 1, 0]).is_err());
        assert!(decode(&[LZ4_BLOCK, 10, 0, 0, 0, 0xff, 0xff]).is_err());
    }
}
