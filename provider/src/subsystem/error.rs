//! Errors of subsystem operations: which operation failed, the errno class
//! (the same [`ErrorKind`] the verbs use) and why.

use std::fmt;

use crate::verbs::{self, ErrorKind};

/// A subsystem operation, named in every [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Subsystem::add_device`](super::Subsystem::add_device).
    AddDevice,
    /// [`Subsystem::remove_device`](super::Subsystem::remove_device).
    RemoveDevice,
    /// [`Subsystem::move_device`](super::Subsystem::move_device).
    MoveDevice,
    /// Looking a device up or opening it through the subsystem.
    OpenDevice,
    /// [`Subsystem::register_client`](super::Subsystem::register_client).
    RegisterClient,
    /// [`Subsystem::unregister_client`](super::Subsystem::unregister_client).
    UnregisterClient,
    /// [`Subsystem::create_namespace`](super::Subsystem::create_namespace).
    CreateNamespace,
    /// [`Subsystem::delete_namespace`](super::Subsystem::delete_namespace).
    DeleteNamespace,
    /// Looking a namespace up.
    LookupNamespace,
    /// [`Subsystem::set_mode`](super::Subsystem::set_mode).
    SetMode,
    /// A driver in the emulator (namespace or hotplug driver).
    Driver,
    /// [`Subsystem::address_change`](super::Subsystem::address_change).
    AddressChange,
}

/// A failed subsystem operation.
///
/// ```
/// use softverbs::subsystem::{Error, Op};
/// use softverbs::verbs::ErrorKind;
/// let e = Error::new(Op::SetMode, ErrorKind::Busy, "namespaces other than the initial one exist");
/// assert_eq!(e.errno(), libc::EBUSY);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    op: Op,
    kind: ErrorKind,
    detail: String,
}

impl Error {
    /// An error of `op` with class `kind` and an explanation.
    pub fn new(op: Op, kind: ErrorKind, detail: impl Into<String>) -> Error {
        Error {
            op,
            kind,
            detail: detail.into(),
        }
    }

    /// A verbs error raised while running `op` (keeps its class and text).
    pub fn from_verbs(op: Op, e: &verbs::Error) -> Error {
        Error::new(op, e.kind(), e.to_string())
    }

    /// The operation that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The errno class.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno value.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    /// The explanation.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = std::io::Error::from_raw_os_error(self.errno());
        write!(f, "{:?}: {} ({})", self.op, self.detail, errno)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

/// Result of a subsystem operation.
pub type Result<T> = std::result::Result<T, Error>;

/// `Error::new(Op::$op, ErrorKind::$kind, format!(...))`.
macro_rules! serr {
    ($op:ident, $kind:ident, $($fmt:tt)+) => {
        $crate::subsystem::Error::new(
            $crate::subsystem::Op::$op,
            $crate::verbs::ErrorKind::$kind,
            format!($($fmt)+),
        )
    };
}
pub(crate) use serr;
