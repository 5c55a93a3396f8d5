//! The Linux namespace driver: real network namespaces, real interfaces,
//! soft devices on UDP sockets that live in the namespace of their
//! interface.

mod factory;
mod nsfs;
mod rtnl;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use softverbs::netns::{in_netns_file, named, NetnsId};
use softverbs::soft::engine::EngineMode;
use softverbs::subsystem::{
    AddressChange, DeviceInfo, Error, NamespaceId, NetnsMode, RemovalReport, Result, Subsystem,
};
use softverbs::verbs::ErrorKind;

use self::factory::LinuxFactory;
use self::rtnl::{LinkInfo, Rtnl, IFNAME_MAX};
use super::{device_namespace, err, lock, NetnsDriver, INIT_NETNS};

/// The kind of an I/O error (an errno where there is one).
fn io_kind(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::EEXIST) | Some(libc::EADDRINUSE) => ErrorKind::Busy,
        Some(libc::ENODEV) => ErrorKind::NotFound,
        Some(n) => ErrorKind::from_errno(n),
        None => match e.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::AddrInUse => ErrorKind::Busy,
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidArgument,
            _ => ErrorKind::Io,
        },
    }
}

fn io_err(what: impl std::fmt::Display, e: &io::Error) -> Error {
    err(io_kind(e), format!("{what}: {e}"))
}

/// The prefix length given to an address of [`LinuxNetns::add_link`]: /24
/// for IPv4, /64 for IPv6.
fn default_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        24
    } else {
        64
    }
}

/// A network namespace the driver knows.
#[derive(Debug)]
struct NsRec {
    id: NamespaceId,
    /// The namespace, held open (the initial one: the driver's creator's).
    file: Arc<File>,
    /// Its identity when the driver took it (to notice a deletion and a
    /// different namespace reusing the name).
    nsid: NetnsId,
    /// An rtnetlink socket opened inside it.
    rtnl: Arc<Rtnl>,
}

/// An interface the driver manages.
#[derive(Debug)]
struct LinkRec {
    /// The address the driver gives it (again after every move).
    addr: IpAddr,
    prefix: u8,
    /// Where it is.
    ns: NamespaceId,
    /// The soft device bound to it.
    device: Option<String>,
    /// Whether it was up with carrier when last looked at (the state of
    /// its device's port).
    port_active: bool,
    /// Addresses its device has GIDs for that the interface lacked when
    /// last looked at (reported to the subsystem as removed).
    missing: Vec<IpAddr>,
}

#[derive(Debug, Default)]
struct LState {
    netns: BTreeMap<String, NsRec>,
    links: BTreeMap<String, LinkRec>,
}

impl LState {
    fn ns(&self, id: NamespaceId) -> Option<&NsRec> {
        self.netns.values().find(|n| n.id == id)
    }

    fn ns_name(&self, id: NamespaceId) -> String {
        self.netns
            .iter()
            .find(|(_, n)| n.id == id)
            .map_or_else(|| id.to_string(), |(name, _)| name.clone())
    }
}

