//! Archil's published API, as much of it as the provider speaks: the control plane (disks, and
//! the exec call that answers when its command has ended) under the base URL, and the disk's
//! S3-style object API under the object base URL. Both authenticate with the same header the
//! `archil` SDK sends (`Authorization: key-<key>`). Every call has a deadline; a throttled one
//! (429, or 503 on a call that is safe to send again) is tried again after what `Retry-After`
//! says while the caller's context allows; every error Archil answers becomes one of ours
//! carrying Archil's own message and code, never the key.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::vendor::{ApiKey, Sent, code_of_status, cut, read_capped};

/// The vendor, as errors name it.
const VENDOR: &str = "Archil";
/// The most of a control-plane answer read (an exec's is bounded apart).
const MAX_JSON: usize = 16 << 20;
/// The most of an exec's answer read: both streams of a command that printed 64 MiB each, as
/// JSON strings. More is refused `too_large`, never buffered.
pub(crate) const MAX_EXEC_ANSWER: usize = 160 << 20;
/// The most of an object API error or listing page read.
const MAX_XML: usize = 4 << 20;
/// The most keys one listing follows (pages of up to 1000).
const MAX_LISTED: usize = 100_000;

/// The HTTP client, the two base URLs and the key.
#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    s3: String,
    key: ApiKey,
    request_timeout: Duration,
}

/// A disk as `GET /api/disks/{id}` answers it (the fields the provider reads).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DiskDto {
    pub id: String,
    pub name: String,
    pub status: String,
    #[serde(default)]
    pub region: Option<String>,
}

/// What an exec answers once its command ended.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecAnswer {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    #[serde(default)]
    pub timing: Option<Timing>,
}

/// How long an exec queued and ran, as Archil counts.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Timing {
    #[serde(default)]
    pub queue_ms: u64,
    #[serde(default)]
    pub execute_ms: u64,
}

/// The control plane's envelope: `{success, data, error, code}`.
#[derive(Deserialize)]
struct Envelope<T> {
    #[serde(default)]
    success: bool,
    data: Option<T>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    code: Option<String>,
}

/// An error answer of the control plane as one of ours: `what` was being done, Archil's words.
pub(crate) fn control_error(status: u16, body: &[u8], what: &str) -> Error {
    #[derive(Deserialize, Default)]
    struct Failure {
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        code: Option<String>,
    }
    let f: Failure = serde_json::from_slice(body).unwrap_or_default();
    let said = f
        .error
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(crate::vendor::MAX_MESSAGE)]).into_owned());
    vendor_error(status, f.code.as_deref(), &said, what)
}

/// An error answer of the object API (S3's `<Error><Code>…</Code><Message>…</Message>`).
pub(crate) fn object_error(status: u16, body: &[u8], what: &str) -> Error {
    let text = String::from_utf8_lossy(body);
    let code = xml_values(&text, "Code").into_iter().next();
    let said = xml_values(&text, "Message").into_iter().next().unwrap_or_default();
    vendor_error(status, code.as_deref(), &said, what)
}

fn vendor_error(status: u16, code: Option<&str>, said: &str, what: &str) -> Error {
    let code_said = code.map(|c| format!(", {c}")).unwrap_or_default();
    let msg = format!(
        "{what}: Archil answered {status}{code_said}: {}",
        cut(said.trim().to_string())
    );
    let ours = match code {
        Some("NoSuchKey" | "NoSuchBucket") => ErrorCode::NotFound,
        // Archil answers a delegation checkout its queue did not grant with 400; it is another
        // client's hold, not a malformed request. So is S3's conflicting operation.
        Some("checkout_timeout" | "OperationAborted") => ErrorCode::Refused,
        Some("no_capacity" | "runtime_retryable") => ErrorCode::Refused,
        Some("EntityTooLarge" | "output_too_large") => ErrorCode::TooLarge,
        _ => code_of_status(status),
    };
    Error::new(ours, msg)
}

/// The text of every element `name` in `xml`, in order, unescaped. Enough for S3's flat
/// answers (a listing's `Key` and `Prefix`, an error's `Code`); a malformed answer yields
/// what it holds, which the caller checks.
pub(crate) fn xml_values(xml: &str, name: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    let mut inside = false;
    let mut text = String::new();
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e)) if e.local_name().as_ref() == name.as_bytes() => {
                inside = true;
                text.clear();
            }
            Ok(quick_xml::events::Event::Text(t)) if inside => {
                if let Ok(s) = t.decode() {
                    text.push_str(&s);
                }
            }
            Ok(quick_xml::events::Event::GeneralRef(r)) if inside => {
                // The five entities XML predefines, and character references.
                let name = String::from_utf8_lossy(r.as_ref()).into_owned();
                match name.as_str() {
                    "amp" => text.push('&'),
                    "lt" => text.push('<'),
                    "gt" => text.push('>'),
                    "quot" => text.push('"'),
                    "apos" => text.push('\''),
                    _ => {
                        if let Ok(Some(c)) = r.resolve_char_ref() {
                            text.push(c);
                        }
                    }
                }
            }
            Ok(quick_xml::events::Event::End(e)) if inside && e.local_name().as_ref() == name.as_bytes() => {
                inside = false;
                out.push(std::mem::take(&mut text));
            }
            Ok(quick_xml::events::Event::Eof) | Err(_) => return out,
            _ => {}
        }
    }
}

