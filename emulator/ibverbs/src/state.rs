//! Process-wide state: the devices this library shows, created on first
//! use from the `SOFTVERBS_*` environment, and the hotplug control entry.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::shm::ShmMode;
use softverbs::soft::link::udp::{UdpConfig, UdpPort};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::Device;

use crate::ffi::*;

/// One device of the list: the C `struct ibv_device` first, so that the
/// pointer handed to the application is also a pointer to this.
#[repr(C)]
pub(crate) struct SvDevice {
    pub(crate) dev: ibv_device,
    pub(crate) device: Device,
    pub(crate) soft: Arc<SoftDevice>,
    pub(crate) guid: u64,
    /// Tells the library's progress thread (if any) to stop.
    stop: Arc<AtomicBool>,
    /// The largest IB MTU (`enum ibv_mtu`) whose RoCEv2 packets fit the
    /// network interface of the device's address, if known.
    pub(crate) mtu_cap: Option<u32>,
}

/// RoCEv2 headers around an MTU-sized payload: IPv6 40 (IPv4 20), UDP 8,
/// BTH 12, RETH 16, ICRC 4.
const ROCE_HEADERS: u32 = 80;

/// The MTU of the interface that has address `ip` (its sysfs entry, as the
/// network namespace of this process sees it).
fn interface_mtu(ip: IpAddr) -> Option<u32> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list freed below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut name = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of the family it names.
            let addr = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr))))
                    }
                    libc::AF_INET6 => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        Some(IpAddr::V6(std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr)))
                    }
                    _ => None,
                }
            };
            if addr == Some(ip) {
                // SAFETY: ifa_name is a NUL-terminated string of the list.
                name = Some(unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, no longer used.
    unsafe { libc::freeifaddrs(ifap) };
    let name = name?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The largest `enum ibv_mtu` (1 = 256 … 5 = 4096) whose packets fit an
/// interface MTU of `if_mtu` bytes.
fn ib_mtu_for(if_mtu: u32) -> Option<u32> {
    (1..=5u32).rev().find(|m| (128u32 << m) + ROCE_HEADERS <= if_mtu)
}

/// Counts `ibv_poll_cq` calls (any CQ): the progress thread leaves the
/// link to an application that is busy-polling.
pub(crate) static POLLS: AtomicU64 = AtomicU64::new(0);

/// Records an `ibv_poll_cq` call. A plain load and store, not a locked
/// add: the progress thread only asks whether the count moved, and a
/// count lost between two polling threads changes nothing, while a locked
/// add on every empty poll of a busy-polling loop costs ~20 cycles.
#[inline]
pub(crate) fn note_poll() {
    let n = POLLS.load(Ordering::Relaxed);
    POLLS.store(n.wrapping_add(1), Ordering::Relaxed);
}

/// Set by a progress thread while the application has lately left
/// datagrams unread although it ran (it polls a CQ until a completion,
/// then spins on memory): an application thread that gets a completion
/// then announces the progress threads as sleeping again
/// ([`crate::progress::rearm`]).
pub(crate) static REARM: AtomicBool = AtomicBool::new(false);

/// Records that an `ibv_poll_cq` call returned completions (one relaxed
/// load when no progress thread asks for more).
#[inline]
pub(crate) fn note_completions() {
    if REARM.load(Ordering::Relaxed) {
        crate::progress::rearm();
    }
}

/// How the engine of the default device makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// The library's progress thread over the inline engine (default),
    /// reading on for this long after serving traffic while the
    /// application's threads do not run.
    Library(Duration),
    /// The soft provider's own progress thread.
    Provider(Duration),
    /// No thread: progress only inside verbs.
    Inline,
}

/// Every device ever created here (never freed: the application may keep
/// `struct ibv_device` pointers after `ibv_free_device_list`, and a
/// removed device must stay readable), and whether each is still present.
struct Registry {
    devices: Vec<(&'static SvDevice, bool)>,
    /// Why creating the default device failed, reported once.
    error: Option<String>,
}

fn registry() -> &'static Mutex<Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut reg = Registry {
            devices: Vec::new(),
            error: None,
        };
        match create_default() {
            Ok(d) => reg.devices.push((d, true)),
            Err(e) => {
                eprintln!("softverbs-ibverbs: no soft device: {e}");
                reg.error = Some(e);
            }
        }
        Mutex::new(reg)
    })
}

/// The devices present now.
pub(crate) fn present_devices() -> Vec<&'static SvDevice> {
    let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    reg.devices.iter().filter(|(_, p)| *p).map(|(d, _)| *d).collect()
}

/// Whether `dev` is one of ours (present or removed).
pub(crate) fn is_known(dev: *const ibv_device) -> Option<&'static SvDevice> {
    let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    reg.devices
        .iter()
        .find(|(d, _)| std::ptr::eq(&d.dev, dev))
        .map(|(d, _)| *d)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The progress mode the environment asks for.
