//! Soft devices: their identity and attributes, the process-wide list the
//! soft provider enumerates, and the embedded default pair.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::engine::DeviceShared;
use super::engine::EngineMode;
use super::link::inproc::InprocFabric;
use super::link::shm::{ShmLink, ShmMode};
use super::link::udp::{UdpConfig, UdpLink};
use super::link::Link;
use super::objects::{port_attr_in, SoftContext};
use super::proto::{Core, CoreConfig, Recovery};
use crate::verbs::backend::*;
use crate::verbs::{
    verr, AsyncElement, AsyncEvent, BackendKind, DeviceAttr, ErrorKind, EventType, Gid, Guid, PortAttr, Result, Verb,
};

/// The counters of a soft device ([`SoftDevice::counters`]) that count a
/// packet dropped or a peer refused: malformed packets, bad ICRCs,
/// unknown destination QPs, packets a QP's transport, state, P_Key, source
/// or Q_Key refuses, bad rkeys (unknown key, missing access, out of
/// bounds), bad trains, and on the shared-memory link bad slots and
/// exports, the channels refused, and the rendezvous' refusals (an
/// unproven GID, a doorbell of the wrong kind, a per-device limit, a
/// connection that never said hello). Present on every soft device; the
/// `shm_` ones on the shared-memory link only.
pub const DROP_COUNTERS: &[&str] = &[
    "rx_malformed",
    "rx_bad_icrc",
    "rx_unknown_qp",
    "rx_wrong_transport",
    "rx_bad_state",
    "rx_bad_pkey",
    "rx_bad_source",
    "rx_bad_qkey",
    "rx_bad_rkey",
    "rx_rkey_access",
    "rx_rkey_bounds",
    "rx_bad_train",
    "shm_rx_bad_len",
    "shm_rx_bad_index",
    "shm_rx_bad_addr",
    "shm_rx_bad_train",
    "shm_rx_bad_export",
    "shm_channels_refused",
    "shm_refused_gid",
    "shm_refused_doorbell",
    "shm_refused_limit",
    "shm_hello_timeouts",
    "shm_hellos_dropped",
];

/// Limits every soft device advertises (`ibv_query_device`).
pub mod limits {
    /// Queue pairs per device.
    pub const MAX_QP: u32 = 1 << 17;
    /// Work requests per queue.
    pub const MAX_QP_WR: u32 = 1 << 15;
    /// Scatter/gather entries per WR.
    pub const MAX_SGE: u32 = 32;
    /// Completion queues per device.
    pub const MAX_CQ: u32 = 1 << 17;
    /// Entries per CQ.
    pub const MAX_CQE: u32 = (1 << 22) - 1;
    /// Memory regions per device (the 24-bit key index space, less index 0).
    pub const MAX_MR: u32 = (1 << 24) - 1;
    /// Protection domains per device.
    pub const MAX_PD: u32 = 1 << 17;
    /// Outstanding RDMA reads/atomics per QP, as initiator and as target.
    pub const MAX_QP_RD_ATOM: u32 = 128;
    /// Memory windows per device.
    pub const MAX_MW: u32 = 1 << 16;
    /// Address handles per device.
    pub const MAX_AH: u32 = 1 << 20;
    /// SRQs per device.
    pub const MAX_SRQ: u32 = 1 << 16;
    /// Work requests per SRQ.
    pub const MAX_SRQ_WR: u32 = 1 << 15;
    /// Largest inline payload.
    pub const MAX_INLINE_DATA: u32 = 512;
    /// Largest fast-registration page list.
    pub const MAX_FAST_REG_PAGES: u32 = 512;
    /// Largest message.
    pub const MAX_MSG_SZ: u32 = 1 << 31;
    /// GID table length.
    pub const GID_TBL_LEN: u32 = 16;
    /// P_Key table length (only the default P_Key 0xffff).
    pub const PKEY_TBL_LEN: u16 = 1;
}

