//! The limits every tool shares: 2000 lines or 50 KB (51200 bytes), whichever comes first,
//! and sizes printed as `NB`, `N.NKB`, `N.NMB`.

use serde::Serialize;

/// Lines a tool shows at most.
pub const MAX_LINES: usize = 2000;
/// Bytes a tool shows at most.
pub const MAX_BYTES: usize = 51200;

/// `512B`, `1.5KB`, `2.0MB`.
pub fn format_size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1}MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// What a truncation kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Truncation {
    /// The text kept.
    pub content: String,
    /// Whether anything was cut.
    pub truncated: bool,
    /// `lines` or `bytes`, when cut.
    pub truncated_by: Option<&'static str>,
    /// Lines in the input.
    pub total_lines: usize,
    /// Bytes in the input.
    pub total_bytes: usize,
    /// Lines kept.
    pub output_lines: usize,
    /// Bytes kept.
    pub output_bytes: usize,
    /// The first line alone is over the byte limit (head truncation).
    pub first_line_exceeds_limit: bool,
}

impl Truncation {
    /// `content` kept whole.
    fn untouched(content: &str) -> Self {
        Truncation {
            content: content.to_string(),
            truncated: false,
            truncated_by: None,
            total_lines: content.split('\n').count(),
            total_bytes: content.len(),
            output_lines: content.split('\n').count(),
            output_bytes: content.len(),
            first_line_exceeds_limit: false,
        }
    }
}

/// Keep the first lines within the limits (for reading a file).
pub fn head(content: &str, max_lines: usize, max_bytes: usize) -> Truncation {
    let lines: Vec<&str> = content.split('\n').collect();
    let (total_lines, total_bytes) = (lines.len(), content.len());
    let whole = Truncation::untouched(content);
    if total_lines <= max_lines && total_bytes <= max_bytes {
        return whole;
    }
    if lines[0].len() > max_bytes {
        return Truncation {
            content: String::new(),
            truncated: true,
            truncated_by: Some("bytes"),
            output_lines: 0,
            output_bytes: 0,
            first_line_exceeds_limit: true,
            ..whole.clone()
        };
    }
    let mut kept = Vec::new();
    let mut bytes = 0;
    let mut by = "lines";
    for (i, l) in lines.iter().enumerate() {
        if i >= max_lines {
            by = "lines";
            break;
        }
        let add = l.len() + usize::from(i > 0);
        if bytes + add > max_bytes {
            by = "bytes";
            break;
        }
        bytes += add;
        kept.push(*l);
    }
    let content = kept.join("\n");
    Truncation {
        output_bytes: content.len(),
        output_lines: kept.len(),
        content,
        truncated: true,
        truncated_by: Some(by),
        ..whole.clone()
    }
}

/// Keep the last lines within the limits (for a command's output).
pub fn tail(content: &str, max_lines: usize, max_bytes: usize) -> Truncation {
    let lines: Vec<&str> = content.split('\n').collect();
    let (total_lines, total_bytes) = (lines.len(), content.len());
    let base = Truncation::untouched(content);
    if total_lines <= max_lines && total_bytes <= max_bytes {
        return base;
    }
    let mut kept: Vec<String> = Vec::new();
    let mut bytes = 0;
    let mut by = "lines";
    for (n, l) in lines.iter().rev().enumerate() {
        if n >= max_lines {
            by = "lines";
            break;
        }
        let add = l.len() + usize::from(n > 0);
        if bytes + add > max_bytes {
            by = "bytes";
            if kept.is_empty() {
                // One line longer than the limit: keep its end, on a character boundary.
                let mut start = l.len() - max_bytes;
                while !l.is_char_boundary(start) {
                    start += 1;
                }
                kept.push(l[start..].to_string());
            }
            break;
        }
        bytes += add;
        kept.push(l.to_string());
    }
    kept.reverse();
    let content = kept.join("\n");
    Truncation {
        output_bytes: content.len(),
        output_lines: kept.len(),
        content,
        truncated: true,
        truncated_by: Some(by),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_pi_prints_them() {
        assert_eq!(format_size(512), "512B");
        assert_eq!(format_size(51200), "50.0KB");
        assert_eq!(format_size(1536), "1.5KB");
        assert_eq!(format_size(3 * 1024 * 1024), "3.0MB");
    }

    #[test]
    fn head_and_tail_keep_within_limits() {
        let text: String = (1..=10).map(|i| i.to_string()).collect::<Vec<_>>().join("\n");
        let h = head(&text, 3, 1000);
        assert_eq!(
            (h.content.as_str(), h.truncated_by, h.total_lines),
            ("1\n2\n3", Some("lines"), 10)
        );
        let t = tail(&text, 3, 1000);
        assert_eq!((t.content.as_str(), t.output_lines), ("8\n9\n10", 3));
        let h = head(&text, 100, 5);
        assert_eq!((h.content.as_str(), h.truncated_by), ("1\n2\n3", Some("bytes")));
        let long = "x".repeat(100);
        assert!(head(&long, 10, 50).first_line_exceeds_limit);
        assert_eq!(tail(&long, 10, 50).content.len(), 50);
        assert!(!head("a\nb", 2, 10).truncated);
    }
}
