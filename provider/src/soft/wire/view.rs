//! Checked construction of the zero-copy header views.
//!
//! Every view type is a `#[repr(C)]` struct of byte-order-aware fields with
//! alignment 1, so any byte slice that is long enough is a valid view. The
//! only check needed is the length, and zerocopy performs it without
//! panicking.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::WireError;

/// Views the first `size_of::<T>()` bytes of `buf` as a `T`.
pub(super) fn prefix<T>(buf: &[u8]) -> Result<&T, WireError>
where
    T: FromBytes + KnownLayout + Immutable + Unaligned,
{
    T::ref_from_prefix(buf)
        .map(|(view, _rest)| view)
        .map_err(|_| WireError::Truncated)
}

/// Mutably views the first `size_of::<T>()` bytes of `buf` as a `T`.
pub(super) fn prefix_mut<T>(buf: &mut [u8]) -> Result<&mut T, WireError>
where
    T: FromBytes + IntoBytes + KnownLayout + Unaligned,
{
    T::mut_from_prefix(buf)
        .map(|(view, _rest)| view)
        .map_err(|_| WireError::Truncated)
}