/// How to create a soft device.
#[derive(Debug, Clone)]
pub struct SoftDeviceConfig {
    /// Device name (`softverbs_0`).
    pub name: String,
    /// The addresses the device owns; its GID table is built from them.
    pub addrs: Vec<IpAddr>,
    /// Seed for every random choice the device makes (key bytes, PSNs), so
    /// a simulated run replays bit for bit.
    pub seed: u64,
    /// The link its packets travel on (`None`: the process-wide in-process
    /// fabric).
    pub link: Option<Arc<dyn Link>>,
    /// How the engine makes progress (inline by default; see
    /// [`crate::soft::engine`] for when to use a progress thread).
    pub engine: EngineMode,
    /// The loss recovery the device offers its peers (selective repeat
    /// by default; see [`Recovery`]).
    pub recovery: Recovery,
}

impl SoftDeviceConfig {
    /// A device named `name` owning `addr`, on the process-wide in-process
    /// fabric, with a seed derived from the name.
    pub fn new(name: &str, addr: IpAddr) -> SoftDeviceConfig {
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        SoftDeviceConfig {
            name: name.to_string(),
            addrs: vec![addr],
            seed,
            link: None,
            engine: EngineMode::Inline,
            recovery: Recovery::default(),
        }
    }

    /// A device on its own UDP link (see [`crate::soft::link::udp`]): binds
    /// the sockets `udp` describes now, and takes the device's addresses
    /// (and so its GIDs) from them.
    ///
    /// # Errors
    ///
    /// `EADDRINUSE`-class failures to bind (as `Busy`), an address or
    /// interface this host does not have (`InvalidArgument`), other socket
    /// errors as `Io`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use softverbs::soft::engine::EngineMode;
    /// use softverbs::soft::link::udp::UdpConfig;
    /// use softverbs::soft::{SoftDevice, SoftDeviceConfig};
    ///
    /// let udp = UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
    /// let mut cfg = SoftDeviceConfig::udp("udp0", udp)?;
    /// cfg.engine = EngineMode::progress_thread();
    /// let dev = SoftDevice::create(cfg)?;
    /// let ctx = dev.open()?;
    /// println!("GID {}", ctx.query_gid(1, 0)?);
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn udp(name: &str, udp: UdpConfig) -> Result<SoftDeviceConfig> {
        let link = bind_udp(&udp)?;
        let addrs = link.gids().iter().map(|g| g.to_ip()).collect();
        Ok(SoftDeviceConfig {
            addrs,
            link: Some(link as Arc<dyn Link>),
            ..SoftDeviceConfig::new(name, IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        })
    }

    /// A device on a UDP link with shared-memory channels to the devices
    /// of other processes on this host (see [`crate::soft::link::shm`]):
    /// [`ShmMode::Auto`] falls back to UDP for everyone else,
    /// [`ShmMode::Only`] never sends by UDP.
    ///
    /// # Errors
    ///
    /// Those of [`SoftDeviceConfig::udp`]; `Busy` if a device with the same
    /// GID already listens for channels.
    pub fn udp_shm(name: &str, udp: UdpConfig, mode: ShmMode) -> Result<SoftDeviceConfig> {
        let udp = bind_udp(&udp)?;
        let addrs = udp.gids().iter().map(|g| g.to_ip()).collect();
        let shm = ShmLink::new(udp, mode).map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::AddrInUse => ErrorKind::Busy,
                _ => ErrorKind::Io,
            };
            crate::verbs::Error::new(Verb::OpenDevice, kind, format!("shared-memory link: {e}"))
        })?;
        Ok(SoftDeviceConfig {
            addrs,
            link: Some(shm as Arc<dyn Link>),
            ..SoftDeviceConfig::new(name, IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        })
    }
}

fn bind_udp(udp: &UdpConfig) -> Result<Arc<UdpLink>> {
    UdpLink::bind(udp).map_err(|e| {
        let kind = match e.kind() {
            std::io::ErrorKind::AddrInUse => ErrorKind::Busy,
            std::io::ErrorKind::AddrNotAvailable | std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput => {
                ErrorKind::InvalidArgument
            }
            _ => ErrorKind::Io,
        };
        crate::verbs::Error::new(Verb::OpenDevice, kind, format!("UDP link {:?}: {e}", udp.bind))
    })
}

/// A soft RoCEv2 device.
#[derive(Debug)]
pub struct SoftDevice {
    name: String,
    guid: Guid,
    gids: Vec<Gid>,
    seed: u64,
    shared: Arc<DeviceShared>,
    /// Whether port 1 is up (shared with every open context, which reports
    /// it from `query_port`).
    port_active: Arc<AtomicBool>,
}

