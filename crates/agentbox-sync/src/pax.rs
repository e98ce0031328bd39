//! pax extended header records, parsed strictly: `LEN KEY=VALUE\n`, where LEN counts the
//! whole record. Anything else is malformed: a reader that skips a bad record (as the `tar`
//! crate does) lets an archive say one thing to us and another to the next reader.

/// The records this extractor uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pax {
    /// `path`.
    pub path: Option<Vec<u8>>,
    /// `linkpath`.
    pub linkpath: Option<Vec<u8>>,
    /// `size`.
    pub size: Option<u64>,
    /// `mtime`, whole seconds.
    pub mtime: Option<i64>,
}

/// Parse a pax header's payload.
pub fn parse(mut data: &[u8]) -> Result<Pax, String> {
    let mut pax = Pax::default();
    while !data.is_empty() {
        let sp = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a pax record with no length")?;
        let len: usize = std::str::from_utf8(&data[..sp])
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or("a pax record whose length is not a number")?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err("a pax record whose length is wrong or that is not terminated".into());
        }
        let rec = &data[sp + 1..len - 1];
        let eq = rec.iter().position(|&b| b == b'=').ok_or("a pax record with no '='")?;
        let (key, value) = (&rec[..eq], &rec[eq + 1..]);
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" => pax.linkpath = Some(value.to_vec()),
            b"size" => {
                let s = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
                pax.size = Some(
                    s.and_then(|s| s.parse().ok())
                        .ok_or("a pax size that is not a number")?,
                );
            }
            b"mtime" => {
                let s = std::str::from_utf8(value).map_err(|_| "a pax mtime that is not text")?;
                let whole = s.split('.').next().unwrap_or("");
                pax.mtime = Some(whole.parse().map_err(|_| "a pax mtime that is not a number")?);
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(pax)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: &str, v: &str) -> Vec<u8> {
        let body = format!(" {k}={v}\n");
        let mut n = body.len() + 1;
        if format!("{n}").len() + body.len() != n {
            n += 1;
        }
        format!("{n}{body}").into_bytes()
    }

    #[test]
    fn records_parse_and_bad_ones_are_refused() {
        let mut d = rec("path", "a/b");
        d.extend(rec("size", "12"));
        d.extend(rec("mtime", "1700000000.5"));
        let p = parse(&d).unwrap();
        assert_eq!(
            (p.path.as_deref(), p.size, p.mtime),
            (Some(&b"a/b"[..]), Some(12), Some(1_700_000_000))
        );
        for bad in [
            &b"5 a=b\n"[..],
            b"99 path=x\n",
            b"x path=y\n",
            b"11 path=abc",
            b"9 pathx\n",
            b"12 size=1x\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
