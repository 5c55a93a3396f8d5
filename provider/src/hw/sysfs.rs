//! sysfs as the RDMA subsystem lays it out: the fallback for listing
//! devices where RDMA netlink is unavailable, and the `ib_core` module
//! parameter that mirrors the netns mode.
//!
//! - `<root>/class/infiniband/<dev>/node_guid`: the devices (of the network
//!   namespace sysfs was *mounted* in, which is why netlink is preferred:
//!   a netlink socket answers for the namespace it was created in).
//! - `<root>/class/infiniband_verbs/uverbsN/ibdev`: which devices can be
//!   opened from user space. The uverbs node goes first when a device is
//!   unregistered (and the unregistration then waits for every open context
//!   of a driver that cannot disassociate them), so its disappearance is
//!   the earliest sign of a removal.
//! - `<root>/module/ib_core/parameters/netns_mode`: `Y` (shared) or `N`
//!   (exclusive); the kernel variable behind it is the one
//!   `rdma system set netns` changes, so it reads the current mode.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use crate::subsystem::NetnsMode;

/// An RDMA device as sysfs lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsDevice {
    /// Name (`mlx5_0`).
    pub name: String,
    /// Node GUID (host-order value of the big-endian GUID), if readable.
    pub node_guid: Option<u64>,
    /// Its uverbs node (`uverbs0`), if user space can open it.
    pub uverbs: Option<String>,
}

/// Parses a GUID as sysfs prints it (`248a:0703:0049:d469`).
pub fn parse_guid(s: &str) -> Option<u64> {
    let s = s.trim();
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 4 || parts.iter().any(|p| p.len() != 4) {
        return None;
    }
    let mut v = 0u64;
    for p in parts {
        v = (v << 16) | u64::from(u16::from_str_radix(p, 16).ok()?);
    }
    Some(v)
}

fn read_trimmed(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The devices under `root` (normally `/sys`), by name. No
/// `class/infiniband` directory (no RDMA subsystem) is an empty list.
///
/// # Errors
///
/// Reading a directory that exists failed.
pub fn devices(root: &Path) -> io::Result<Vec<SysfsDevice>> {
    let class = root.join("class/infiniband");
    let entries = match fs::read_dir(&class) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut uverbs: BTreeMap<String, String> = BTreeMap::new();
    match fs::read_dir(root.join("class/infiniband_verbs")) {
        Ok(nodes) => {
            for n in nodes {
                let n = n?;
                let node = n.file_name().to_string_lossy().into_owned();
                if let Some(ibdev) = read_trimmed(&n.path().join("ibdev")) {
                    uverbs.insert(ibdev, node);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let node_guid = read_trimmed(&e.path().join("node_guid")).and_then(|g| parse_guid(&g));
        out.push(SysfsDevice {
            uverbs: uverbs.remove(&name),
            name,
            node_guid,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Parses the `ib_core` `netns_mode` parameter (`Y`/`1`: shared).
pub fn parse_netns_mode(s: &str) -> Option<NetnsMode> {
    match s.trim() {
        "Y" | "y" | "1" => Some(NetnsMode::Shared),
        "N" | "n" | "0" => Some(NetnsMode::Exclusive),
        _ => None,
    }
}

/// The netns mode from `<root>/module/ib_core/parameters/netns_mode`.
///
/// # Errors
///
/// `NotFound` without `ib_core`; `InvalidData` for an unexpected value.
pub fn netns_mode(root: &Path) -> io::Result<NetnsMode> {
    let p = root.join("module/ib_core/parameters/netns_mode");
    let s = fs::read_to_string(&p)?;
    parse_netns_mode(&s)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{}: unexpected {s:?}", p.display())))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A scratch directory removed on drop.
    pub(crate) struct Scratch(pub(crate) PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "softverbs-sysfs-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }

        pub(crate) fn file(&self, rel: &str, content: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }

        pub(crate) fn remove(&self, rel: &str) {
            fs::remove_dir_all(self.0.join(rel)).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A host with two ConnectX ports and a soft-RoCE device, as sysfs shows
    /// it (the files the scan reads, with their real contents).
    pub(crate) fn sample_host(tag: &str) -> Scratch {
        let s = Scratch::new(tag);
        s.file("class/infiniband/mlx5_0/node_guid", "248a:0703:0049:d468\n");
        s.file("class/infiniband/mlx5_0/node_type", "1: CA\n");
        s.file("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
        s.file("class/infiniband/mlx5_1/node_guid", "248a:0703:0049:d469\n");
        s.file("class/infiniband/rxe0/node_guid", "5054:00ff:fe12:3456\n");
        s.file("class/infiniband_verbs/uverbs0/ibdev", "mlx5_0\n");
        s.file("class/infiniband_verbs/uverbs0/abi_version", "1\n");
        s.file("class/infiniband_verbs/uverbs1/ibdev", "mlx5_1\n");
        s.file("class/infiniband_verbs/uverbs2/ibdev", "rxe0\n");
        s.file("class/infiniband_verbs/abi_version", "6\n");
        s.file("module/ib_core/parameters/netns_mode", "Y\n");
        s
    }

    #[test]
    fn guids_and_modes() {
        assert_eq!(parse_guid("248a:0703:0049:d469\n"), Some(0x248a_0703_0049_d469));
        assert_eq!(parse_guid("0000:0000:0000:0000"), Some(0));
        for bad in ["248a:0703:0049", "248a:0703:0049:d46", "zzzz:0703:0049:d469", ""] {
            assert_eq!(parse_guid(bad), None, "{bad}");
        }
        assert_eq!(parse_netns_mode("Y\n"), Some(NetnsMode::Shared));
        assert_eq!(parse_netns_mode("N"), Some(NetnsMode::Exclusive));
        assert_eq!(parse_netns_mode("maybe"), None);
    }

    #[test]
    fn a_sample_host_scans() {
        let s = sample_host("scan");
        let devs = devices(&s.0).unwrap();
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0", "mlx5_1", "rxe0"]);
        assert_eq!(devs[1].node_guid, Some(0x248a_0703_0049_d469));
        assert_eq!(devs[2].uverbs.as_deref(), Some("uverbs2"));
        assert_eq!(netns_mode(&s.0).unwrap(), NetnsMode::Shared);
        s.file("module/ib_core/parameters/netns_mode", "N\n");
        assert_eq!(netns_mode(&s.0).unwrap(), NetnsMode::Exclusive);

        // Unregistering rxe0: its uverbs node goes first.
        s.remove("class/infiniband_verbs/uverbs2");
        let devs = devices(&s.0).unwrap();
        assert_eq!((devs[2].name.as_str(), devs[2].uverbs.as_deref()), ("rxe0", None));
        s.remove("class/infiniband/rxe0");
        assert_eq!(devices(&s.0).unwrap().len(), 2);
    }

    #[test]
    fn no_rdma_subsystem_is_an_empty_list() {
        let s = Scratch::new("empty");
        assert!(devices(&s.0).unwrap().is_empty());
        assert_eq!(netns_mode(&s.0).unwrap_err().kind(), io::ErrorKind::NotFound);
        // This machine, whatever it has.
        let here = devices(Path::new("/sys")).unwrap();
        println!("{} RDMA device(s) in /sys", here.len());
    }
}