impl SoftDevice {
    /// Creates a device and adds it to the soft provider's device list.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an empty name or no address; `EBUSY` if a soft device
    /// of that name exists.
    pub fn create(config: SoftDeviceConfig) -> Result<Arc<SoftDevice>> {
        if config.name.is_empty() || config.addrs.is_empty() {
            return Err(verr!(
                OpenDevice,
                InvalidArgument,
                "a soft device needs a name and an address"
            ));
        }
        let mut list = registry().lock().expect("soft device list poisoned");
        if list.iter().any(|d| d.name == config.name) {
            return Err(verr!(
                OpenDevice,
                Busy,
                "a soft device named '{}' already exists",
                config.name
            ));
        }
        let gids: Vec<Gid> = config.addrs.iter().map(|a| Gid::from_ip(*a)).collect();
        // A stable GUID derived from the first address: 0x02 (locally
        // administered) + "sv" + the address's low bytes.
        let low = gids[0].interface_id() & 0xffff_ffff;
        let guid = Guid(0x0253_7600_0000_0000 | low);
        let mut attr = Self::default_attr(guid);
        attr.node_guid = guid;
        let port = Self::default_port_attr();
        let mut core_cfg = CoreConfig::new(attr, port, gids.clone(), config.seed);
        core_cfg.max_inflight_packets = 1024;
        core_cfg.recovery = config.recovery;
        let link = config.link.unwrap_or_else(|| InprocFabric::global() as Arc<dyn Link>);
        if !link.poll_fds().is_empty() {
            // A network link: what a QP has in flight must fit the peer's
            // socket receive buffer (4 MiB asked, 8 MiB of truesize granted
            // to root), or bursts are dropped there and go-back-N storms.
            core_cfg.max_inflight_packets = 512;
        }
        core_cfg.check_icrc = link.needs_icrc();
        core_cfg.emit_icrc = link.needs_icrc();
        let shared = DeviceShared::new(config.name.clone(), config.addrs.clone(), Core::new(core_cfg), link);
        shared
            .start(config.engine)
            .map_err(|e| verr!(OpenDevice, Io, "starting the progress thread: {e}"))?;
        let dev = Arc::new(SoftDevice {
            name: config.name,
            guid,
            gids,
            seed: config.seed,
            shared,
            port_active: Arc::new(AtomicBool::new(true)),
        });
        list.push(dev.clone());
        Ok(dev)
    }

    /// Removes the device from the soft provider's device list and detaches
    /// it from its link (without revoking its objects: see
    /// [`SoftDevice::unplug`]).
    pub fn remove(&self) {
        self.shared.detach();
        registry()
            .lock()
            .expect("soft device list poisoned")
            .retain(|d| d.name != self.name);
    }

    /// Hot-unplug without a subsystem in between: revoke (control verbs
    /// `ENODEV`, QPs to ERR, every WR flushed once), leave the device list,
    /// then DEVICE_FATAL. The subsystem layer runs the same steps with its
    /// clients' upcalls between revoke and DEVICE_FATAL.
    pub fn unplug(&self) {
        self.shared.revoke();
        self.remove();
        self.shared.raise_device_fatal();
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device as a device-list entry.
    pub fn device(self: &Arc<Self>) -> crate::verbs::Device {
        crate::verbs::Device::from_ops(self.clone())
    }

    /// Opens the device (`ibv_open_device`).
    ///
    /// # Errors
    ///
    /// `EIO` if an event descriptor cannot be created.
    pub fn open(self: &Arc<Self>) -> Result<crate::verbs::Context> {
        self.device().open()
    }

    /// The device's engine (for drivers, counters and tests).
    pub fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }

    /// The soft device behind a verbs device handle, or `None` for a
    /// device of another backend.
    ///
    /// ```
    /// # softverbs::soft::embedded_default().unwrap();
    /// let devices = softverbs::verbs::devices(Some(softverbs::verbs::BackendKind::Soft)).unwrap();
    /// let soft = softverbs::soft::SoftDevice::of(&devices[0]).unwrap();
    /// assert_eq!(soft.name(), devices[0].name());
    /// ```
    pub fn of(dev: &crate::verbs::Device) -> Option<&SoftDevice> {
        downcast::<SoftDevice, _>(dev.ops())
    }

