//! Named network namespaces the way `ip netns` keeps them: a namespace is
//! pinned by bind-mounting its nsfs file on `/run/netns/NAME`, so it lives
//! without any process in it, and every tool (`ip netns exec`, `ip -n`)
//! finds it by name.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use softverbs::netns::named;

/// A C string of a path.
fn cstr(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// Creates a new network namespace named `name` (`ip netns add NAME`) and
/// returns it open. The namespace is made by `unshare(CLONE_NEWNET)` on a
/// short-lived thread (the process's own threads stay where they are) and
/// pinned on `/run/netns/NAME`. Unlike `ip netns add`, `/run/netns` is not
/// made a shared mount point (only needed for the name to appear in other
/// mount namespaces created later).
///
/// # Errors
///
/// `AlreadyExists` if the name is taken; `EPERM` without
/// `CAP_SYS_ADMIN`; the mount error.
pub(crate) fn create(name: &str) -> io::Result<File> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not a namespace name"),
        ));
    }
    std::fs::create_dir_all("/run/netns")?;
    let path = named(name);
    // The mount point: created exclusively, so two creators cannot both
    // think they made the namespace.
    drop(OpenOptions::new().write(true).create_new(true).mode(0o0).open(&path)?);
    let target = cstr(&path)?;
    let made = std::thread::scope(|s| {
        s.spawn(|| -> io::Result<()> {
            // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread
            // into a new network namespace; the thread ends right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let source = c"/proc/thread-self/ns/net";
            // SAFETY: both paths are NUL-terminated strings that outlive
            // the call; a bind mount takes no filesystem type or data.
            let r = unsafe {
                libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    c"none".as_ptr(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    File::open(&path)
}

/// Removes the name of a namespace (`ip netns del NAME`): unmounts
/// `/run/netns/NAME` and deletes the mount point. The namespace itself dies
/// when nothing else holds it (no process, socket or open descriptor).
///
/// # Errors
///
/// `NotFound` if there is no such name; the unmount error.
pub(crate) fn delete(name: &str) -> io::Result<()> {
    let path = named(name);
    if !path.exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no namespace '{name}'"),
        ));
    }
    let target = cstr(&path)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = io::Error::last_os_error();
        // EINVAL: not a mount point (a leftover file); remove it anyway.
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    std::fs::remove_file(&path)
}

/// Whether this process can create network namespaces: tries
/// `unshare(CLONE_NEWNET)` on a throw-away thread (the namespace dies with
/// it).
///
/// # Errors
///
/// The `unshare(2)` error (`EPERM` without `CAP_SYS_ADMIN`).
pub(crate) fn check() -> io::Result<()> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread,
            // which ends at once, into a new network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}