/// One page of a listing: files' keys and, with a delimiter, directories' prefixes.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub keys: Vec<String>,
    pub prefixes: Vec<String>,
}

impl Api {
    /// A client of the control plane at `base` and the object API at `s3`.
    pub(crate) fn new(
        base: &str,
        s3: &str,
        key: ApiKey,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self> {
        Ok(Api {
            http: crate::vendor::client(VENDOR, connect_timeout)?,
            base: crate::vendor::base_url(base, VENDOR, "the Archil API URL (ARCHIL_BASE_URL)")?,
            s3: crate::vendor::base_url(s3, VENDOR, "the Archil object API URL (ARCHIL_S3_BASE_URL)")?,
            key,
            request_timeout,
        })
    }

    /// Archil's header: one `key-` prefix, as the `archil` SDK writes it, marked sensitive so
    /// no layer below prints it.
    fn authorization(&self) -> Result<reqwest::header::HeaderValue> {
        let k = self.key.expose();
        let mut v = reqwest::header::HeaderValue::from_str(&format!("key-{}", k.strip_prefix("key-").unwrap_or(k)))
            .map_err(|_| Error::invalid("ARCHIL_API_KEY: not a value an HTTP header can carry"))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// Send what `build` makes, authorized, with `timeout`; again on 429 (refused before any
    /// work) and, where the request is `idempotent`, on 503, while `ctx` allows.
    async fn send<F>(
        &self,
        ctx: &Ctx,
        what: &str,
        timeout: Duration,
        idempotent: bool,
        build: F,
    ) -> Result<reqwest::Response>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let authorization = self.authorization()?;
        let build = || build(&self.http).header(reqwest::header::AUTHORIZATION, authorization.clone());
        match crate::vendor::send(ctx, VENDOR, what, timeout, idempotent, build).await? {
            Sent::Answer(r) => Ok(r),
            // Its error is the answer's own, read by the caller.
            Sent::PastDeadline(r, wait) => {
                tracing::debug!(
                    what,
                    wait_ms = wait.as_millis() as u64,
                    "Archil asked to wait past this call's deadline"
                );
                Ok(r)
            }
        }
    }

    /// The `data` of a control-plane answer, checked: a 2xx whose envelope does not say
    /// `success` is an error too, as the SDK reads it.
    async fn envelope<T: DeserializeOwned>(r: reqwest::Response, cap: usize, what: &str) -> Result<T> {
        let status = r.status().as_u16();
        let body = read_capped(r, cap, VENDOR, what).await?;
        if !(200..300).contains(&status) {
            return Err(control_error(status, &body, what));
        }
        let env: Envelope<T> = serde_json::from_slice(&body)
            .map_err(|e| Error::unknown(format!("{what}: Archil's answer is not what its API describes: {e}")))?;
        if !env.success {
            let said = env.error.unwrap_or_else(|| "no message".into());
            return Err(vendor_error(status, env.code.as_deref(), &said, what).context("success: false"));
        }
        env.data
            .ok_or_else(|| Error::unknown(format!("{what}: Archil's answer carries no data")))
    }

    /// The disk `id`.
    pub(crate) async fn disk(&self, ctx: &Ctx, id: &str) -> Result<DiskDto> {
        let what = format!("reading Archil disk {id}");
        let url = self.control_url(&["api", "disks", id])?;
        let r = self
            .send(ctx, &what, self.request_timeout, true, |c| c.get(url.clone()))
            .await?;
        Self::envelope(r, MAX_JSON, &what).await
    }

    /// The disk called `name`, if there is one (and which, if there are several: refused).
    pub(crate) async fn disk_named(&self, ctx: &Ctx, name: &str) -> Result<Option<DiskDto>> {
        let what = format!("finding the Archil disk named {name:?}");
        let url = self.control_url(&["api", "disks"])?;
        let r = self
            .send(ctx, &what, self.request_timeout, true, |c| {
                c.get(url.clone()).query(&[("name", name), ("limit", "100")])
            })
            .await?;
        let disks: Option<Vec<DiskDto>> = Self::envelope(r, MAX_JSON, &what).await?;
        let mut found: Vec<DiskDto> = disks
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.name == name)
            .collect();
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            n => Err(Error::invalid(format!(
                "{what}: {n} disks have that name; name the disk by its id (dsk-…)"
            ))),
        }
    }

    /// Run `body` (`{disks, command}`) as one exec call, with a deadline of `timeout` for the
    /// whole call (its queue and its command). Never sent again: a command may have run.
    pub(crate) async fn exec(&self, ctx: &Ctx, body: &serde_json::Value, timeout: Duration) -> Result<ExecAnswer> {
        let what = "an Archil exec call";
        let url = self.control_url(&["api", "exec"])?;
        let r = self
            .send(ctx, what, timeout, false, |c| c.post(url.clone()).json(body))
            .await?;
        Self::envelope(r, MAX_EXEC_ANSWER, what).await
    }

    /// The control plane's URL of `segments`, each percent-encoded.
    fn control_url(&self, segments: &[&str]) -> Result<reqwest::Url> {
        url_of(&self.base, segments)
    }

    /// The object API's URL of `key` on `disk` (`{s3}/{disk}/{key}`, each segment of the key
    /// percent-encoded, as the SDK does).
    fn object_url(&self, disk: &str, key: &str) -> Result<reqwest::Url> {
        let mut segments = vec![disk];
        segments.extend(key.split('/'));
        url_of(&self.s3, &segments)
    }

    /// Write `data` as the object `key` (a key ending in `/` makes a directory).
    pub(crate) async fn put_object(&self, ctx: &Ctx, disk: &str, key: &str, data: &[u8]) -> Result<()> {
        let what = format!("writing {key} through Archil's object API");
        let url = self.object_url(disk, key)?;
        let timeout = self.transfer_timeout(data.len() as u64);
        let r = self
            .send(ctx, &what, timeout, true, |c| c.put(url.clone()).body(data.to_vec()))
            .await?;
        self.object_ok(r, &what).await
    }

    /// The size of the object `key`, or `None` where there is none.
    pub(crate) async fn head_object(&self, ctx: &Ctx, disk: &str, key: &str) -> Result<Option<u64>> {
        let what = format!("reading the size of {key} through Archil's object API");
        let url = self.object_url(disk, key)?;
        let r = self
            .send(ctx, &what, self.request_timeout, true, |c| c.head(url.clone()))
            .await?;
        match r.status().as_u16() {
            404 => Ok(None),
            s if (200..300).contains(&s) => {
                let len = r
                    .headers()
                    .get(reqwest::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| Error::unknown(format!("{what}: Archil's answer states no Content-Length")))?;
                Ok(Some(len))
            }
            s => Err(object_error(s, b"", &what)),
        }
    }

    /// The object `key` whole, refused `too_large` past `cap` bytes; `None` where there is none.
    pub(crate) async fn get_object(&self, ctx: &Ctx, disk: &str, key: &str, cap: u64) -> Result<Option<Vec<u8>>> {
        let what = format!("reading {key} through Archil's object API");
        let url = self.object_url(disk, key)?;
        let timeout = self.transfer_timeout(cap.min(1 << 30));
        let r = self.send(ctx, &what, timeout, true, |c| c.get(url.clone())).await?;
        let status = r.status().as_u16();
        if status == 404 {
            return Ok(None);
        }
        if !(200..300).contains(&status) {
            let body = read_capped(r, MAX_XML, VENDOR, &what).await.unwrap_or_default();
            return Err(object_error(status, &body, &what));
        }
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        read_capped(r, cap, VENDOR, &what).await.map(Some)
    }

    /// Delete the object `key`; one that is not there is no error.
    pub(crate) async fn delete_object(&self, ctx: &Ctx, disk: &str, key: &str) -> Result<()> {
        let what = format!("deleting {key} through Archil's object API");
        let url = self.object_url(disk, key)?;
        let r = self
            .send(ctx, &what, self.request_timeout, true, |c| c.delete(url.clone()))
            .await?;
        if r.status().as_u16() == 404 {
            return Ok(());
        }
        self.object_ok(r, &what).await
    }

    /// Every key under `prefix`, one level deep (delimiter `/`): files and directories.
    pub(crate) async fn list(&self, ctx: &Ctx, disk: &str, prefix: &str) -> Result<Listing> {
        let what = format!("listing {prefix} through Archil's object API");
        let url = url_of(&self.s3, &[disk])?;
        let mut out = Listing::default();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("list-type", "2".to_string()),
                ("prefix", prefix.to_string()),
                ("delimiter", "/".into()),
            ];
            if let Some(t) = &token {
                query.push(("continuation-token", t.clone()));
            }
            let r = self
                .send(ctx, &what, self.request_timeout, true, |c| {
                    c.get(url.clone()).query(&query)
                })
                .await?;
            let status = r.status().as_u16();
            let body = read_capped(r, MAX_XML, VENDOR, &what).await?;
            if !(200..300).contains(&status) {
                return Err(object_error(status, &body, &what));
            }
            let text = String::from_utf8_lossy(&body);
            if !text.contains("ListBucketResult") {
                return Err(Error::unknown(format!(
                    "{what}: Archil's answer is not a ListObjectsV2 result"
                )));
            }
            out.keys.extend(xml_values(&text, "Key"));
            // `Prefix` also names the listing's own prefix; a directory's ends with `/` and
            // is longer than it.
            out.prefixes.extend(
                xml_values(&text, "Prefix")
                    .into_iter()
                    .filter(|p| p.len() > prefix.len() && p.starts_with(prefix) && p.ends_with('/')),
            );
            if out.keys.len() + out.prefixes.len() > MAX_LISTED {
                return Err(Error::too_large(format!("{what}: more than {MAX_LISTED} entries")));
            }
            let truncated = xml_values(&text, "IsTruncated").first().is_some_and(|t| t == "true");
            let next = xml_values(&text, "NextContinuationToken").into_iter().next();
            match (truncated, next) {
                (false, _) => break,
                (true, Some(n)) if token.as_ref() != Some(&n) => token = Some(n),
                // A listing known to be partial is never read as whole: a list would sweep
                // the boxes on the pages it did not get.
                (true, _) => {
                    return Err(Error::unknown(format!(
                        "{what}: Archil's answer is cut short with no new continuation token"
                    )));
                }
            }
        }
        out.prefixes.sort();
        out.prefixes.dedup();
        Ok(out)
    }

    async fn object_ok(&self, r: reqwest::Response, what: &str) -> Result<()> {
        let status = r.status().as_u16();
        let body = read_capped(r, MAX_XML, VENDOR, what).await.unwrap_or_default();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(object_error(status, &body, what))
        }
    }

    /// A transfer's deadline: the request deadline, and a second more per MiB over 8 MiB
    /// (8 MiB was measured in about 0.3 s each way; this allows a slow link 30 times that).
    fn transfer_timeout(&self, bytes: u64) -> Duration {
        self.request_timeout + Duration::from_secs(bytes >> 20)
    }
}