    /// Every counter of the device, by name, as `softverbs devinfo -v`
    /// prints them: the engine's packet counters
    /// ([`Counters`](super::proto::Counters), with what the link dropped
    /// before the engine saw it added in), then the link's own (`udp_…`,
    /// `shm_…`). A snapshot; each counter only grows while the device
    /// lives. [`DROP_COUNTERS`] names those that count drops and
    /// refusals.
    ///
    /// ```
    /// # softverbs::soft::embedded_default().unwrap();
    /// let devices = softverbs::verbs::devices(Some(softverbs::verbs::BackendKind::Soft)).unwrap();
    /// let soft = softverbs::soft::SoftDevice::of(&devices[0]).unwrap();
    /// let counters = soft.counters();
    /// assert!(counters.iter().any(|&(name, _)| name == "rx_bad_icrc"));
    /// ```
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.shared.counters().iter().chain(self.shared.link_stats()).collect()
    }

    /// The counters of [`SoftDevice::counters`] that count a packet
    /// dropped or a peer refused ([`DROP_COUNTERS`]), in that order: what
    /// the operator of a server watches for hostile or broken peers.
    pub fn drop_counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self
            .counters()
            .into_iter()
            .filter(|(n, _)| DROP_COUNTERS.contains(n))
            .collect();
        v.sort_by_key(|(n, _)| DROP_COUNTERS.iter().position(|d| d == n));
        v
    }

    /// The device's GIDs (index order).
    pub fn gids(&self) -> &[Gid] {
        &self.gids
    }

    /// The configured seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Device attributes.
    pub fn attr(&self) -> DeviceAttr {
        Self::default_attr(self.guid)
    }

    /// The attributes every soft device advertises, with `guid`.
    pub fn default_attr(guid: Guid) -> DeviceAttr {
        use crate::verbs::{AtomicCap, DeviceCapFlags as F};
        use limits::*;
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: 1 << 40,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x53_5646, // "SVF"
            vendor_part_id: 1,
            hw_ver: 0,
            max_qp: MAX_QP,
            max_qp_wr: MAX_QP_WR,
            device_cap_flags: F::RESIZE_MAX_WR
                | F::BAD_PKEY_CNTR
                | F::BAD_QKEY_CNTR
                | F::CURR_QP_STATE_MOD
                | F::PORT_ACTIVE_EVENT
                | F::SYS_IMAGE_GUID
                | F::RC_RNR_NAK_GEN
                | F::SRQ_RESIZE
                | F::N_NOTIFY_CQ
                | F::MEM_WINDOW
                | F::MEM_MGT_EXTENSIONS
                | F::MEM_WINDOW_TYPE_2B,
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_qp_rd_atom: MAX_QP_RD_ATOM,
            max_res_rd_atom: MAX_QP_RD_ATOM * 1024,
            max_qp_init_rd_atom: MAX_QP_RD_ATOM,
            atomic_cap: Some(AtomicCap::Hca),
            max_mw: MAX_MW,
            max_ah: MAX_AH,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SGE,
            max_pkeys: PKEY_TBL_LEN,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            max_fast_reg_page_list_len: MAX_FAST_REG_PAGES,
            max_inline_data: MAX_INLINE_DATA,
        }
    }

    /// Attributes of port 1, the only port (its state as last set by
    /// [`SoftDevice::set_port_active`]).
    pub fn port_attr(&self) -> PortAttr {
        port_attr_in(Self::default_port_attr(), self.port_active())
    }

    /// Whether port 1 is active.
    pub fn port_active(&self) -> bool {
        self.port_active.load(Ordering::Acquire)
    }

    /// Sets the state of port 1, as a NIC's port follows its link (what a
    /// namespace driver calls when the network interface the device is
    /// bound to goes down or up): `query_port` of every open context then
    /// reports `PORT_ACTIVE` (physical state LinkUp) or `PORT_DOWN`
    /// (Disabled), and every context gets the async event `PORT_ACTIVE` or
    /// `PORT_ERR` for port 1. Returns whether the state changed; setting
    /// the state it has does nothing (no event). Traffic is not stopped
    /// here: on a network link, the interface being down already stops it.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::soft::{SoftDevice, SoftDeviceConfig};
    /// use softverbs::verbs::{EventType, PortState};
    ///
    /// let dev = SoftDevice::create(SoftDeviceConfig::new("doc_port0", "127.83.202.1".parse().unwrap()))?;
    /// let ctx = dev.open()?;
    /// assert!(dev.set_port_active(false));
    /// assert_eq!(ctx.query_port(1)?.state, PortState::Down);
    /// let ev = ctx.get_async_event(Some(std::time::Duration::from_secs(5)))?.unwrap();
    /// assert_eq!(ev.event_type, EventType::PortErr);
    /// assert!(!dev.set_port_active(false)); // no change, no event
    /// dev.set_port_active(true);
    /// assert_eq!(ctx.query_port(1)?.state, PortState::Active);
    /// drop(ctx);
    /// dev.unplug();
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn set_port_active(&self, active: bool) -> bool {
        if self.port_active.swap(active, Ordering::AcqRel) == active {
            return false;
        }
        let event = AsyncEvent {
            event_type: if active {
                EventType::PortActive
            } else {
                EventType::PortErr
            },
            element: AsyncElement::Port(1),
        };
        // Through the engine's event queue, so the event is ordered with
        // the device's other async events (and none follows DEVICE_FATAL).
        self.shared.with_core(|c, _| c.push_async(None, event));
        true
    }

    /// The port attributes every soft device advertises.
    pub fn default_port_attr() -> PortAttr {
        use crate::verbs::{LinkLayer, Mtu, PortState};
        PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_tbl_len: limits::GID_TBL_LEN,
            port_cap_flags: 0,
            max_msg_sz: limits::MAX_MSG_SZ,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: limits::PKEY_TBL_LEN,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            active_width: 2,  // 4X
            active_speed: 32, // EDR-equivalent figure; the soft link has no line rate
            phys_state: 5,    // LinkUp
            link_layer: LinkLayer::Ethernet,
        }
    }
}

