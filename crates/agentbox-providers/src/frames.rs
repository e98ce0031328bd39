//! The protocol's frames read from an async stream: the replies of a local box's supervisor and
//! of a namespace box's init, on their unix sockets.

use tokio::io::AsyncReadExt;

/// Read one length-prefixed frame from an async reader. `Ok(None)` at a clean end.
pub(crate) async fn read_frame<T: serde::de::DeserializeOwned>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> std::io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = agentbox_protocol::frame::body_len(prefix)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).await?;
    agentbox_protocol::frame::decode(&body)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