/// `base` with `segments` appended, each percent-encoded.
fn url_of(base: &str, segments: &[&str]) -> Result<reqwest::Url> {
    let mut url = reqwest::Url::parse(base).map_err(|e| Error::invalid(format!("{base:?} is not a URL: {e}")))?;
    {
        let mut path = url
            .path_segments_mut()
            .map_err(|_| Error::invalid(format!("{base:?} cannot take a path")))?;
        path.pop_if_empty();
        path.extend(segments);
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_archils_words_and_a_typed_code() {
        let e = control_error(
            404,
            br#"{"success":false,"error":"Disk not found","code":"not_found"}"#,
            "reading",
        );
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(
            e.message().contains("Disk not found") && e.message().contains("not_found"),
            "{e}"
        );
        let e = object_error(
            404,
            b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The key &lt;a&gt; does not exist</Message></Error>",
            "reading a",
        );
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.message().contains("The key <a> does not exist"), "{e}");
        assert_eq!(
            object_error(400, b"<Error><Code>EntityTooLarge</Code></Error>", "x").code(),
            ErrorCode::TooLarge
        );
        assert_eq!(control_error(401, b"not json", "x").code(), ErrorCode::PermissionDenied);
        let held =
            br#"{"success":false,"error":"delegation checkout not acquired after 500 ms","code":"checkout_timeout"}"#;
        assert_eq!(control_error(400, held, "x").code(), ErrorCode::Refused);
    }

    #[test]
    fn listings_read_keys_and_prefixes() {
        let xml = "<ListBucketResult><Prefix>boxes/</Prefix><Contents><Key>boxes/a&amp;b</Key></Contents>\
                   <CommonPrefixes><Prefix>boxes/x/</Prefix></CommonPrefixes><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert_eq!(xml_values(xml, "Key"), vec!["boxes/a&b"]);
        assert_eq!(xml_values(xml, "Prefix"), vec!["boxes/", "boxes/x/"]);
        // Malformed: what was whole before the break, nothing made up.
        assert_eq!(xml_values("<Key>a</Key><Key>b", "Key"), vec!["a"]);
    }

    #[test]
    fn object_urls_encode_each_segment() {
        let u = url_of("http://h:1/s3", &["dsk-1", "boxes", "a b?#", "c"]).unwrap();
        assert_eq!(u.as_str(), "http://h:1/s3/dsk-1/boxes/a%20b%3F%23/c");
        let u = url_of("http://h:1/", &["api", "exec"]).unwrap();
        assert_eq!(u.as_str(), "http://h:1/api/exec");
    }
}