fn registry() -> &'static Mutex<Vec<Arc<SoftDevice>>> {
    static LIST: OnceLock<Mutex<Vec<Arc<SoftDevice>>>> = OnceLock::new();
    LIST.get_or_init(|| Mutex::new(Vec::new()))
}

/// The soft provider (lists the soft devices of this process).
pub fn provider() -> Arc<dyn Provider> {
    static P: OnceLock<Arc<SoftProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(SoftProvider)).clone()
}

struct SoftProvider;

impl Provider for SoftProvider {
    fn kind(&self) -> BackendKind {
        BackendKind::Soft
    }

    fn devices(&self) -> Result<Vec<Arc<dyn DeviceOps>>> {
        Ok(registry()
            .lock()
            .expect("soft device list poisoned")
            .iter()
            .map(|d| d.clone() as Arc<dyn DeviceOps>)
            .collect())
    }
}

impl DeviceOps for SoftDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_guid(&self) -> Guid {
        self.guid
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }

    fn open(&self) -> Result<Arc<dyn ContextOps>> {
        let ctx = SoftContext::open(
            self.shared.clone(),
            self.attr(),
            Self::default_port_attr(),
            self.port_active.clone(),
            self.gids.clone(),
        )?;
        Ok(ctx)
    }
}

/// Address of the `n`th device of the embedded in-process pair.
pub fn embedded_addr(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 83, 86, n + 1))
}

/// Names of the embedded default devices.
pub const EMBEDDED_NAMES: [&str; 2] = ["softverbs_0", "softverbs_1"];

/// The embedded default: two soft devices in this process joined by the
/// in-process link (`softverbs_0` at 127.83.86.1, `softverbs_1` at
/// 127.83.86.2). Created on first call; later calls return the same pair.
///
/// # Errors
///
/// `EBUSY` if devices of those names were created some other way.
pub fn embedded_default() -> Result<Vec<Arc<SoftDevice>>> {
    static PAIR: Mutex<Option<Vec<Arc<SoftDevice>>>> = Mutex::new(None);
    let mut pair = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = &*pair {
        return Ok(p.clone());
    }
    let mut created = Vec::new();
    for (i, name) in EMBEDDED_NAMES.iter().enumerate() {
        created.push(SoftDevice::create(SoftDeviceConfig {
            seed: 0x5eed_0000 + i as u64,
            ..SoftDeviceConfig::new(name, embedded_addr(i as u8))
        })?);
    }
    *pair = Some(created.clone());
    Ok(created)
}