fn progress_mode() -> Result<Progress, String> {
    let spin_us: Option<u64> = match env("SOFTVERBS_SPIN_US") {
        Some(s) => Some(s.parse().map_err(|_| format!("SOFTVERBS_SPIN_US={s}: not a number"))?),
        None => None,
    };
    match env("SOFTVERBS_ENGINE").as_deref() {
        None | Some("thread") => Ok(Progress::Library(Duration::from_micros(
            spin_us.unwrap_or(crate::progress::LINGER_US),
        ))),
        Some("provider-thread") => Ok(Progress::Provider(Duration::from_micros(spin_us.unwrap_or(0)))),
        Some("inline") => Ok(Progress::Inline),
        Some(o) => Err(format!(
            "SOFTVERBS_ENGINE={o}: expected thread, provider-thread or inline"
        )),
    }
}

/// Which UDP port the device binds.
enum PortChoice {
    /// 4791 if free, else a private port.
    Auto,
    /// A free port of the private range.
    Private,
    /// This port.
    Fixed(u16),
}

/// The configuration of the default device, from the environment.
fn device_config() -> Result<(SoftDeviceConfig, Progress), String> {
    let name = env("SOFTVERBS_DEVICE").unwrap_or_else(|| "softverbs_0".to_string());
    if name.len() >= IBV_SYSFS_NAME_MAX {
        return Err(format!("SOFTVERBS_DEVICE={name}: longer than 63 bytes"));
    }
    let udp = match (env("SOFTVERBS_IFACE"), env("SOFTVERBS_ADDR")) {
        (Some(i), _) => UdpConfig::interface(&i),
        (None, Some(a)) => {
            let ip: IpAddr = a
                .parse()
                .map_err(|_| format!("SOFTVERBS_ADDR={a}: not an IP address"))?;
            UdpConfig::new(ip)
        }
        (None, None) => UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    };
    let loopback = match &udp.bind {
        softverbs::soft::link::udp::Bind::Addr(ip) => ip.is_loopback(),
        softverbs::soft::link::udp::Bind::Interface(i) => i == "lo",
    };
    let port = match env("SOFTVERBS_PORT").as_deref() {
        Some("auto") => PortChoice::Auto,
        Some("private") => PortChoice::Private,
        // On loopback every peer is a soft device of this host, so no
        // interoperability needs port 4791, and every process gets a
        // private-port GID: tools that compare the two sides' GID types
        // (perftest refuses an IPv4-mapped GID against an IPv6 one) then
        // agree whichever process started first.
        None if loopback => PortChoice::Private,
        None => PortChoice::Auto,
        Some(p) => PortChoice::Fixed(
            p.parse()
                .map_err(|_| format!("SOFTVERBS_PORT={p}: expected auto, private or a port number"))?,
        ),
    };
    let link = env("SOFTVERBS_LINK");
    let make = |udp: UdpConfig| match link.as_deref() {
        None | Some("auto") => Ok(SoftDeviceConfig::udp_shm(&name, udp, ShmMode::Auto)),
        Some("udp") => Ok(SoftDeviceConfig::udp(&name, udp)),
        Some("shm") => Ok(SoftDeviceConfig::udp_shm(&name, udp, ShmMode::Only)),
        Some(o) => Err(format!("SOFTVERBS_LINK={o}: expected auto, udp or shm")),
    };
    let cfg = match port {
        PortChoice::Auto => make(UdpConfig {
            port: UdpPort::Auto,
            ..udp
        })?,
        PortChoice::Fixed(p) => make(UdpConfig {
            port: UdpPort::Fixed(p),
            ..udp
        })?,
        PortChoice::Private => {
            // A port of the private range (0x8000-0xBFFF, which the link
            // maps to a private GID); one another process holds is
            // skipped.
            let seed = std::process::id() as usize;
            let mut result = None;
            for attempt in 0..64usize {
                let p = 0x8000 + ((seed.wrapping_mul(7919) + attempt.wrapping_mul(104_729)) % 0x4000) as u16;
                match make(UdpConfig {
                    port: UdpPort::Fixed(p),
                    ..udp.clone()
                })? {
                    Err(e) if e.kind() == softverbs::verbs::ErrorKind::Busy => result = Some(Err(e)),
                    other => {
                        result = Some(other);
                        break;
                    }
                }
            }
            result.expect("at least one attempt")
        }
    };
    let mut cfg = cfg.map_err(|e| e.to_string())?;
    let progress = progress_mode()?;
    cfg.engine = match progress {
        Progress::Provider(spin) => EngineMode::ProgressThread { spin },
        Progress::Library(_) | Progress::Inline => EngineMode::Inline,
    };
    Ok((cfg, progress))
}

