//! Length-prefixed JSON frames: a u32 big-endian length, then that many bytes of JSON.
//!
//! The length is checked against a bound before a byte of the body is read, so a hostile or
//! broken peer cannot make the reader allocate more than the bound.

use serde::{Serialize, de::DeserializeOwned};

/// The largest frame body either end accepts (8 MiB: an argv and env near the kernel's own
/// ARG_MAX fit).
pub const MAX_FRAME: usize = 8 << 20;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix is over [`MAX_FRAME`].
    TooLarge(usize),
    /// The body is not the JSON expected.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge(n) => write!(f, "a frame of {n} bytes is over the {MAX_FRAME}-byte bound"),
            FrameError::Malformed(why) => write!(f, "a malformed frame: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Encode `msg` as one frame: prefix and body.
///
/// ```
/// use agentbox_protocol::frame::{decode, encode, body_len};
/// let bytes = encode(&vec![1, 2, 3]).unwrap();
/// let n = body_len(bytes[..4].try_into().unwrap()).unwrap();
/// let back: Vec<i32> = decode(&bytes[4..4 + n]).unwrap();
/// assert_eq!(back, vec![1, 2, 3]);
/// ```
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The body length a prefix announces, refused past [`MAX_FRAME`].
pub fn body_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let n = u32::from_be_bytes(prefix) as usize;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    Ok(n)
}

/// Decode a body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Read one frame from a blocking reader. `Ok(None)` at a clean end of stream.
pub fn read_sync<T: DeserializeOwned>(r: &mut impl std::io::Read) -> std::io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    read_body_sync(prefix, r).map(Some)
}

/// Read the body of a frame whose prefix was already read.
pub fn read_body_sync<T: DeserializeOwned>(prefix: [u8; 4], r: &mut impl std::io::Read) -> std::io::Result<T> {
    let n = body_len(prefix).map_err(invalid)?;
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    decode(&body).map_err(invalid)
}

/// Write one frame to a blocking writer.
pub fn write_sync<T: Serialize>(w: &mut impl std::io::Write, msg: &T) -> std::io::Result<()> {
    let bytes = encode(msg).map_err(invalid)?;
    w.write_all(&bytes)?;
    w.flush()
}

fn invalid(e: FrameError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_prefix_is_refused_before_reading_the_body() {
        let prefix = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert_eq!(body_len(prefix), Err(FrameError::TooLarge(MAX_FRAME + 1)));
        let mut r = std::io::Cursor::new(prefix.to_vec());
        let e = read_sync::<serde_json::Value>(&mut r).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn frames_round_trip_and_a_clean_end_is_none() {
        let mut buf = Vec::new();
        write_sync(&mut buf, &"hello").unwrap();
        let mut r = std::io::Cursor::new(buf);
        assert_eq!(read_sync::<String>(&mut r).unwrap().as_deref(), Some("hello"));
        assert_eq!(read_sync::<String>(&mut r).unwrap(), None);
    }

    #[test]
    fn a_body_that_is_not_json_is_malformed() {
        let mut r = std::io::Cursor::new([0, 0, 0, 3, b'{', b'{', b'{'].to_vec());
        assert!(read_sync::<serde_json::Value>(&mut r).is_err());
    }
}
