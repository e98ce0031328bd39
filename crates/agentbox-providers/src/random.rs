//! Random names, from the kernel: a box's, a snapshot's, an exec's. Its failure is an error,
//! never a predictable name.

use agentbox_core::{Error, Result};

/// `n` random bytes as lowercase hex, from the kernel (`getrandom`); its failure is an error,
/// never a predictable name.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