/// The namespace driver for real Linux network namespaces (docs/design.md §5):
/// namespaces are network namespaces, interfaces are `net_device`s, and a
/// soft device bound to an interface runs on a UDP link whose sockets were
/// created *inside* the interface's namespace, from the interface's
/// addresses (its GID table). When the interface moves, the device follows:
/// an unplug and a replug in the new namespace (reason `NetnsMove`), whose
/// new sockets are created there.
///
/// What it does on the host, operation by operation:
///
/// - [`add_netns`](NetnsDriver::add_netns): `ip netns add` — a new
///   namespace pinned on `/run/netns/NAME` (made with `unshare` on a helper
///   thread; its loopback is brought up), or adopts the one of that name if
///   it exists. The initial namespace ([`INIT_NETNS`]) is the network
///   namespace of the thread that made the driver.
/// - [`del_netns`](NetnsDriver::del_netns): moves the interfaces the driver
///   manages back to the initial namespace (their devices follow), then
///   `ip netns del`. Interfaces the driver does not manage get the kernel's
///   rules (virtual ones such as veth are destroyed, physical ones return).
/// - [`add_link`](NetnsDriver::add_link): adopts the interface of that name
///   if a known namespace has one; otherwise creates a veth pair `IF` ↔
///   `IF_p` in the initial namespace (the peer stays there, up, without an
///   address). Either way `IF` gets the address (/24 for IPv4, /64 for
///   IPv6, no duplicate address detection) and is brought up.
///   [`LinuxNetns::add_veth`] makes a pair whose two ends are both managed.
/// - [`link_set_netns`](NetnsDriver::link_set_netns): `ip link set IF netns
///   NS` over rtnetlink (`IFLA_NET_NS_FD`). The kernel drops an
///   interface's addresses when it moves and leaves it down; the driver
///   gives its address back and brings it up in the new namespace, as an
///   `ip` user would. Then the device follows.
/// - [`add_device`](NetnsDriver::add_device): a soft device on a UDP link
///   bound to every address of the interface (port 4791 when free in that
///   namespace, so standard GIDs; see `softverbs::soft::link::udp`).
/// - [`sync`](NetnsDriver::sync): follows what `ip` did outside the process
///   (see below).
///
/// # Following changes made outside (`sync`)
///
/// The driver polls: each [`sync`](NetnsDriver::sync) lists the interfaces
/// of every namespace it knows (an `RTM_GETLINK` dump, and `RTM_GETADDR`
/// where a managed interface has a device, on the socket it keeps
/// inside each) and checks that every named namespace is still mounted.
/// Polling was chosen over subscribing to `RTNLGRP_LINK` because moves show
/// up as a deletion in one namespace and a creation in another, which a
/// scan sees whole; it also cannot overflow. Then, for each managed
/// interface:
///
/// - in another known namespace: it was moved (`ip link set … netns …`).
///   The driver restores its address and brings it up there, and its device
///   follows (`NetnsMove`).
/// - in no known namespace (deleted, or moved to a namespace the driver
///   does not know): its device is hot-unplugged (the full removal
///   sequence, reason `Unplug`) and the driver forgets the interface.
///   Interfaces are found by name: a renamed interface counts as deleted.
/// - up with carrier (`IFF_UP` and `IFF_LOWER_UP`, what rxe's port follows)
///   changed: its device's port goes down (PORT_ERR; `query_port` says
///   `PORT_DOWN`) or up (PORT_ACTIVE) through
///   [`SoftDevice::set_port_active`](softverbs::soft::SoftDevice::set_port_active).
/// - an address its device has a GID for left the interface (`ip addr
///   del`, or moved to another interface), or came back: reported to the
///   subsystem ([`Subsystem::address_change`]), so the connection
///   manager's ids bound through it get ADDR_CHANGE once. The device's
///   GIDs stay fixed for its life (move it or re-add it for new ones).
///   [`del_addr`](NetnsDriver::del_addr) and
///   [`add_addr`](NetnsDriver::add_addr) do `ip addr del`/`add` and then
///   a `sync`.
///
/// A namespace whose name disappeared (`ip netns del` outside) is deleted
/// from the subsystem; the devices of the managed interfaces in it are
/// hot-unplugged first (so their sockets stop pinning the namespace, and
/// the kernel can destroy it: a veth inside is destroyed with its peer,
/// whose device the next `sync` unplugs).
///
/// # Lifetime and threads
///
/// Like `ip`, the driver leaves what it made on the host when it is
/// dropped: namespaces, interfaces (and the devices stay in the subsystem
/// until removed). Calls may come from any thread; the driver holds no lock
/// of its own while it calls into the subsystem (upcalls may call back),
/// so topology calls on the same interface from several threads at once
/// are not ordered against each other: call `sync` from one thread.
///
/// # Privileges
///
/// Root (`CAP_SYS_ADMIN` for namespaces and `setns`, `CAP_NET_ADMIN` for
/// interfaces). [`LinuxNetns::check_privileges`] says whether this process
/// has them.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use softverbs::subsystem::{Subsystem, SubsystemConfig};
/// use softverbs_emulator::netns::{LinuxNetns, NetnsDriver};
///
/// let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
/// let drv = LinuxNetns::new(sub.clone())?;
/// drv.add_link("sv0", "10.99.0.1".parse().unwrap())?; // veth sv0 <-> sv0_p
/// drv.add_device("rxe_sv0", "sv0")?;
/// let blue = drv.add_netns("blue")?;
/// drv.link_set_netns("sv0", "blue")?; // the device follows, sockets made in "blue"
/// assert_eq!(sub.device("rxe_sv0")?.namespace(), blue);
/// // `ip link set sv0 down` in another shell, then:
/// drv.sync()?; // PORT_ERR on the device
/// drv.del_netns("blue")?; // sv0 and its device come back
/// drv.del_link("sv0")?;
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
#[derive(Debug)]
pub struct LinuxNetns {
    sub: Arc<Subsystem>,
    state: Arc<Mutex<LState>>,
    engine: EngineMode,
}

