//! `agentbox-runner trust CA BUNDLE`: run in a box with secrets once its proxy is up, so the
//! box's TLS clients trust the certificate authority made for it alone.
//!
//! It writes `BUNDLE`: the box's own roots (the first system bundle found) followed by the
//! authority's certificate, which `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE`
//! name; and appends the certificate to the system bundle itself where the box may write it (a
//! container's own file; a namespace box's root is read-only, and the variables do the work).

use std::io::{Read, Write};
use std::path::Path;

/// Where distributions keep their bundle of roots, in the order looked for.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];
/// The line before the authority in a store it was added to.
const MARK: &str = "# agentbox egress proxy: this box's own authority";

/// `bundle` without the authority a previous `trust` added (the [`MARK`] and the certificate
/// after it).
fn without_ours(bundle: &str) -> String {
    let mut out = String::with_capacity(bundle.len());
    let mut skipping = false;
    for line in bundle.lines() {
        if line == MARK {
            skipping = true;
            continue;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        } else if line.starts_with("-----END CERTIFICATE-----") {
            skipping = false;
        }
    }
    out
}

/// Write `text` to a file beside `path` and rename it over `path`, readable by every user.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("agentbox-tmp");
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The largest certificate file read.
const MAX_CA: u64 = 64 << 10;
/// The largest system bundle read.
const MAX_BUNDLE: u64 = 8 << 20;

/// Write the bundle and add to the store; the exit code (the line said names what was done).
/// Run in a box only: it rewrites the store at [`SYSTEM_BUNDLES`] where it may.
pub fn run(ca: &Path, bundle: &Path) -> i32 {
    match trust(ca, bundle, &SYSTEM_BUNDLES) {
        Ok(said) => {
            println!("{said}");
            0
        }
        Err(e) => {
            eprintln!("agentbox-runner trust: {e}");
            1
        }
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut text = String::new();
    f.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if text.len() as u64 > max {
        return Err(format!("{} is over {max} bytes", path.display()));
    }
    Ok(text)
}

/// The work of [`run`], with the stores looked for in `stores` (a test's own files: a test
/// run on this machine must never reach its store).
fn trust(ca: &Path, bundle: &Path, stores: &[&str]) -> Result<String, String> {
    let cert = read_bounded(ca, MAX_CA)?;
    if !cert.trim_start().starts_with("-----BEGIN CERTIFICATE-----") {
        return Err(format!("{} is not a PEM certificate", ca.display()));
    }
    let cert = format!("{}\n", cert.trim_end());
    let system = stores.iter().map(Path::new).find(|p| p.is_file());
    // An authority appended before (a fork's or a snapshot's store holds its parent's) is
    // dropped: its key ended with its box's proxy.
    let roots = match system {
        Some(p) => without_ours(&read_bounded(p, MAX_BUNDLE)?),
        None => String::new(),
    };
    let mut text = roots.trim_end().to_string();
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(&cert);
    write_whole(bundle, &text).map_err(|e| format!("writing {}: {e}", bundle.display()))?;
    let store = match system {
        None => "no system bundle in the box".to_string(),
        Some(p) if p.is_symlink() => format!("{} left as it is (a link)", p.display()),
        // Written whole beside it and renamed over it: never half a store.
        Some(p) => match write_whole(p, &format!("{}\n{MARK}\n{cert}", roots.trim_end())) {
            Ok(()) => format!("added to {}", p.display()),
            Err(e) => format!("{} left as it is ({e})", p.display()),
        },
    };
    Ok(format!("trusted: {} written; {store}", bundle.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_is_the_roots_and_the_authority_and_the_store_holds_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let bundle = dir.path().join("bundle.pem");
        let store = dir.path().join("store.pem");
        let store_path = store.to_str().unwrap().to_string();
        std::fs::write(&store, "-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n").unwrap();
        let first = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        std::fs::write(&ca, first).unwrap();
        let said = trust(&ca, &bundle, &[&store_path]).unwrap();
        assert!(said.starts_with("trusted:") && said.contains("added to"), "{said}");
        let text = std::fs::read_to_string(&bundle).unwrap();
        assert_eq!(
            text,
            format!("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n{first}")
        );
        // Again with another authority (a fork's): the store holds the new one alone.
        let second = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        std::fs::write(&ca, second).unwrap();
        trust(&ca, &bundle, &[&store_path]).unwrap();
        let stored = std::fs::read_to_string(&store).unwrap();
        assert_eq!(
            stored,
            format!("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n{MARK}\n{second}")
        );
        let old = format!("ROOT\n{MARK}\n-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----\nAFTER\n");
        assert_eq!(without_ours(&old), "ROOT\nAFTER\n");
        // No store at all: the bundle is the authority alone.
        let none = dir.path().join("none.pem");
        let said = trust(&ca, &bundle, &[none.to_str().unwrap()]).unwrap();
        assert!(said.contains("no system bundle"), "{said}");
        assert_eq!(std::fs::read_to_string(&bundle).unwrap(), second);
        std::fs::write(&ca, "not a certificate").unwrap();
        assert!(
            trust(&ca, &bundle, &[&store_path])
                .unwrap_err()
                .contains("not a PEM certificate")
        );
    }
}
