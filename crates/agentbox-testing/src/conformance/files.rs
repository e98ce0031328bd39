//! The case of a box's files: upload and download, whole and bounded.

use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode};

use super::CaseResult;
use super::cx::Cx;

/// Upload and download carry every byte value, make parent directories, replace a file, and
/// answer `not_found` and `too_large`.
pub(super) async fn upload_and_download(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let data: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8).collect();
    b.upload("conf/sub/every-byte.bin", &data, &ctx)
        .await
        .map_err(|e| format!("upload: {e}"))?;
    let back = b
        .download("conf/sub/every-byte.bin", 2 << 20, &ctx)
        .await
        .map_err(|e| format!("download: {e}"))?;
    ensure!(
        back == data,
        "download gave {} bytes that differ from the upload",
        back.len()
    );
    let out = cx.sh(&*b, "wc -c < conf/sub/every-byte.bin").await?;
    ensure!(
        out.stdout_text().trim() == "1048576",
        "a program sees {:?} bytes of the upload",
        out.stdout_text()
    );
    b.upload("conf/sub/every-byte.bin", b"short", &ctx)
        .await
        .map_err(|e| format!("second upload: {e}"))?;
    let back = b
        .download("conf/sub/every-byte.bin", 100, &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        back == b"short",
        "an upload over a file left {:?}",
        String::from_utf8_lossy(&back)
    );
    match b.download("conf/none", 100, &ctx).await {
        Err(e) if e.code() == ErrorCode::NotFound => {}
        other => {
            return Err(format!(
                "download of a missing file answered {:?}, expected not_found",
                other.map(|v| v.len())
            ));
        }
    }
    match b.download("conf/sub/every-byte.bin", 3, &ctx).await {
        Err(e) if e.code() == ErrorCode::TooLarge => {}
        other => {
            return Err(format!(
                "download over its bound answered {:?}, expected too_large",
                other.map(|v| v.len())
            ));
        }
    }
    Ok(())
}
