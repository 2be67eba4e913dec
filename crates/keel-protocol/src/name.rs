//! The one rule for names a URL path carries: session ids (and so chat and
//! thread ids) and tenant names.

/// [`is_path_name`] as a JSON Schema pattern, for the API's description.
pub const PATH_NAME_PATTERN: &str = r"^[ -$&-~]+$";

/// Whether `name` is 1 to `max` printable ASCII characters (space
/// included) other than `%`.
///
/// Printable ASCII keeps the bound the same in bytes and in characters and
/// the name safe in headers, directory names and metric labels. `%` is out
/// because clients disagree on percent-encoding a path: some send `%41`
/// as it is, some decode it first. A name without `%` is the same name
/// either way, so no client can reach `aA` by asking for `a%41`.
pub fn is_path_name(name: &str, max: usize) -> bool {
    !name.is_empty() && name.len() <= max && name.bytes().all(|byte| (b' '..=b'~').contains(&byte) && byte != b'%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_name_is_short_printable_ascii_without_percent() {
        assert!(is_path_name("acme corp/eu ~1", 128));
        assert!(is_path_name(&"a".repeat(128), 128));
        for refused in ["", "a%41", "%", "é", "a\tb", "\u{7f}"] {
            assert!(!is_path_name(refused, 128), "{refused:?}");
        }
        assert!(!is_path_name(&"a".repeat(129), 128));
    }
}
