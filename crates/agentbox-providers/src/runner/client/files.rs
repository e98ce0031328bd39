//! The box's files through its runner: each operation one message ([`agentbox_core::Files`]),
//! and a file's bytes from an offset.

use agentbox_core::{Ctx, Error, FileError, FileMeta, FileType};
use agentbox_protocol::runner::{Answer, Kind, Meta, Request};
use async_trait::async_trait;

use super::{Client, Reply, code_of};

fn meta(m: Meta) -> FileMeta {
    FileMeta {
        name: m.name,
        kind: match m.kind {
            Kind::File => FileType::File,
            Kind::Dir => FileType::Dir,
            Kind::Symlink => FileType::Symlink,
            Kind::Other => FileType::Other,
        },
        size: m.size,
        mode: m.mode,
        mtime_ms: m.mtime_ms,
    }
}

impl Client {
    fn file_error(&self, r: Reply) -> FileError {
        match r {
            Reply::Answer(Answer::Error { errno: Some(n), .. }) => FileError::Os(n),
            Reply::Answer(Answer::Error { message, code, .. }) => {
                FileError::Box(Error::new(code_of(code.as_deref()), message))
            }
            Reply::Lost => FileError::Box(self.dropped()),
            _ => FileError::Box(Error::unknown(format!(
                "{} gave an answer out of place",
                self.describe()
            ))),
        }
    }

    async fn ok(
        &self,
        req: impl FnOnce(u32) -> Request,
        bytes: Option<&[u8]>,
        ctx: &Ctx,
    ) -> std::result::Result<(), FileError> {
        match self.ask(req, bytes, ctx).await.map_err(FileError::Box)? {
            Reply::Answer(Answer::Ok { .. }) => Ok(()),
            other => Err(self.file_error(other)),
        }
    }

    /// One round trip to a runner of protocol 2 (which has no `stat`): a `read` of the
    /// workspace, answered with whatever it answers (a directory is no file), proves it serves.
    pub async fn ping_protocol_2(&self, ctx: &Ctx) -> agentbox_core::Result<()> {
        let read = |id| Request::Read {
            id,
            path: ".".into(),
            offset: None,
            length: None,
        };
        match self.ask(read, None, ctx).await? {
            Reply::Lost => Err(self.dropped()),
            Reply::Answer(_) | Reply::File(_) => Ok(()),
        }
    }

    /// A ranged read (protocol 3): at most `length` bytes from `offset`.
    pub async fn read_range(
        &self,
        path: &str,
        offset: u64,
        length: u64,
        ctx: &Ctx,
    ) -> std::result::Result<Option<Vec<u8>>, FileError> {
        self.read_request(path, Some((offset, length)), ctx).await
    }

    async fn read_request(
        &self,
        path: &str,
        range: Option<(u64, u64)>,
        ctx: &Ctx,
    ) -> std::result::Result<Option<Vec<u8>>, FileError> {
        let path = path.to_string();
        let req = |id| Request::Read {
            id,
            path,
            offset: range.map(|r| r.0),
            length: range.map(|r| r.1),
        };
        match self.ask(req, None, ctx).await.map_err(FileError::Box)? {
            Reply::File(b) => Ok(Some(b)),
            Reply::Answer(Answer::Absent { .. }) => Ok(None),
            other => Err(self.file_error(other)),
        }
    }
}

#[async_trait]
impl agentbox_core::Files for Client {
    async fn read(&self, path: &str, ctx: &Ctx) -> std::result::Result<Option<Vec<u8>>, FileError> {
        self.read_request(path, None, ctx).await
    }

    async fn write(&self, path: &str, data: &[u8], append: bool, ctx: &Ctx) -> std::result::Result<(), FileError> {
        let path = path.to_string();
        if append {
            self.ok(|id| Request::Append { id, path }, Some(data), ctx).await
        } else {
            self.ok(|id| Request::Write { id, path, mode: None }, Some(data), ctx)
                .await
        }
    }

    async fn truncate(&self, path: &str, size: u64, ctx: &Ctx) -> std::result::Result<(), FileError> {
        let path = path.to_string();
        self.ok(|id| Request::Truncate { id, path, size }, None, ctx).await
    }

    async fn stat(&self, path: &str, follow: bool, ctx: &Ctx) -> std::result::Result<FileMeta, FileError> {
        let path = path.to_string();
        match self
            .ask(|id| Request::Stat { id, path, follow }, None, ctx)
            .await
            .map_err(FileError::Box)?
        {
            Reply::Answer(Answer::Stat { meta: m, .. }) => Ok(meta(m)),
            other => Err(self.file_error(other)),
        }
    }

    async fn list(&self, path: &str, ctx: &Ctx) -> std::result::Result<Vec<FileMeta>, FileError> {
        let path = path.to_string();
        match self
            .ask(|id| Request::List { id, path }, None, ctx)
            .await
            .map_err(FileError::Box)?
        {
            Reply::Answer(Answer::Entries { entries, .. }) => Ok(entries.into_iter().map(meta).collect()),
            other => Err(self.file_error(other)),
        }
    }

    async fn mkdir(&self, path: &str, recursive: bool, ctx: &Ctx) -> std::result::Result<(), FileError> {
        let path = path.to_string();
        self.ok(|id| Request::Mkdir { id, path, recursive }, None, ctx).await
    }

    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> std::result::Result<(), FileError> {
        let path = path.to_string();
        self.ok(
            |id| Request::Remove {
                id,
                path,
                recursive,
                force,
            },
            None,
            ctx,
        )
        .await
    }

    async fn rename(&self, from: &str, to: &str, ctx: &Ctx) -> std::result::Result<(), FileError> {
        let (from, to) = (from.to_string(), to.to_string());
        self.ok(|id| Request::Rename { id, from, to }, None, ctx).await
    }
}
