//! The file side of an environment: file errors and their codes, what a path is, and the
//! readers a file or directory is read through.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What went wrong with a file operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsCode {
    /// The caller cancelled, or the operation's deadline passed.
    Aborted,
    /// ENOENT.
    NotFound,
    /// EACCES or EPERM.
    PermissionDenied,
    /// ENOTDIR.
    NotDirectory,
    /// EISDIR.
    IsDirectory,
    /// EINVAL, or a request that makes no sense (following a link with no_follow).
    Invalid,
    /// The environment cannot do this (a reader over its size bound).
    NotSupported,
    /// Anything else; the message says what.
    Unknown,
}

/// A failed file operation: a code, a message and the path it was about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsError {
    /// The code.
    pub code: FsCode,
    /// What failed and why.
    pub message: String,
    /// The path.
    pub path: Option<String>,
}

impl FsError {
    /// An error about `path`.
    pub fn new(code: FsCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        FsError {
            code,
            message: message.into(),
            path: Some(path.into()),
        }
    }

    /// From an OS error, by errno, as pi maps it.
    pub fn from_io(e: &std::io::Error, path: &str) -> Self {
        use std::io::ErrorKind as K;
        let code = match e.kind() {
            K::NotFound => FsCode::NotFound,
            // EPERM and EACCES both.
            K::PermissionDenied => FsCode::PermissionDenied,
            K::NotADirectory => FsCode::NotDirectory,
            K::IsADirectory => FsCode::IsDirectory,
            K::InvalidInput => FsCode::Invalid,
            _ => FsCode::Unknown,
        };
        FsError::new(code, path, format!("{path}: {e}"))
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for FsError {}

/// What a path is (as lstat sees it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file (or anything that is not a directory or a link).
    File,
    /// A directory.
    Directory,
    /// A symbolic link, not followed.
    Symlink,
}

/// One path's lstat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileInfo {
    /// The last segment.
    pub name: String,
    /// The path as asked, made absolute.
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Bytes.
    pub size: u64,
    /// Modification time in whole milliseconds since the epoch.
    pub mtime_ms: i64,
}

/// A file read whole when opened; later reads are served from that copy.
#[derive(Clone, Debug)]
pub struct BinaryReader {
    /// The file's lstat when it was opened.
    pub info: FileInfo,
    data: Vec<u8>,
}

impl BinaryReader {
    /// Wrap bytes read at open.
    pub fn new(info: FileInfo, data: Vec<u8>) -> Self {
        BinaryReader { info, data }
    }
    /// Up to `len` bytes from `offset` (fewer at the end, none past it).
    pub fn read(&self, offset: u64, len: usize) -> &[u8] {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.data.len());
        let end = start.saturating_add(len).min(self.data.len());
        &self.data[start..end]
    }
    /// Each line with the byte offset it starts at, without its newline.
    pub fn scan_lines(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut offset = 0u64;
        self.data.split_inclusive(|&b| b == b'\n').map(move |l| {
            let at = offset;
            offset += l.len() as u64;
            (at, l.strip_suffix(b"\n").unwrap_or(l))
        })
    }
}

/// A text file's lines, one at a time.
#[derive(Clone, Debug)]
pub struct TextLineReader {
    text: String,
    pos: usize,
}

impl TextLineReader {
    /// Over the text read at open.
    pub fn new(text: String) -> Self {
        TextLineReader { text, pos: 0 }
    }
    /// The next line and whether it ended with a newline; `None` at the end.
    pub fn next_line(&mut self) -> Option<(String, bool)> {
        if self.pos >= self.text.len() {
            return None;
        }
        let rest = &self.text[self.pos..];
        match rest.find('\n') {
            Some(i) => {
                self.pos += i + 1;
                Some((rest[..i].to_string(), true))
            }
            None => {
                self.pos = self.text.len();
                Some((rest.to_string(), false))
            }
        }
    }
}

/// A directory's entries, a batch at a time.
#[derive(Clone, Debug)]
pub struct DirReader {
    entries: Vec<FileInfo>,
    pos: usize,
}

impl DirReader {
    /// Over entries read at open.
    pub fn new(entries: Vec<FileInfo>) -> Self {
        DirReader { entries, pos: 0 }
    }
    /// Up to `max` entries, and whether the listing is done.
    pub fn next(&mut self, max: usize) -> (Vec<FileInfo>, bool) {
        let end = self.pos.saturating_add(max.max(1)).min(self.entries.len());
        let batch = self.entries[self.pos..end].to_vec();
        self.pos = end;
        (batch, self.pos >= self.entries.len())
    }
}

/// The default bound of a reader: a file above it is refused before a byte moves.
pub const MAX_READER_BYTES: u64 = 64 << 20;
