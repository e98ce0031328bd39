//! Expected failures as values.
//!
//! Every fallible call of the contract returns [`Result<T>`]. An [`Error`] carries a machine
//! code ([`ErrorCode`]) a caller can branch on, a message for people that names the field or
//! path and says why, and an optional source. Nothing in agentbox panics on bad input: it
//! answers with one of these.

use std::fmt;
use std::sync::Arc;

/// The result type of the whole contract.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is. Callers branch on this, never on the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed: a field out of range, a bad name, a bad path.
    Invalid,
    /// The request is well formed but this provider cannot honour it.
    Unsupported,
    /// The thing named does not exist.
    NotFound,
    /// The box existed but has ended (destroyed, or its lifetime passed).
    Gone,
    /// A deadline passed.
    Timeout,
    /// The caller cancelled.
    Aborted,
    /// The other side refused (a claim held by another, a daemon that says no).
    Refused,
    /// Acting would be unsafe (a link where a directory was expected, a bad owner).
    Unsafe,
    /// A bound was passed (output, a file, a listing, an archive).
    TooLarge,
    /// Moving bytes between host and box failed.
    TransferFailed,
    /// Permission denied by the operating system.
    PermissionDenied,
    /// A holder whose claim was taken tried to write: a later generation holds the run.
    Fenced,
    /// The caller did not say who it is, or named a key nobody holds (a service's API key).
    Unauthenticated,
    /// Too many requests, or a quota reached: try again later (a service says when).
    RateLimited,
    /// Anything else; the message says what.
    Unknown,
}

impl ErrorCode {
    /// The code as written in JSON and in messages: `not_found`, `too_large`...
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Invalid => "invalid",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Gone => "gone",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Aborted => "aborted",
            ErrorCode::Refused => "refused",
            ErrorCode::Unsafe => "unsafe",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::TransferFailed => "transfer_failed",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Fenced => "fenced",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Unknown => "unknown",
        }
    }
}

impl ErrorCode {
    /// Every code, in the order they are declared: what [`ErrorCode::from_str`] accepts.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::Invalid,
        ErrorCode::Unsupported,
        ErrorCode::NotFound,
        ErrorCode::Gone,
        ErrorCode::Timeout,
        ErrorCode::Aborted,
        ErrorCode::Refused,
        ErrorCode::Unsafe,
        ErrorCode::TooLarge,
        ErrorCode::TransferFailed,
        ErrorCode::PermissionDenied,
        ErrorCode::Fenced,
        ErrorCode::Unauthenticated,
        ErrorCode::RateLimited,
        ErrorCode::Unknown,
    ];

    /// The code a peer named on a wire (a runner's answer, a supervisor's reply), where an
    /// unrecognised name is the peer's own business: `unknown`, never a failure. Errno names a
    /// box's system call gave (`ENOENT`, `EACCES`, `EPERM`) map as [`Error::io`] maps them.
    pub fn from_wire(code: &str) -> ErrorCode {
        code.parse().unwrap_or(match code {
            "ENOENT" => ErrorCode::NotFound,
            "EACCES" | "EPERM" => ErrorCode::PermissionDenied,
            "EINVAL" => ErrorCode::Invalid,
            _ => ErrorCode::Unknown,
        })
    }
}

/// A name that is not one of [`ErrorCode::ALL`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownErrorCode(pub String);

impl fmt::Display for UnknownErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not an error code", self.0)
    }
}

impl std::error::Error for UnknownErrorCode {}

/// The one parser of codes: the inverse of [`ErrorCode::as_str`].
///
/// ```
/// use agentbox_core::ErrorCode;
/// assert_eq!("fenced".parse::<ErrorCode>(), Ok(ErrorCode::Fenced));
/// assert!("nope".parse::<ErrorCode>().is_err());
/// ```
impl std::str::FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        ErrorCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownErrorCode(s.to_string()))
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mark of [`Error::not_made`].
#[derive(Debug)]
struct NotMade;

impl fmt::Display for NotMade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the call was never made")
    }
}

impl std::error::Error for NotMade {}

