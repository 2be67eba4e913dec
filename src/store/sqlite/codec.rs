//! How JSON values are stored: as text, or compressed when that pays.
//!
//! A batch of events repeats its turn and submission ids in every event, so
//! it compresses several times over; fewer bytes are fewer pages for each
//! commit to write. Small values stay plain JSON text. A compressed value is
//! a blob: the format tag, the uncompressed length (`u32`, little endian),
//! then an LZ4 block.

use rusqlite::types::{Value, ValueRef};

/// Values shorter than this are stored as text.
const COMPRESS_FROM_BYTES: usize = 512;

/// The tag of an LZ4-compressed value.
const LZ4_BLOCK: u8 = 1;

/// The largest value a stored blob may expand to; guards against a damaged
/// length making the reader allocate without bound.
const MAX_EXPANDED_BYTES: usize = 256 * 1024 * 1024;

/// The stored form of `json`.
pub(super) fn encode(json: String) -> Value {
    if json.len() < COMPRESS_FROM_BYTES {
        return Value::Text(json);
    }
    let Ok(length) = u32::try_from(json.len()) else {
        return Value::Text(json);
    };
    let compressed = lz4_flex::block::compress(json.as_bytes());
    if compressed.len() + 5 >= json.len() {
        return Value::Text(json);
    }
    let mut blob = Vec::with_capacity(compressed.len() + 5);
    blob.push(LZ4_BLOCK);
    blob.extend_from_slice(&length.to_le_bytes());
    blob.extend_from_slice(&compressed);
    Value::Blob(blob)
}

/// The JSON bytes of a stored value, or why it is not one.
pub(super) fn decode(value: ValueRef<'_>) -> Result<Vec<u8>, String> {
    match value {
        ValueRef::Text(bytes) => Ok(bytes.to_vec()),
        ValueRef::Blob([LZ4_BLOCK, rest @ ..]) => {
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
        // Plain JSON stored as a blob (written by another tool) is accepted.
        ValueRef::Blob(bytes) => Ok(bytes.to_vec()),
        other => Err(format!("expected JSON, found {}", other.data_type())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_round_trip_compressed_and_small_ones_stay_text() {
        let small = r#"{"a":1}"#.to_owned();
        assert_eq!(encode(small.clone()), Value::Text(small));
        let large = format!("[{}]", vec![r#"{"turn_id":"0193-aaaa","delta":"x"}"#; 100].join(","));
        let Value::Blob(blob) = encode(large.clone()) else {
            panic!("expected a compressed blob")
        };
        assert!(blob.len() < large.len() / 4, "{} of {}", blob.len(), large.len());
        assert_eq!(decode(ValueRef::Blob(&blob)), Ok(large.into_bytes()));
    }

    #[test]
    fn damaged_compressed_values_are_errors_not_allocations() {
        let mut huge_claim = vec![LZ4_BLOCK];
        huge_claim.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(ValueRef::Blob(&huge_claim)).is_err());
        assert!(decode(ValueRef::Blob(&[LZ4_BLOCK, 1, 0])).is_err());
        assert!(decode(ValueRef::Blob(&[LZ4_BLOCK, 10, 0, 0, 0, 0xff, 0xff])).is_err());
        assert!(decode(ValueRef::Integer(42)).is_err());
    }
}
