//! What vendors give and check: random ids (UUIDs), base64, and keys compared in constant time.

pub(crate) use agentbox_e2b::http::same;

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

pub(crate) use agentbox_e2b::http::b64_encode;
