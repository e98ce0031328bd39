//! Pure path arithmetic on `/`-separated strings, as POSIX paths in any box.

/// Join segments, folding `.`, `..` and doubled slashes; an absolute segment restarts.
pub fn join(parts: &[&str]) -> String {
    let mut out = String::new();
    for p in parts {
        if p.starts_with('/') {
            out = p.to_string();
        } else if !p.is_empty() {
            if !out.is_empty() && !out.ends_with('/') {
                out.push('/');
            }
            out.push_str(p);
        }
    }
    normalize(&out)
}

/// `path` made absolute against `cwd`.
pub fn absolute(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        normalize(path)
    } else {
        join(&[cwd, path])
    }
}

/// Fold `.`, `..` and doubled slashes. `..` above the root stays at the root.
pub fn normalize(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut segs: Vec<&str> = Vec::new();
    for s in path.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                if segs.last().is_some_and(|l| *l != "..") {
                    segs.pop();
                } else if !absolute {
                    segs.push("..");
                }
            }
            s => segs.push(s),
        }
    }
    let joined = segs.join("/");
    if absolute {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".into()
    } else {
        joined
    }
}

/// The last segment.
pub fn base_name(path: &str) -> String {
    let t = path.trim_end_matches('/');
    t.rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("/")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fold() {
        assert_eq!(join(&["/a", "b/../c", "./d"]), "/a/c/d");
        assert_eq!(join(&["/a", "/x", "y"]), "/x/y");
        assert_eq!(absolute("/w", "../../.."), "/");
        assert_eq!(absolute("/w", "f.txt"), "/w/f.txt");
        assert_eq!(normalize("a/../.."), "..");
        assert_eq!(normalize(""), ".");
        assert_eq!(base_name("/a/b/"), "b");
        assert_eq!(base_name("/"), "/");
    }
}
