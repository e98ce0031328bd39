//! What vendors give and check: random ids (UUIDs), base64, and keys compared in constant time.

/// Compared in time that does not depend on where the two differ (a key against the one
/// expected).
pub(crate) fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// A random RFC 4122 version-4 UUID, as Kubernetes gives every object and Daytona every
/// sandbox. A failing system RNG leaves zeros: ids need only be unique within one fake, which
/// each fake keeps by what it mixes in (a resourceVersion, a name).
pub(crate) fn uuid4() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Standard base64 with padding, as Go's `encoding/json` writes a `[]byte` and envd its output.
pub(crate) fn b64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}
