//! Typed errors for every verb, each carrying the errno a hardware provider
//! returns for the same misuse.

use std::fmt;

/// The class of a verbs error, named after the errno that libibverbs
/// providers return for it.
///
/// The conformance suite compares backends by this value, so a soft-provider
/// error and an mlx5 error for the same misuse compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `EINVAL`: an invalid argument, attribute, mask, state or opcode.
    InvalidArgument,
    /// `ENOMEM`: a queue is full or a resource limit was reached.
    NoMemory,
    /// `EBUSY`: the object is still in use (a CQ with QPs, an MR with bound
    /// windows, a PD with objects).
    Busy,
    /// `ENODEV`: the device was removed (hot-unplug) or is not there.
    NoDevice,
    /// `EOPNOTSUPP`: the backend or device does not implement this.
    NotSupported,
    /// `EIO`: an I/O failure below the verbs layer.
    Io,
    /// `ENOENT`: no such object (device name, GID index, port).
    NotFound,
    /// `EAGAIN`: nothing available right now (e.g. a non-blocking event read).
    WouldBlock,
    /// `ETIMEDOUT`: a wait ran out of time.
    TimedOut,
    /// `EPERM`/`EACCES`: not permitted.
    PermissionDenied,
    /// Any other errno, kept verbatim (hardware backend).
    Other(i32),
}

impl ErrorKind {
    /// The errno value (positive) that corresponds to this kind.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument => libc::EINVAL,
            ErrorKind::NoMemory => libc::ENOMEM,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::NoDevice => libc::ENODEV,
            ErrorKind::NotSupported => libc::EOPNOTSUPP,
            ErrorKind::Io => libc::EIO,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::WouldBlock => libc::EAGAIN,
            ErrorKind::TimedOut => libc::ETIMEDOUT,
            ErrorKind::PermissionDenied => libc::EPERM,
            ErrorKind::Other(e) => e,
        }
    }

    /// The kind for an errno value returned by libibverbs (positive or
    /// negative).
    pub fn from_errno(errno: i32) -> Self {
        match errno.abs() {
            libc::EINVAL => ErrorKind::InvalidArgument,
            libc::ENOMEM => ErrorKind::NoMemory,
            libc::EBUSY => ErrorKind::Busy,
            libc::ENODEV | libc::ENXIO => ErrorKind::NoDevice,
            libc::EOPNOTSUPP | libc::ENOSYS => ErrorKind::NotSupported,
            libc::EIO => ErrorKind::Io,
            libc::ENOENT => ErrorKind::NotFound,
            libc::EAGAIN => ErrorKind::WouldBlock,
            libc::ETIMEDOUT => ErrorKind::TimedOut,
            libc::EPERM | libc::EACCES => ErrorKind::PermissionDenied,
            e => ErrorKind::Other(e),
        }
    }
}

/// The verb that failed. Part of every [`Error`] so that a report names the
/// operation as well as the cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // one variant per verb; the names are the documentation
pub enum Verb {
    GetDeviceList,
    OpenDevice,
    QueryDevice,
    QueryPort,
    QueryGid,
    QueryPkey,
    AllocPd,
    DeallocPd,
    RegMr,
    ReregMr,
    DeregMr,
    AllocMr,
    MapMrPages,
    AllocMw,
    BindMw,
    DeallocMw,
    CreateCompChannel,
    DestroyCompChannel,
    GetCqEvent,
    CreateCq,
    ResizeCq,
    DestroyCq,
    PollCq,
    ReqNotifyCq,
    CreateQp,
    ModifyQp,
    QueryQp,
    DestroyQp,
    CreateSrq,
    ModifySrq,
    QuerySrq,
    DestroySrq,
    CreateAh,
    DestroyAh,
    PostSend,
    PostRecv,
    PostSrqRecv,
    GetAsyncEvent,
    MemoryAccess,
}

/// A verbs error: which verb, what class (with its errno), and why.
///
/// ```
/// use softverbs::verbs::{Error, ErrorKind, Verb};
/// let e = Error::new(Verb::ModifyQp, ErrorKind::InvalidArgument, "RESET->RTR is not a legal transition");
/// assert_eq!(e.errno(), libc::EINVAL);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    verb: Verb,
    kind: ErrorKind,
    detail: std::borrow::Cow<'static, str>,
}

impl Error {
    /// An error for `verb` of class `kind`, with a human explanation.
    #[cold]
    pub fn new(verb: Verb, kind: ErrorKind, detail: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Error {
            verb,
            kind,
            detail: detail.into(),
        }
    }

    /// The verb that failed.
    pub fn verb(&self) -> Verb {
        self.verb
    }

    /// The class of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno a hardware provider returns for this failure.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    /// The explanation.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The same error attributed to another verb (for layered calls).
    pub fn with_verb(mut self, verb: Verb) -> Self {
        self.verb = verb;
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = std::io::Error::from_raw_os_error(self.errno());
        write!(f, "{:?}: {} ({})", self.verb, self.detail, errno)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

/// Result of a verb.
pub type Result<T> = std::result::Result<T, Error>;

/// A failed `post_send` / `post_recv`: the index of the first work request
/// that was not posted (ibverbs' `bad_wr`) and why. Every request before
/// `index` was posted and will complete; none at or after it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostError {
    /// Index into the slice of work requests of the one that was rejected.
    pub index: usize,
    /// Why it was rejected.
    pub error: Error,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} rejected: {}", self.index, self.error)
    }
}

impl From<PostError> for Error {
    /// The reason, without the index (`?` on a post in a function that
    /// returns [`Result`]).
    fn from(e: PostError) -> Error {
        e.error
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Shorthand constructors used by backends.
macro_rules! verr {
    ($verb:ident, $kind:ident, $($fmt:tt)+) => {
        $crate::verbs::Error::new(
            $crate::verbs::Verb::$verb,
            $crate::verbs::ErrorKind::$kind,
            format!($($fmt)+),
        )
    };
}
pub(crate) use verr;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_error_converts_into_its_reason() {
        let reason = Error::new(Verb::PostSend, ErrorKind::NoMemory, "send queue full");
        let f = || -> Result<()> {
            Err(PostError {
                index: 2,
                error: reason.clone(),
            })?;
            Ok(())
        };
        assert_eq!(f().unwrap_err(), reason);
    }
}