impl LinuxNetns {
    /// A driver feeding `subsystem`; its initial namespace is the calling
    /// thread's network namespace. Devices use the inline engine.
    ///
    /// # Errors
    ///
    /// No procfs, or no rtnetlink socket.
    pub fn new(subsystem: Arc<Subsystem>) -> Result<LinuxNetns> {
        Self::with_engine(subsystem, EngineMode::Inline)
    }

    /// [`LinuxNetns::new`], with devices driven by `engine`.
    ///
    /// # Errors
    ///
    /// As [`LinuxNetns::new`].
    pub fn with_engine(subsystem: Arc<Subsystem>, engine: EngineMode) -> Result<LinuxNetns> {
        let file = File::open("/proc/thread-self/ns/net")
            .or_else(|_| File::open("/proc/self/ns/net"))
            .map_err(|e| io_err("opening this thread's network namespace", &e))?;
        let nsid = NetnsId::of_file(&file).map_err(|e| io_err("stat of the network namespace", &e))?;
        let rtnl = Rtnl::open().map_err(|e| io_err("rtnetlink socket", &e))?;
        let mut st = LState::default();
        st.netns.insert(
            INIT_NETNS.to_string(),
            NsRec {
                id: NamespaceId::INIT,
                file: Arc::new(file),
                nsid,
                rtnl: Arc::new(rtnl),
            },
        );
        Ok(LinuxNetns {
            sub: subsystem,
            state: Arc::new(Mutex::new(st)),
            engine,
        })
    }

    /// Whether this process may use the driver: it can create a network
    /// namespace (`unshare(CLONE_NEWNET)` on a throw-away thread, which
    /// needs `CAP_SYS_ADMIN`) and `/run/netns` can be written.
    ///
    /// # Errors
    ///
    /// Why not, in one line (for a test's skip message).
    pub fn check_privileges() -> std::result::Result<(), String> {
        nsfs::check().map_err(|e| format!("cannot create network namespaces: {e}"))?;
        std::fs::create_dir_all("/run/netns").map_err(|e| format!("cannot create /run/netns: {e}"))?;
        Ok(())
    }

    /// Creates a veth pair `a` ↔ `b` in the initial namespace, `a` owning
    /// `addr_a` and `b` owning `addr_b` (prefixes as in
    /// [`add_link`](NetnsDriver::add_link)), both up and both managed by the
    /// driver (each can carry a device and move).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a name longer than 15 bytes; `EBUSY` if a managed
    /// interface has either name or address, or the host has an interface
    /// of either name; the kernel's error.
    pub fn add_veth(&self, a: &str, addr_a: IpAddr, b: &str, addr_b: IpAddr) -> Result<()> {
        for (n, addr) in [(a, addr_a), (b, addr_b)] {
            self.check_new_link(n, addr)?;
        }
        let rtnl = self.rtnl_of(NamespaceId::INIT)?;
        rtnl.ack(rtnl::new_veth(a, b))
            .map_err(|e| io_err(format!("creating veth {a} <-> {b}"), &e))?;
        let made = (|| {
            configure(&rtnl, a, addr_a, default_prefix(addr_a))?;
            configure(&rtnl, b, addr_b, default_prefix(addr_b))?;
            // Carrier comes when both ends are up: read the states now.
            let up = |n: &str| rtnl.link(n).ok().flatten().is_some_and(|l| l.oper_up());
            Ok((up(a), up(b)))
        })();
        match made {
            Ok((up_a, up_b)) => {
                self.record_link(a, addr_a, NamespaceId::INIT, up_a);
                self.record_link(b, addr_b, NamespaceId::INIT, up_b);
                Ok(())
            }
            Err(e) => {
                // Deleting one end deletes both.
                let _ = delete_by_name(&rtnl, a);
                Err(e)
            }
        }
    }

