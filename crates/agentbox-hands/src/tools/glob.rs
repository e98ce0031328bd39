//! Glob patterns for `find` and `grep`'s `glob`: `*` (not across `/`), `**` (across), `?`,
//! `[abc]`, `[a-z]`, `[!x]`, `{a,b}`. Written here rather than taken from `globset`, whose
//! regex engine would be most of this crate's build for a few dozen lines of matching.

/// Whether `path` matches `pattern`. A pattern with no `/` is matched against the last
/// segment of `path` alone.
///
/// ```
/// use agentbox_hands::tools::glob::matches;
/// assert!(matches("*.rs", "src/main.rs"));
/// assert!(matches("src/**/*.rs", "src/a/b/c.rs"));
/// assert!(matches("**/*.{ts,tsx}", "web/app.tsx"));
/// assert!(!matches("src/*.rs", "src/a/b.rs"));
/// ```
pub fn matches(pattern: &str, path: &str) -> bool {
    let target = if pattern.contains('/') {
        path
    } else {
        path.rsplit('/').next().unwrap_or(path)
    };
    expand_braces(pattern).iter().any(|p| {
        let p: Vec<char> = p.chars().collect();
        let t: Vec<char> = target.chars().collect();
        glob(&p, &t)
    })
}

fn expand_braces(p: &str) -> Vec<String> {
    let Some(open) = p.find('{') else {
        return vec![p.to_string()];
    };
    let mut depth = 0;
    let mut close = None;
    for (i, c) in p[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else { return vec![p.to_string()] };
    let (pre, body, post) = (&p[..open], &p[open + 1..close], &p[close + 1..]);
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
        .iter()
        .flat_map(|part| expand_braces(&format!("{pre}{part}{post}")))
        .collect()
}

fn glob(p: &[char], t: &[char]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some('*') if p.get(1) == Some(&'*') => {
            let rest = &p[2..];
            // `**/` may also match no directory at all.
            if rest.first() == Some(&'/') && glob(&rest[1..], t) {
                return true;
            }
            (0..=t.len()).any(|i| glob(rest, &t[i..]))
        }
        Some('*') => {
            let rest = &p[1..];
            for i in 0..=t.len() {
                if glob(rest, &t[i..]) {
                    return true;
                }
                if i < t.len() && t[i] == '/' {
                    break;
                }
            }
            false
        }
        Some('?') => !t.is_empty() && t[0] != '/' && glob(&p[1..], &t[1..]),
        Some('[') => {
            let Some(end) = p.iter().skip(1).position(|&c| c == ']').map(|i| i + 1) else {
                return !t.is_empty() && t[0] == '[' && glob(&p[1..], &t[1..]);
            };
            if t.is_empty() || t[0] == '/' {
                return false;
            }
            let class = &p[1..end];
            let (neg, class) = match class.first() {
                Some('!') | Some('^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= t[0] && t[0] <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == t[0];
                    i += 1;
                }
            }
            hit != neg && glob(&p[end + 1..], &t[1..])
        }
        Some(c) => !t.is_empty() && t[0] == *c && glob(&p[1..], &t[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_like_shells() {
        assert!(matches("*.md", "README.md"));
        assert!(matches("*.md", "docs/a.md"));
        assert!(!matches("*.md", "a.mdx"));
        assert!(matches("src/**", "src/a/b"));
        assert!(matches("**/test_*.py", "test_a.py"));
        assert!(matches("a?c", "abc"));
        assert!(!matches("a?c", "a/c"));
        assert!(matches("[a-c]x", "bx"));
        assert!(!matches("[!a-c]x", "bx"));
        assert!(matches("{src,lib}/*.rs", "lib/x.rs"));
        assert!(matches("*.{a,b{c,d}}", "f.bd"));
        assert!(!matches("src/*.rs", "other/src/x.rs"));
    }
}
