//! Linux network namespaces: their identities, and running code inside one.
//!
//! Used by the hardware backend's discovery (below) and by the emulator's
//! Linux namespace driver, which creates the UDP sockets of soft devices
//! inside the namespace of the interface they are bound to.
//!
//! In exclusive mode an RDMA device belongs to one network namespace: only
//! there is it listed (`/sys/class/infiniband` of a sysfs mounted in that
//! namespace, the RDMA netlink device dump of a socket created in it) and
//! only from a thread in it can it be opened (the kernel checks the
//! opener's namespace in `ib_uverbs_open`). A namespace is identified by the
//! inode (and device) of its `/proc/<pid>/ns/net` file; two paths name the
//! same namespace when those match.
//!
//! [`in_netns`] (and [`in_netns_file`], for a namespace already open) runs
//! a closure on a short-lived thread that entered another namespace with
//! `setns(2)` (which needs `CAP_SYS_ADMIN`): what it opens there (a socket,
//! a netlink socket, a device context) stays in that namespace and usable
//! from every thread afterwards.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A network namespace's identity: the device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    /// `st_dev` of the nsfs file.
    pub dev: u64,
    /// `st_ino` of the nsfs file (what `ip netns identify` and
    /// `readlink /proc/self/ns/net` show).
    pub ino: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net:[{}]", self.ino)
    }
}

impl NetnsId {
    /// The namespace a path names (`/proc/<pid>/ns/net`, `/run/netns/<name>`).
    ///
    /// # Errors
    ///
    /// The `stat(2)` error.
    pub fn of_path(path: &Path) -> io::Result<NetnsId> {
        let m = std::fs::metadata(path)?;
        Ok(NetnsId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The namespace an open nsfs file refers to.
    ///
    /// # Errors
    ///
    /// The `fstat(2)` error.
    pub fn of_file(file: &File) -> io::Result<NetnsId> {
        let m = file.metadata()?;
        Ok(NetnsId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The calling thread's namespace.
    ///
    /// # Errors
    ///
    /// The `stat(2)` error (no procfs).
    pub fn current() -> io::Result<NetnsId> {
        NetnsId::of_path(Path::new("/proc/thread-self/ns/net"))
            .or_else(|_| NetnsId::of_path(Path::new("/proc/self/ns/net")))
    }
}

/// The path of the namespace named `name` by `ip netns add`.
pub fn named(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Runs `f` on a thread inside the network namespace at `path`.
///
/// # Errors
///
/// Opening `path` or `setns(2)` failed (`EPERM` without `CAP_SYS_ADMIN`).
pub fn in_netns<R: Send>(path: &Path, f: impl FnOnce() -> R + Send) -> io::Result<R> {
    in_netns_file(&File::open(path)?, f)
}

/// Runs `f` on a thread inside the network namespace `file` refers to (an
/// open nsfs file: `/proc/<pid>/ns/net`, `/run/netns/<name>`).
///
/// # Errors
///
/// `setns(2)` failed (`EPERM` without `CAP_SYS_ADMIN`, `EINVAL` if `file`
/// is not a network namespace); the thread panicked.
///
/// # Examples
///
/// ```no_run
/// use std::fs::File;
/// use softverbs::netns::{in_netns_file, NetnsId};
///
/// let ns = File::open("/run/netns/blue")?;
/// let there = in_netns_file(&ns, NetnsId::current)??;
/// println!("blue is {there}");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn in_netns_file<R: Send>(file: &File, f: impl FnOnce() -> R + Send) -> io::Result<R> {
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on a descriptor that `file` keeps open for the
            // call; CLONE_NEWNET changes only the calling thread's network
            // namespace, and this thread ends when `f` returns.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_and_entering_our_own_namespace() {
        let me = NetnsId::current().expect("procfs");
        assert_eq!(me, NetnsId::of_path(Path::new("/proc/self/ns/net")).unwrap());
        assert!(me.to_string().starts_with("net:["));
        assert_eq!(named("blue"), Path::new("/run/netns/blue"));
        match in_netns(Path::new("/proc/self/ns/net"), || NetnsId::current().unwrap()) {
            Ok(there) => assert_eq!(there, me),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                println!("SKIP entering a namespace: {e} (needs CAP_SYS_ADMIN)")
            }
            Err(e) => panic!("setns into our own namespace: {e}"),
        }
        assert!(in_netns(Path::new("/nonexistent/ns"), || ()).is_err());
    }
}