fn copy_name(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

fn create_default() -> Result<&'static SvDevice, String> {
    let (cfg, progress) = device_config()?;
    let link = cfg.link.clone();
    let soft = SoftDevice::create(cfg).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    if let (Progress::Library(linger), Some(link)) = (progress, link) {
        soft.shared().set_driven_externally();
        let (s, st) = (soft.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("softverbs-{}", soft.name()))
            .spawn(move || crate::progress::run(s, link, st, linger))
            .map_err(|e| format!("starting the progress thread: {e}"))?;
    }
    let device = soft.device();
    // SAFETY: ibv_device is plain data (integers, arrays, nullable
    // function pointers), for which all-zero is a valid value.
    let mut dev: ibv_device = unsafe { std::mem::zeroed() };
    dev.node_type = IBV_NODE_CA;
    dev.transport_type = IBV_TRANSPORT_IB;
    copy_name(&mut dev.name, soft.name());
    copy_name(&mut dev.dev_name, &format!("uverbs_{}", soft.name()));
    copy_name(
        &mut dev.dev_path,
        &format!("/nonexistent/softverbs/uverbs_{}", soft.name()),
    );
    copy_name(&mut dev.ibdev_path, &format!("/nonexistent/softverbs/{}", soft.name()));
    let guid = device.guid().0;
    // As rxe does, the active MTU follows the interface: 4096-byte packets
    // do not fit a 1500-byte Ethernet link (the link sends with DF set).
    let mtu_cap = soft
        .gids()
        .iter()
        .filter_map(|g| interface_mtu(g.to_ip()))
        .min()
        .map(|m| ib_mtu_for(m).unwrap_or(1));
    let d: &'static SvDevice = Box::leak(Box::new(SvDevice {
        dev,
        device,
        soft,
        guid,
        stop,
        mtu_cap,
    }));
    if let Some(ms) = env("SOFTVERBS_UNPLUG_AFTER_MS") {
        // Hot-unplug from outside an unmodified program (tests, and
        // trying out a program's handling of device removal).
        let ms: u64 = ms
            .parse()
            .map_err(|_| format!("SOFTVERBS_UNPLUG_AFTER_MS={ms}: not a number"))?;
        std::thread::Builder::new()
            .name("softverbs-unplug".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                remove(d);
            })
            .map_err(|e| format!("starting the unplug timer: {e}"))?;
    }
    Ok(d)
}

impl SvDevice {
    /// Whether the device was removed (hot-unplugged).
    pub(crate) fn removed(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Marks `d` absent and unplugs it; false if it was already removed.
fn remove(d: &'static SvDevice) -> bool {
    {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        match reg.devices.iter_mut().find(|(x, p)| *p && std::ptr::eq(*x, d)) {
            Some(e) => e.1 = false,
            None => return false,
        }
    }
    // The unplug queues IBV_EVENT_DEVICE_FATAL on every open context
    // before the flag says the device is gone: `ibv_get_async_event`
    // answers EIO once it sees the flag and no event left, so with the
    // flag first a reader waking between the two lost the event (seen as
    // an `ibv_asyncwatch` that exited without printing it).
    d.soft.unplug();
    d.stop.store(true, Ordering::Release);
    crate::rdmacm::device_removed(d.soft.name());
    true
}

/// Removes the device named `name` as if it had been unplugged: it leaves
/// the device list, every open context receives `IBV_EVENT_DEVICE_FATAL`,
/// later verbs on its objects fail with `ENODEV` (queue pairs are moved to
/// the error state and their work requests flushed), and
/// `ibv_close_device` and the destroy verbs still succeed. Returns 0, or
/// -1 with `errno` `ENOENT` (no such device present) or `EINVAL` (`name`
/// is NULL).
///
/// # Safety
///
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn softverbs_remove_device(name: *const c_char) -> c_int {
    if name.is_null() {
        crate::objects::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let found = {
        let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.devices
            .iter()
            .find(|(d, p)| *p && d.soft.name() == name)
            .map(|(d, _)| *d)
    };
    match found {
        Some(d) if remove(d) => 0,
        _ => {
            crate::objects::set_errno(libc::ENOENT);
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_mtu_follows_the_interface() {
        assert_eq!(ib_mtu_for(1500), Some(3), "1024 on Ethernet");
        assert_eq!(ib_mtu_for(9000), Some(5), "4096 with jumbo frames");
        assert_eq!(ib_mtu_for(65536), Some(5), "loopback");
        assert_eq!(ib_mtu_for(4096 + 79), Some(4));
        assert_eq!(ib_mtu_for(300), None);
        // The loopback interface exists everywhere and has a large MTU.
        assert!(interface_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)).is_some_and(|m| m >= 1500));
    }
}
