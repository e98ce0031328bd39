//! A minimal tar writer for building hostile archives byte by byte.
#![allow(dead_code)]

pub(crate) fn header(name: &[u8], typeflag: u8, size: u64, mode: u32, link: &[u8]) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    h[100..108].copy_from_slice(format!("{mode:07o}\0").as_bytes());
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14500000000\0");
    h[148..156].copy_from_slice(b"        ");
    h[156] = typeflag;
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

pub(crate) fn padded(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(data.len().div_ceil(512) * 512, 0);
    v
}

pub(crate) fn member(name: &str, typeflag: u8, data: &[u8], mode: u32) -> Vec<u8> {
    let mut v = header(name.as_bytes(), typeflag, data.len() as u64, mode, b"").to_vec();
    v.extend(padded(data));
    v
}

pub(crate) fn file(name: &str, data: &[u8]) -> Vec<u8> {
    member(name, b'0', data, 0o644)
}

pub(crate) fn dir(name: &str) -> Vec<u8> {
    member(name, b'5', b"", 0o755)
}

pub(crate) fn link(name: &str, typeflag: u8, target: &str) -> Vec<u8> {
    header(name.as_bytes(), typeflag, 0, 0o777, target.as_bytes()).to_vec()
}

pub(crate) fn pax_records(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let body_len = 1 + k.len() + 1 + v.len() + 1;
        let mut n = body_len + 1;
        while format!("{n}").len() + body_len != n {
            n += 1;
        }
        out.extend(format!("{n} {k}=").as_bytes());
        out.extend(*v);
        out.push(b'\n');
    }
    out
}

pub(crate) fn pax(typeflag: u8, records: &[(&str, &[u8])]) -> Vec<u8> {
    member("PaxHeaders/x", typeflag, &pax_records(records), 0o644)
}

pub(crate) fn end() -> Vec<u8> {
    vec![0u8; 1024]
}

pub(crate) fn archive(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = parts.concat();
    v.extend(end());
    v
}
