//! Which member names may be written: relative, no `.`, `..` or empty segment, no NUL, at
//! most 255 bytes a segment and 4095 a path.

/// At most this many bytes in one segment.
pub const MAX_SEGMENT: usize = 255;
/// At most this many bytes in a path.
pub const MAX_PATH: usize = 4095;

/// A leading `./` (as `tar -C DIR .` writes every name) is dropped; `.` anywhere else is not.
pub fn strip_dot_prefix(mut name: &[u8]) -> &[u8] {
    while let Some(rest) = name.strip_prefix(b"./") {
        name = rest;
    }
    name
}

/// Whether a name is the archive's root itself (`.` or `./`).
pub fn is_root(name: &[u8]) -> bool {
    matches!(strip_dot_prefix(name), b"" | b".")
}

/// The segments of a safe name, or `None`. One trailing slash (a directory's) is allowed, and
/// a leading `./`.
///
/// ```
/// use agentbox_sync::names::segments;
/// assert_eq!(segments(b"a/b/"), Some(vec![b"a".to_vec(), b"b".to_vec()]));
/// assert_eq!(segments(b"./a"), Some(vec![b"a".to_vec()]));
/// for bad in [&b"/etc"[..], b"a/../b", b"a/./b", b"a//b", b"a\0b", b"", b".."] {
///     assert_eq!(segments(bad), None);
/// }
/// ```
pub fn segments(name: &[u8]) -> Option<Vec<Vec<u8>>> {
    let name = strip_dot_prefix(name);
    let name = name.strip_suffix(b"/").unwrap_or(name);
    if name.is_empty() || name.len() > MAX_PATH || name.starts_with(b"/") || name.contains(&0) {
        return None;
    }
    let mut out = Vec::new();
    for seg in name.split(|&b| b == b'/') {
        if seg.is_empty() || seg == b"." || seg == b".." || seg.len() > MAX_SEGMENT {
            return None;
        }
        out.push(seg.to_vec());
    }
    Some(out)
}