    /// Deletes a managed interface (`ip link del IF`); the device bound to
    /// it is hot-unplugged first, and so is the device of a managed veth
    /// peer, which the kernel deletes with it.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an interface the driver does not manage; the kernel's
    /// error.
    pub fn del_link(&self, ifname: &str) -> Result<()> {
        let (ns, device) = {
            let st = lock(&self.state);
            let l = st
                .links
                .get(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no managed interface '{ifname}'")))?;
            (l.ns, l.device.clone())
        };
        if let Some(dev) = device {
            self.unplug(&dev);
        }
        let rtnl = self.rtnl_of(ns)?;
        let r = delete_by_name(&rtnl, ifname);
        lock(&self.state).links.remove(ifname);
        // A veth peer that is managed too vanished with it.
        self.sync()?;
        r
    }

    /// The interface a device is bound to.
    pub fn device_link(&self, device: &str) -> Option<String> {
        lock(&self.state)
            .links
            .iter()
            .find(|(_, l)| l.device.as_deref() == Some(device))
            .map(|(n, _)| n.clone())
    }

    /// Whether a managed interface was up with carrier when the driver last
    /// looked (its device's port state).
    pub fn link_port_active(&self, ifname: &str) -> Option<bool> {
        lock(&self.state).links.get(ifname).map(|l| l.port_active)
    }

    /// The names of the managed interfaces.
    pub fn links(&self) -> Vec<String> {
        lock(&self.state).links.keys().cloned().collect()
    }

    fn check_new_link(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        if ifname.is_empty() || ifname.len() > IFNAME_MAX || ifname.contains(['/', ' ']) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("'{ifname}' is not an interface name (1 to {IFNAME_MAX} bytes)"),
            ));
        }
        let st = lock(&self.state);
        if st.links.contains_key(ifname) || st.links.values().any(|l| l.addr == addr) {
            return Err(err(
                ErrorKind::Busy,
                format!("interface '{ifname}' or address {addr} exists"),
            ));
        }
        Ok(())
    }

    fn record_link(&self, ifname: &str, addr: IpAddr, ns: NamespaceId, up: bool) {
        lock(&self.state).links.insert(
            ifname.to_string(),
            LinkRec {
                addr,
                prefix: default_prefix(addr),
                ns,
                device: None,
                port_active: up,
                missing: Vec::new(),
            },
        );
    }

    fn rtnl_of(&self, ns: NamespaceId) -> Result<Arc<Rtnl>> {
        lock(&self.state)
            .ns(ns)
            .map(|n| n.rtnl.clone())
            .ok_or_else(|| err(ErrorKind::NotFound, format!("no namespace {ns}")))
    }

    fn factory(&self, device: &str, ifname: &str) -> Arc<LinuxFactory> {
        Arc::new(LinuxFactory {
            name: device.to_string(),
            ifname: ifname.to_string(),
            state: self.state.clone(),
            engine: self.engine,
        })
    }

    /// Hot-unplugs a device (if the subsystem still has it) and unbinds it
    /// from its interface.
    fn unplug(&self, device: &str) {
        let _ = self.sub.remove_device(device);
        for l in lock(&self.state).links.values_mut() {
            if l.device.as_deref() == Some(device) {
                l.device = None;
            }
        }
    }

    /// The device bound to `ifname` follows it to `to` (where its new
    /// sockets are made).
    fn follow(&self, ifname: &str, to: NamespaceId) -> Result<()> {
        let Some(dev) = lock(&self.state).links.get(ifname).and_then(|l| l.device.clone()) else {
            return Ok(());
        };
        let Ok(here) = self.sub.device(&dev) else {
            return Ok(());
        };
        match self.sub.mode() {
            NetnsMode::Exclusive => {
                if here.namespace() != to {
                    if let Err(e) = self.sub.move_device(&dev, to) {
                        // A failed replug leaves the device gone.
                        if self.sub.device(&dev).is_err() {
                            self.unplug(&dev);
                        }
                        return Err(e);
                    }
                }
            }
            NetnsMode::Shared => {
                // Devices stay in the initial namespace, but their sockets
                // must be remade where the interface now is: a new
                // instance (unplug + add).
                self.sub.remove_device(&dev)?;
                if let Err(e) = self.sub.add_device(self.factory(&dev, ifname), NamespaceId::INIT) {
                    self.unplug(&dev);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// After `ifname` arrived in `to` (moved by us or by someone else):
    /// address back, up, record, device follows.
    fn arrived(&self, ifname: &str, to: NamespaceId) -> Result<()> {
        let (addr, prefix) = {
            let st = lock(&self.state);
            let l = st
                .links
                .get(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no managed interface '{ifname}'")))?;
            (l.addr, l.prefix)
        };
        let rtnl = self.rtnl_of(to)?;
        let configured = configure(&rtnl, ifname, addr, prefix);
        if let Some(l) = lock(&self.state).links.get_mut(ifname) {
            l.ns = to;
            if let Ok(info) = &configured {
                l.port_active = info.oper_up();
            }
        }
        configured?;
        self.follow(ifname, to)
    }

    /// A managed interface's namespace and (address, prefix).
    fn managed(&self, ifname: &str) -> Result<(NamespaceId, (IpAddr, u8))> {
        lock(&self.state)
            .links
            .get(ifname)
            .map(|l| (l.ns, (l.addr, l.prefix)))
            .ok_or_else(|| err(ErrorKind::NotFound, format!("no managed interface '{ifname}'")))
    }

    /// The address part of `sync`: for each managed interface with a
    /// device, the addresses the device has GIDs for that left the
    /// interface since the last look (and those that came back) are
    /// reported to the subsystem, so the connection manager's ids bound
    /// through them get ADDR_CHANGE. Returns how many changed.
    fn sync_addrs(&self, seen: &HashMap<String, Vec<(NamespaceId, LinkInfo)>>) -> Result<usize> {
        let managed: Vec<(String, NamespaceId, String, Vec<IpAddr>)> = lock(&self.state)
            .links
            .iter()
            .filter_map(|(n, l)| Some((n.clone(), l.ns, l.device.clone()?, l.missing.clone())))
            .collect();
        let mut by_ns: HashMap<NamespaceId, Vec<(i32, IpAddr)>> = HashMap::new();
        let mut changes = 0;
        for (ifname, ns, device, was_missing) in managed {
            let Some((_, info)) = seen.get(&ifname).and_then(|v| v.iter().find(|(id, _)| *id == ns)) else {
                continue;
            };
            let Some(dev) = self.sub.device(&device).ok().and_then(|d| d.soft_device()) else {
                continue;
            };
            let here = match by_ns.entry(ns) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let addrs = self
                        .rtnl_of(ns)?
                        .addrs()
                        .map_err(|e| io_err(format!("listing the addresses of {ns}"), &e))?;
                    e.insert(addrs)
                }
            };
            let missing: Vec<IpAddr> = dev
                .gids()
                .iter()
                .map(|g| g.to_ip())
                .filter(|a| !here.contains(&(info.index, *a)))
                .collect();
            if missing == was_missing {
                continue;
            }
            let gone = missing.iter().filter(|a| !was_missing.contains(a));
            let back = was_missing.iter().filter(|a| !missing.contains(a));
            for (a, change) in gone
                .map(|a| (*a, AddressChange::Removed))
                .chain(back.map(|a| (*a, AddressChange::Added)))
            {
                changes += 1;
                let _ = self.sub.address_change(&device, a, change);
            }
            if let Some(l) = lock(&self.state).links.get_mut(&ifname) {
                l.missing = missing;
            }
        }
        Ok(changes)
    }

    /// Every interface of every known namespace, by name.
    fn scan(&self) -> Result<HashMap<String, Vec<(NamespaceId, LinkInfo)>>> {
        let mut spaces: Vec<(NamespaceId, Arc<Rtnl>)> = lock(&self.state)
            .netns
            .values()
            .map(|n| (n.id, n.rtnl.clone()))
            .collect();
        spaces.sort_by_key(|(id, _)| *id);
        let mut seen: HashMap<String, Vec<(NamespaceId, LinkInfo)>> = HashMap::new();
        for (id, rtnl) in spaces {
            let links = rtnl
                .links()
                .map_err(|e| io_err(format!("listing the interfaces of {id}"), &e))?;
            for l in links {
                seen.entry(l.name.clone()).or_default().push((id, l));
            }
        }
        Ok(seen)
    }

    /// The external deletion of namespace `name`: unplug what is bound to
    /// interfaces in it, forget them and the namespace.
    fn namespace_vanished(&self, name: &str) -> usize {
        let (id, devices) = {
            let mut st = lock(&self.state);
            let Some(rec) = st.netns.get(name) else { return 0 };
            let id = rec.id;
            let gone: Vec<String> = st
                .links
                .iter()
                .filter(|(_, l)| l.ns == id)
                .map(|(n, _)| n.clone())
                .collect();
            let devices: Vec<String> = gone
                .iter()
                .filter_map(|n| st.links.remove(n).and_then(|l| l.device))
                .collect();
            (id, devices)
        };
        for d in &devices {
            let _ = self.sub.remove_device(d);
        }
        // Our descriptors stop pinning it.
        lock(&self.state).netns.remove(name);
        let _ = self.sub.delete_namespace(id);
        1 + devices.len()
    }
}

/// Gives `ifname` its address and brings it up; returns its state after.
fn configure(rtnl: &Rtnl, ifname: &str, addr: IpAddr, prefix: u8) -> Result<LinkInfo> {
    let find = || -> Result<LinkInfo> {
        rtnl.link(ifname)
            .map_err(|e| io_err(format!("listing interfaces for '{ifname}'"), &e))?
            .ok_or_else(|| err(ErrorKind::NotFound, format!("no interface '{ifname}'")))
    };
    let info = find()?;
    rtnl.ack(rtnl::add_addr(info.index, addr, prefix))
        .map_err(|e| io_err(format!("adding {addr}/{prefix} to '{ifname}'"), &e))?;
    rtnl.ack(rtnl::set_up(info.index, true))
        .map_err(|e| io_err(format!("bringing '{ifname}' up"), &e))?;
    find()
}

fn delete_by_name(rtnl: &Rtnl, ifname: &str) -> Result<()> {
    match rtnl.link(ifname) {
        Ok(Some(l)) => rtnl
            .ack(rtnl::del_link(l.index))
            .map_err(|e| io_err(format!("deleting '{ifname}'"), &e)),
        Ok(None) => Ok(()),
        Err(e) => Err(io_err(format!("listing interfaces for '{ifname}'"), &e)),
    }
}

impl NetnsDriver for LinuxNetns {
    fn kind(&self) -> &'static str {
        "linux"
    }

    fn subsystem(&self) -> &Arc<Subsystem> {
        &self.sub
    }

    fn add_netns(&self, name: &str) -> Result<NamespaceId> {
        if lock(&self.state).netns.contains_key(name) {
            return Err(err(ErrorKind::Busy, format!("a namespace named '{name}' exists")));
        }
        let path = named(name);
        let (file, created) = match nsfs::create(name) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => (
                File::open(&path).map_err(|e| io_err(format!("adopting {}", path.display()), &e))?,
                false,
            ),
            Err(e) => return Err(io_err(format!("creating network namespace '{name}'"), &e)),
        };
        let undo = |e: Error| {
            if created {
                let _ = nsfs::delete(name);
            }
            e
        };
        let nsid = NetnsId::of_file(&file).map_err(|e| undo(io_err("stat of the namespace", &e)))?;
        let rtnl = in_netns_file(&file, || -> io::Result<Rtnl> {
            let rtnl = Rtnl::open()?;
            if created {
                // Like a container runtime: loopback up, so a device can
                // reach its own address.
                if let Some(lo) = rtnl.link("lo")? {
                    rtnl.ack(rtnl::set_up(lo.index, true))?;
                }
            }
            Ok(rtnl)
        })
        .and_then(|r| r)
        .map_err(|e| undo(io_err(format!("entering namespace '{name}'"), &e)))?;
        let id = self.sub.create_namespace(name).map_err(undo)?;
        lock(&self.state).netns.insert(
            name.to_string(),
            NsRec {
                id,
                file: Arc::new(file),
                nsid,
                rtnl: Arc::new(rtnl),
            },
        );
        Ok(id)
    }

    fn del_netns(&self, name: &str) -> Result<()> {
        if name == INIT_NETNS {
            return Err(err(ErrorKind::PermissionDenied, "the initial namespace stays"));
        }
        let (id, inside) = {
            let st = lock(&self.state);
            let rec = st
                .netns
                .get(name)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no namespace '{name}'")))?;
            let inside: Vec<String> = st
                .links
                .iter()
                .filter(|(_, l)| l.ns == rec.id)
                .map(|(n, _)| n.clone())
                .collect();
            (rec.id, inside)
        };
        // Managed interfaces come home first (their devices follow); one
        // that cannot (its name is taken at home) loses its device.
        for ifname in inside {
            if self.link_set_netns(&ifname, INIT_NETNS).is_err() {
                let dev = lock(&self.state).links.remove(&ifname).and_then(|l| l.device);
                if let Some(dev) = dev {
                    let _ = self.sub.remove_device(&dev);
                }
            }
        }
        lock(&self.state).netns.remove(name);
        let unmounted = nsfs::delete(name);
        let r = self.sub.delete_namespace(id);
        match unmounted {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(format!("ip netns del {name}"), &e)),
            _ => r,
        }
    }

    fn netns(&self, name: &str) -> Option<NamespaceId> {
        lock(&self.state).netns.get(name).map(|n| n.id)
    }

    fn add_link(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        self.check_new_link(ifname, addr)?;
        // Adopt an existing interface of that name, wherever we can see it.
        let known: Vec<(NamespaceId, Arc<Rtnl>)> = {
            let st = lock(&self.state);
            let mut v: Vec<_> = st.netns.values().map(|n| (n.id, n.rtnl.clone())).collect();
            v.sort_by_key(|(id, _)| *id);
            v
        };
        for (ns, rtnl) in &known {
            if rtnl
                .link(ifname)
                .map_err(|e| io_err("listing interfaces", &e))?
                .is_some()
            {
                let info = configure(rtnl, ifname, addr, default_prefix(addr))?;
                self.record_link(ifname, addr, *ns, info.oper_up());
                return Ok(());
            }
        }
        let peer = format!("{ifname}_p");
        if peer.len() > IFNAME_MAX {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("'{ifname}' leaves no room for its veth peer's name '{peer}' (use add_veth)"),
            ));
        }
        let rtnl = self.rtnl_of(NamespaceId::INIT)?;
        rtnl.ack(rtnl::new_veth(ifname, &peer))
            .map_err(|e| io_err(format!("creating veth {ifname} <-> {peer}"), &e))?;
        let made = (|| {
            let p = rtnl
                .link(&peer)
                .map_err(|e| io_err("listing interfaces", &e))?
                .ok_or_else(|| err(ErrorKind::NotFound, format!("veth peer '{peer}' vanished")))?;
            rtnl.ack(rtnl::set_up(p.index, true))
                .map_err(|e| io_err(format!("bringing '{peer}' up"), &e))?;
            configure(&rtnl, ifname, addr, default_prefix(addr))
        })();
        match made {
            Ok(info) => {
                self.record_link(ifname, addr, NamespaceId::INIT, info.oper_up());
                Ok(())
            }
            Err(e) => {
                let _ = delete_by_name(&rtnl, ifname);
                Err(e)
            }
        }
    }

    fn link_set_netns(&self, ifname: &str, netns: &str) -> Result<()> {
        let (from_rtnl, to, to_file) = {
            let st = lock(&self.state);
            let to = st
                .netns
                .get(netns)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no namespace '{netns}'")))?;
            let l = st
                .links
                .get(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no managed interface '{ifname}'")))?;
            if l.ns == to.id {
                return Ok(());
            }
            let from = st
                .ns(l.ns)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("'{ifname}' is in an unknown namespace")))?;
            (from.rtnl.clone(), to.id, to.file.clone())
        };
        let info = from_rtnl
            .link(ifname)
            .map_err(|e| io_err("listing interfaces", &e))?
            .ok_or_else(|| err(ErrorKind::NotFound, format!("interface '{ifname}' is gone (run sync)")))?;
        use std::os::fd::AsRawFd;
        from_rtnl
            .ack(rtnl::set_netns(info.index, to_file.as_raw_fd()))
            .map_err(|e| io_err(format!("ip link set {ifname} netns {netns}"), &e))?;
        self.arrived(ifname, to)
    }

    fn link_netns(&self, ifname: &str) -> Option<NamespaceId> {
        lock(&self.state).links.get(ifname).map(|l| l.ns)
    }

    fn add_device(&self, name: &str, ifname: &str) -> Result<DeviceInfo> {
        let ns = {
            let st = lock(&self.state);
            let l = st
                .links
                .get(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no managed interface '{ifname}'")))?;
            if let Some(d) = &l.device {
                return Err(err(ErrorKind::Busy, format!("'{ifname}' already has device '{d}'")));
            }
            l.ns
        };
        let ns = device_namespace(&self.sub, ns);
        let info = self.sub.add_device(self.factory(name, ifname), ns)?;
        if let Some(l) = lock(&self.state).links.get_mut(ifname) {
            l.device = Some(name.to_string());
        }
        Ok(info)
    }

    fn del_device(&self, name: &str) -> Result<RemovalReport> {
        let report = self.sub.remove_device(name)?;
        for l in lock(&self.state).links.values_mut() {
            if l.device.as_deref() == Some(name) {
                l.device = None;
            }
        }
        Ok(report)
    }

    fn sync(&self) -> Result<usize> {
        let mut changes = 0;
        // 1. Namespaces whose name went away (or now names another one).
        let named_ns: Vec<(String, NetnsId)> = lock(&self.state)
            .netns
            .iter()
            .filter(|(n, _)| n.as_str() != INIT_NETNS)
            .map(|(n, r)| (n.clone(), r.nsid))
            .collect();
        for (name, nsid) in named_ns {
            if NetnsId::of_path(&named(&name)).ok() != Some(nsid) {
                changes += self.namespace_vanished(&name);
            }
        }
        // 2. Where every interface is now: moves and deletions first, then
        // (from a fresh look if anything moved, since moving an end of a
        // veth flaps its peer's carrier) the port states.
        let mut first_error = None;
        let mut seen = self.scan()?;
        let mut moved = false;
        let managed: Vec<(String, NamespaceId, Option<String>)> = lock(&self.state)
            .links
            .iter()
            .map(|(n, l)| (n.clone(), l.ns, l.device.clone()))
            .collect();
        for (ifname, ns, device) in managed {
            let places = seen.get(&ifname).map(Vec::as_slice).unwrap_or(&[]);
            if places.iter().any(|(id, _)| *id == ns) {
                continue;
            }
            changes += 1;
            match places.first() {
                Some((to, _)) => {
                    moved = true;
                    if let Err(e) = self.arrived(&ifname, *to) {
                        first_error.get_or_insert(e);
                    }
                }
                None => {
                    lock(&self.state).links.remove(&ifname);
                    if let Some(dev) = device {
                        let _ = self.sub.remove_device(&dev);
                    }
                }
            }
        }
        if moved {
            seen = self.scan()?;
        }
        let managed: Vec<(String, NamespaceId, bool, Option<String>)> = lock(&self.state)
            .links
            .iter()
            .map(|(n, l)| (n.clone(), l.ns, l.port_active, l.device.clone()))
            .collect();
        for (ifname, ns, was_up, device) in managed {
            let places = seen.get(&ifname).map(Vec::as_slice).unwrap_or(&[]);
            let Some((_, info)) = places.iter().find(|(id, _)| *id == ns) else {
                continue; // gone meanwhile: the next sync sees it
            };
            let up = info.oper_up();
            if up == was_up {
                continue;
            }
            changes += 1;
            if let Some(l) = lock(&self.state).links.get_mut(&ifname) {
                l.port_active = up;
            }
            if let Some(dev) = device.and_then(|d| self.sub.device(&d).ok()?.soft_device()) {
                dev.set_port_active(up);
            }
        }
        changes += self.sync_addrs(&seen)?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(changes),
        }
    }

    fn del_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let (ns, prefix) = self.managed(ifname)?;
        let rtnl = self.rtnl_of(ns)?;
        let info = rtnl
            .link(ifname)
            .map_err(|e| io_err("listing interfaces", &e))?
            .ok_or_else(|| err(ErrorKind::NotFound, format!("interface '{ifname}' is gone (run sync)")))?;
        // The prefix the driver gave its own address; the usual one else.
        let prefix = if addr == prefix.0 {
            prefix.1
        } else {
            default_prefix(addr)
        };
        rtnl.ack(rtnl::del_addr(info.index, addr, prefix))
            .map_err(|e| io_err(format!("ip addr del {addr}/{prefix} dev {ifname}"), &e))?;
        self.sync().map(drop)
    }

    fn add_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let (ns, _) = self.managed(ifname)?;
        // Another managed interface with the address loses it (a move).
        let others: Vec<String> = {
            let st = lock(&self.state);
            st.links
                .iter()
                .filter(|(n, _)| n.as_str() != ifname)
                .map(|(n, _)| n.clone())
                .collect()
        };
        for other in others {
            let Ok((ons, _)) = self.managed(&other) else { continue };
            let Ok(rtnl) = self.rtnl_of(ons) else { continue };
            let Ok(Some(info)) = rtnl.link(&other) else { continue };
            let has = rtnl.addrs().is_ok_and(|v| v.contains(&(info.index, addr)));
            if has {
                let _ = rtnl.ack(rtnl::del_addr(info.index, addr, default_prefix(addr)));
            }
        }
        let rtnl = self.rtnl_of(ns)?;
        let info = rtnl
            .link(ifname)
            .map_err(|e| io_err("listing interfaces", &e))?
            .ok_or_else(|| err(ErrorKind::NotFound, format!("interface '{ifname}' is gone (run sync)")))?;
        rtnl.ack(rtnl::add_addr(info.index, addr, default_prefix(addr)))
            .map_err(|e| io_err(format!("ip addr add {addr} dev {ifname}"), &e))?;
        self.sync().map(drop)
    }
}
