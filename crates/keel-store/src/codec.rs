//! How JSON values are stored, by every backend: as they are, or as an LZ4
//! block when that pays.
//!
//! A batch of events repeats its turn and submission ids in every event, so
//! it compresses several times over; fewer bytes are fewer pages for each
//! commit to write (and, on PostgreSQL, fewer bytes on the wire: its own
//! TOAST compression starts at 2 kB, after they crossed it). Small values
//! stay plain JSON. A compressed value is the tag `1` (plain JSON starts
//! with `{`, `[` or `"`), the uncompressed length (`u32`, little endian),
//! then the block.

/// Values shorter than this are stored as they are.
const COMPRESS_FROM_BYTES: usize = 512;

/// The tag of an LZ4-compressed value.
const LZ4_BLOCK: u8 = 1;

/// The largest value a stored one may expand to; guards against a damaged
/// length making the reader allocate without bound.
const MAX_EXPANDED_BYTES: usize = 256 * 1024 * 1024;

/// A JSON value in its stored form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The JSON text itself.
    Plain(String),
    /// The tagged LZ4 block.
    Compressed(Vec<u8>),
}

impl Stored {
    /// The stored bytes, for a backend that keeps both forms in one column
    /// (and for a notice that carries them).
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        match self {
            Stored::Plain(json) => json.into_bytes(),
            Stored::Compressed(bytes) => bytes,
        }
    }
}

/// The stored form of `json`.
pub(crate) fn encode(json: String) -> Stored {
    if json.len() < COMPRESS_FROM_BYTES {
        return Stored::Plain(json);
    }
    let Ok(length) = u32::try_from(json.len()) else {
        return Stored::Plain(json);
    };
    let compressed = lz4_flex::block::compress(json.as_bytes());
    if compressed.len() + 5 >= json.len() {
        return Stored::Plain(json);
    }
    let mut stored = Vec::with_capacity(compressed.len() + 5);
    stored.push(LZ4_BLOCK);
    stored.extend_from_slice(&length.to_le_bytes());
    stored.extend_from_slice(&compressed);
    Stored::Compressed(stored)
}

/// The JSON bytes of stored bytes (either form), or why they are not one.
pub(crate) fn decode(stored: &[u8]) -> Result<Vec<u8>, String> {
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

/// JSON values joined into one JSON array, in order.
pub(crate) fn json_array(values: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let mut array = String::from("[");
    for (index, value) in values.into_iter().enumerate() {
        if index > 0 {
            array.push(',');
        }
        array.push_str(value.as_ref());
    }
    array.push(']');
    array
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_round_trip_compressed_and_small_ones_stay_plain() {
        let small = r#"{"a":1}"#.to_owned();
        assert_eq!(encode(small.clone()), Stored::Plain(small.clone()));
        let large = json_array(vec![r#"{"turn_id":"0193-aaaa","delta":"x"}"#; 100]);
        let Stored::Compressed(stored) = encode(large.clone()) else {
            panic!("expected a compressed value")
        };
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