/// A failure the caller is expected to handle.
///
/// ```
/// use agentbox_core::{Error, ErrorCode};
/// let e = Error::invalid("spec.max_lifetime: must be positive");
/// assert_eq!(e.code(), ErrorCode::Invalid);
/// assert_eq!(e.to_string(), "invalid: spec.max_lifetime: must be positive");
/// ```
#[derive(Clone)]
pub struct Error {
    code: ErrorCode,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error with a code and a message that names what was wrong and why.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The machine code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message, without the code.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context` put in front of its message: `"{context}: {message}"`.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// The same error, marked as one of a call that was never made: refused or given up on
    /// before it reached the box's platform (a call queued behind another whose caller gave up
    /// before its turn). A ledger that counts calls ([`Error::is_not_made`]) leaves it out.
    ///
    /// ```
    /// use agentbox_core::Error;
    /// let e = Error::aborted("the caller gave up before its turn").not_made();
    /// assert!(e.is_not_made());
    /// assert!(!Error::aborted("the caller gave up while it ran").is_not_made());
    /// ```
    pub fn not_made(self) -> Self {
        self.with_source(NotMade)
    }

    /// Whether [`Error::not_made`] marked the error.
    pub fn is_not_made(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(|s| s.downcast_ref::<NotMade>().is_some())
    }

    /// An I/O failure while doing `what` (which should name the path), with the code the
    /// errno maps to: ENOENT not_found, EACCES/EPERM permission_denied, EINVAL invalid...
    pub fn io(err: std::io::Error, what: impl fmt::Display) -> Self {
        let code = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorCode::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            std::io::ErrorKind::InvalidInput => ErrorCode::Invalid,
            std::io::ErrorKind::TimedOut => ErrorCode::Timeout,
            _ => ErrorCode::Unknown,
        };
        Error::new(code, format!("{what}: {err}")).with_source(err)
    }
}

macro_rules! constructors {
    ($($name:ident => $code:ident),* $(,)?) => {
        impl Error {
            $(
                #[doc = concat!("An error with code `", stringify!($name), "`.")]
                pub fn $name(message: impl Into<String>) -> Self {
                    Error::new(ErrorCode::$code, message)
                }
            )*
        }
    };
}

constructors! {
    invalid => Invalid,
    unsupported => Unsupported,
    not_found => NotFound,
    gone => Gone,
    timeout => Timeout,
    aborted => Aborted,
    refused => Refused,
    unsafe_ => Unsafe,
    too_large => TooLarge,
    transfer_failed => TransferFailed,
    fenced => Fenced,
    unauthenticated => Unauthenticated,
    rate_limited => RateLimited,
    unknown => Unknown,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("code", &self.code).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", &s.to_string());
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_errno_to_codes() {
        let e = Error::io(std::io::Error::from_raw_os_error(2), "reading /x");
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.message().starts_with("reading /x: "));
        let e = Error::io(std::io::Error::from_raw_os_error(13), "p");
        assert_eq!(e.code(), ErrorCode::PermissionDenied);
    }

    #[test]
    fn every_code_parses_back_from_its_name_and_its_json() {
        for c in ErrorCode::ALL {
            assert_eq!(c.as_str().parse::<ErrorCode>(), Ok(c));
            assert_eq!(ErrorCode::from_wire(c.as_str()), c, "{c}");
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()), "serde and as_str agree on {c}");
        }
        assert_eq!(ErrorCode::from_wire("ENOENT"), ErrorCode::NotFound);
        assert_eq!(ErrorCode::from_wire("EPERM"), ErrorCode::PermissionDenied);
        assert_eq!(ErrorCode::from_wire("no such code"), ErrorCode::Unknown);
        assert!("Fenced".parse::<ErrorCode>().is_err(), "names are exact");
    }

    #[test]
    fn all_lists_every_code() {
        // Exhaustive: a new code fails to compile here until it has a place in ALL.
        fn index(c: ErrorCode) -> usize {
            match c {
                ErrorCode::Invalid => 0,
                ErrorCode::Unsupported => 1,
                ErrorCode::NotFound => 2,
                ErrorCode::Gone => 3,
                ErrorCode::Timeout => 4,
                ErrorCode::Aborted => 5,
                ErrorCode::Refused => 6,
                ErrorCode::Unsafe => 7,
                ErrorCode::TooLarge => 8,
                ErrorCode::TransferFailed => 9,
                ErrorCode::PermissionDenied => 10,
                ErrorCode::Fenced => 11,
                ErrorCode::Unauthenticated => 12,
                ErrorCode::RateLimited => 13,
                ErrorCode::Unknown => 14,
            }
        }
        for (i, c) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(index(c), i, "{c}");
        }
    }

    #[test]
    fn codes_serialize_as_snake_case() {
        assert_eq!(serde_json::to_string(&ErrorCode::TooLarge).unwrap(), "\"too_large\"");
        assert_eq!(ErrorCode::TransferFailed.to_string(), "transfer_failed");
    }
}
