//! Connecting queue pairs: what each side tells the other ([`Endpoint`],
//! with a stable byte encoding and a text form), and one call that takes
//! a QP from RESET (or INIT) to RTS ([`Connect`], [`Qp::connect`]).
//!
//! The exchange itself is the application's (a TCP connection, a file, a
//! job scheduler's key-value store); [`super::exchange`] has a small TCP
//! one.
//!
//! # Examples
//!
//! Two QPs on two soft devices of this process, connected both ways:
//!
//! ```
//! use softverbs::verbs::{self, AccessFlags, Connect, Endpoint, QpInitAttr, QpType};
//! let devs = softverbs::soft::embedded_default()?;
//! let (a, b) = (devs[0].open()?, devs[1].open()?);
//! let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (ca, cb) = (a.cq_builder(16).create()?, b.cq_builder(16).create()?);
//! let qa = pa.create_qp(&QpInitAttr::new(QpType::Rc, &ca, &ca))?;
//! let qb = pb.create_qp(&QpInitAttr::new(QpType::Rc, &cb, &cb))?;
//! let mr = pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//!
//! let ea = Endpoint::local(&a, &qa, 1, 0)?;
//! let eb = Endpoint::local(&b, &qb, 1, 0)?.with_buffer(&mr);
//! // (here the two would travel: `eb.encode()`, `Endpoint::decode`)
//! qa.connect(&a, &ea, &eb)?;
//! // B's QP grants exactly what its MR allows.
//! Connect::new().mr(&mr).apply(&b, &qb, &eb, Some(&ea))?;
//! assert_eq!(qa.query()?.qp_state, verbs::QpState::Rts);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use super::attr::{AhAttr, QpModify};
use super::error::{verr, Result};
use super::handle::{Context, Mr, Qp};
use super::types::*;
use super::wr::RemoteAddr;

/// A registered buffer a peer may access: where it starts, its rkey and
/// its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuffer {
    /// Start address (what goes into a work request's `remote_addr`).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteBuffer {
    /// The whole of `mr`.
    pub fn of(mr: &Mr) -> RemoteBuffer {
        RemoteBuffer {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.length(),
        }
    }

    /// The target of a work request at `offset` into the buffer. The
    /// responder checks the range; this does not.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

/// What one side of a connection tells the other (the content of
/// `ibv_rc_pingpong`'s and perftest's address messages).
///
/// Build the local one with [`Endpoint::local`], send it with
/// [`Endpoint::encode`] (or its text form, `Display`), read the peer's
/// with [`Endpoint::decode`] (or `FromStr`), and connect with
/// [`Qp::connect`] or [`Connect`].
///
/// # Byte encoding
///
/// [`Endpoint::ENCODED_LEN`] (60) bytes, integers big-endian. The layout
/// is stable: a change would take a new version byte.
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0 | 4 | magic `SVEP` |
/// | 4 | 1 | version, 1 |
/// | 5 | 1 | flags: bit 0 = `buffer` present; other bits 0 |
/// | 6 | 1 | `port` |
/// | 7 | 1 | `mtu` (`enum ibv_mtu`: 1 = 256 … 5 = 4096) |
/// | 8 | 4 | `qpn` (< 2^24) |
/// | 12 | 4 | `psn` (< 2^24) |
/// | 16 | 2 | `lid` |
/// | 18 | 1 | `gid_index` |
/// | 19 | 1 | reserved, 0 |
/// | 20 | 4 | `qkey` |
/// | 24 | 16 | `gid` |
/// | 40 | 8 | buffer address (0 without a buffer) |
/// | 48 | 4 | buffer rkey (0 without a buffer) |
/// | 52 | 8 | buffer length (0 without a buffer) |
///
/// # Text form
///
/// One line of `key=value` pairs, in this order (the buffer's three only
/// with a buffer), numbers in decimal or `0x` hex, the GID as an IP
/// address (IPv4 for an IPv4-mapped GID; parsing takes either form or the
/// eight-group GID form):
///
/// ```text
/// qpn=0x000011 psn=0x2a3b4c gid=127.0.0.1 gid_index=0 port=1 lid=0 mtu=1024 qkey=0x11111111 addr=0x7f0000001000 rkey=0x00000102 len=4096
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// QP number.
    pub qpn: u32,
    /// First PSN this side sends with (the peer's `rq_psn`).
    pub psn: u32,
    /// This side's GID (the peer's destination GID).
    pub gid: Gid,
    /// Index of `gid` in this side's table (this side's `sgid_index`; the
    /// peer does not need it, it is sent for diagnostics).
    pub gid_index: u8,
    /// This side's port (1-based).
    pub port: u8,
    /// LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// This side's active MTU; a connection uses the smaller of the two.
    pub mtu: Mtu,
    /// Q_Key of a UD QP (what a sender to it puts in its work requests).
    pub qkey: u32,
    /// A buffer this side lets the peer access, if any.
    pub buffer: Option<RemoteBuffer>,
}

/// The Q_Key [`Endpoint::local`] gives a UD QP (the one the libibverbs
/// examples and perftest use).
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// A malformed endpoint encoding or text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointParseError(String);

impl fmt::Display for EndpointParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad endpoint: {}", self.0)
    }
}

impl std::error::Error for EndpointParseError {}

fn bad(why: impl Into<String>) -> EndpointParseError {
    EndpointParseError(why.into())
}

impl Endpoint {
    /// Length of [`Endpoint::encode`]'s output.
    pub const ENCODED_LEN: usize = 60;
    const MAGIC: [u8; 4] = *b"SVEP";
    const VERSION: u8 = 1;

    /// This side of `qp`: its number, GID `gid_index` of `port`, the port's
    /// LID and active MTU, a fresh random PSN, the Q_Key [`DEFAULT_QKEY`],
    /// and no buffer ([`Endpoint::with_buffer`] adds one).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a port or GID index the device does not have;
    /// `ENODEV` after removal.
    pub fn local(ctx: &Context, qp: &Qp, port: u8, gid_index: u8) -> Result<Endpoint> {
        let pa = ctx.query_port(port)?;
        let gid = ctx.query_gid(port, u32::from(gid_index))?;
        Ok(Endpoint {
            qpn: qp.qp_num(),
            psn: random_psn(),
            gid,
            gid_index,
            port,
            lid: pa.lid,
            mtu: pa.active_mtu,
            qkey: DEFAULT_QKEY,
            buffer: None,
        })
    }

    /// The same with the first PSN `psn` (masked to 24 bits).
    pub fn with_psn(mut self, psn: u32) -> Endpoint {
        self.psn = psn & 0xff_ffff;
        self
    }

    /// The same announcing the whole of `mr` to the peer.
    pub fn with_buffer(mut self, mr: &Mr) -> Endpoint {
        self.buffer = Some(RemoteBuffer::of(mr));
        self
    }

    /// The 60-byte encoding (see the type's docs).
    pub fn encode(&self) -> [u8; Endpoint::ENCODED_LEN] {
        let mut b = [0u8; Endpoint::ENCODED_LEN];
        b[0..4].copy_from_slice(&Self::MAGIC);
        b[4] = Self::VERSION;
        b[5] = u8::from(self.buffer.is_some());
        b[6] = self.port;
        b[7] = self.mtu.as_raw() as u8;
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[18] = self.gid_index;
        b[20..24].copy_from_slice(&self.qkey.to_be_bytes());
        b[24..40].copy_from_slice(&self.gid.0);
        if let Some(buf) = self.buffer {
            b[40..48].copy_from_slice(&buf.addr.to_be_bytes());
            b[48..52].copy_from_slice(&buf.rkey.to_be_bytes());
            b[52..60].copy_from_slice(&buf.len.to_be_bytes());
        }
        b
    }

    /// Decodes [`Endpoint::encode`]'s output.
    ///
    /// # Errors
    ///
    /// A length other than 60, a wrong magic or version, unknown flag or
    /// reserved bits, an MTU code outside 1..=5, a QPN or PSN of more than
    /// 24 bits, buffer fields without the buffer flag.
    pub fn decode(b: &[u8]) -> std::result::Result<Endpoint, EndpointParseError> {
        if b.len() != Self::ENCODED_LEN {
            return Err(bad(format!("{} bytes, not {}", b.len(), Self::ENCODED_LEN)));
        }
        if b[0..4] != Self::MAGIC {
            return Err(bad("not an endpoint (magic)"));
        }
        if b[4] != Self::VERSION {
            return Err(bad(format!("version {}, not {}", b[4], Self::VERSION)));
        }
        if b[5] & !1 != 0 || b[19] != 0 {
            return Err(bad("reserved bits set"));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let mtu = Mtu::from_raw(u32::from(b[7])).ok_or_else(|| bad(format!("MTU code {}", b[7])))?;
        let buffer = RemoteBuffer {
            addr: u64_at(40),
            rkey: u32_at(48),
            len: u64_at(52),
        };
        let buffer = match b[5] & 1 {
            1 => Some(buffer),
            _ if buffer == RemoteBuffer::default() => None,
            _ => return Err(bad("buffer fields without the buffer flag")),
        };
        let gid = Gid(b[24..40].try_into().expect("16 bytes"));
        let ep = Endpoint {
            qpn: u32_at(8),
            psn: u32_at(12),
            gid,
            gid_index: b[18],
            port: b[6],
            lid: u16::from_be_bytes([b[16], b[17]]),
            mtu,
            qkey: u32_at(20),
            buffer,
        };
        ep.check()?;
        Ok(ep)
    }

    fn check(&self) -> std::result::Result<(), EndpointParseError> {
        if self.qpn > 0xff_ffff {
            return Err(bad(format!("QPN {:#x} has more than 24 bits", self.qpn)));
        }
        if self.psn > 0xff_ffff {
            return Err(bad(format!("PSN {:#x} has more than 24 bits", self.psn)));
        }
        Ok(())
    }

    /// The address vector a UD sender uses to reach this endpoint from
    /// GID `sgid_index` of its `port` (create the AH with
    /// [`Pd::create_ah`](super::Pd::create_ah)).
    pub fn ah_attr(&self, sgid_index: u8, port: u8) -> AhAttr {
        let mut ah = AhAttr::roce(self.gid, sgid_index, port);
        ah.dlid = self.lid;
        if self.gid.is_zero() {
            // InfiniBand without a GRH: the LID routes.
            ah.is_global = false;
        }
        ah
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "qpn={:#08x} psn={:#08x} gid={} gid_index={} port={} lid={} mtu={} qkey={:#010x}",
            self.qpn,
            self.psn,
            self.gid.to_ip(),
            self.gid_index,
            self.port,
            self.lid,
            self.mtu.bytes(),
            self.qkey
        )?;
        if let Some(b) = self.buffer {
            write!(f, " addr={:#x} rkey={:#010x} len={}", b.addr, b.rkey, b.len)?;
        }
        Ok(())
    }
}

fn num<T: TryFrom<u64>>(key: &str, v: &str) -> std::result::Result<T, EndpointParseError> {
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse::<u64>(),
    }
    .map_err(|_| bad(format!("{key}={v:?} is not a number")))?;
    T::try_from(n).map_err(|_| bad(format!("{key}={v} is out of range")))
}

impl FromStr for Endpoint {
    type Err = EndpointParseError;

    /// Parses the text form (see the type's docs). Every key must appear
    /// once, the buffer's three all or none; unknown keys are errors.
    fn from_str(s: &str) -> std::result::Result<Endpoint, EndpointParseError> {
        const KEYS: [&str; 11] = [
            "qpn",
            "psn",
            "gid",
            "gid_index",
            "port",
            "lid",
            "mtu",
            "qkey",
            "addr",
            "rkey",
            "len",
        ];
        let mut vals: [Option<&str>; 11] = [None; 11];
        for field in s.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| bad(format!("{field:?} is not key=value")))?;
            let i = KEYS
                .iter()
                .position(|&x| x == k)
                .ok_or_else(|| bad(format!("unknown key {k:?}")))?;
            if vals[i].replace(v).is_some() {
                return Err(bad(format!("{k} given twice")));
            }
        }
        let get = |i: usize| vals[i].ok_or_else(|| bad(format!("{} missing", KEYS[i])));
        let gid: Gid = get(2)?
            .parse()
            .map_err(|_| bad(format!("gid={:?} is not an IP address", vals[2].unwrap_or(""))))?;
        let mtu_bytes: u32 = num("mtu", get(6)?)?;
        let mtu = Mtu::ALL
            .iter()
            .copied()
            .find(|m| m.bytes() == mtu_bytes)
            .ok_or_else(|| bad(format!("mtu={mtu_bytes} is not 256, 512, 1024, 2048 or 4096")))?;
        let buffer = match (vals[8], vals[9], vals[10]) {
            (None, None, None) => None,
            (Some(a), Some(r), Some(l)) => Some(RemoteBuffer {
                addr: num("addr", a)?,
                rkey: num("rkey", r)?,
                len: num("len", l)?,
            }),
            _ => return Err(bad("addr, rkey and len go together")),
        };
        let ep = Endpoint {
            qpn: num("qpn", get(0)?)?,
            psn: num("psn", get(1)?)?,
            gid,
            gid_index: num("gid_index", get(3)?)?,
            port: num("port", get(4)?)?,
            lid: num("lid", get(5)?)?,
            mtu,
            qkey: num("qkey", get(7)?)?,
            buffer,
        };
        ep.check()?;
        Ok(ep)
    }
}

/// A PSN that differs between calls, runs and processes (what
/// `ibv_rc_pingpong` takes from `lrand48()`): the standard library's
/// randomly keyed hasher over a counter.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    (h.finish() & 0xff_ffff) as u32
}

/// How [`Connect::apply`] brings a QP to RTS; every value has a default
/// and a setter.
///
/// | attribute | default |
/// |-----------|---------|
/// | `qp_access_flags` (RC) | remote write, read and atomic (atomic only if the device has atomics), cut down to what the MR given with [`Connect::mr`] allows |
/// | `qp_access_flags` (UC) | remote write, likewise |
/// | `path_mtu` | the smaller of the two endpoints' MTUs |
/// | `max_dest_rd_atomic` | the device's `max_qp_rd_atom` |
/// | `max_rd_atomic` | the device's `max_qp_init_rd_atom` |
/// | `timeout` | 14 (4.096 µs · 2^14 ≈ 67 ms) |
/// | `retry_cnt` | 7 |
/// | `rnr_retry` | 7 (retry forever) |
/// | `min_rnr_timer` | 12 (0.64 ms) |
/// | `pkey_index` | 0 |
/// | hop limit / traffic class / SL | 64 / 0 / 0 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    access: Option<AccessFlags>,
    mr_access: Option<AccessFlags>,
    mtu: Option<Mtu>,
    max_dest_rd_atomic: Option<u8>,
    max_rd_atomic: Option<u8>,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    pkey_index: u16,
    hop_limit: u8,
    traffic_class: u8,
    sl: u8,
}

impl Default for Connect {
    fn default() -> Self {
        Connect {
            access: None,
            mr_access: None,
            mtu: None,
            max_dest_rd_atomic: None,
            max_rd_atomic: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            pkey_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
        }
    }
}

macro_rules! setter {
    ($(#[$m:meta])* $name:ident: $t:ty) => {
        $(#[$m])*
        pub fn $name(mut self, v: $t) -> Connect {
            self.$name = v;
            self
        }
    };
}

macro_rules! opt_setter {
    ($(#[$m:meta])* $name:ident: $t:ty) => {
        $(#[$m])*
        pub fn $name(mut self, v: $t) -> Connect {
            self.$name = Some(v);
            self
        }
    };
}

impl Connect {
    /// The defaults (see the type's table).
    pub fn new() -> Connect {
        Connect::default()
    }

    /// Grants the peer only the remote rights `mr` has (the usual choice
    /// when one MR is what the peer may access).
    pub fn mr(mut self, mr: &Mr) -> Connect {
        self.mr_access = Some(mr.access());
        self
    }

    opt_setter!(
        /// The QP's remote access rights, instead of the defaults.
        access: AccessFlags
    );
    opt_setter!(
        /// The path MTU, instead of the smaller of the endpoints'.
        mtu: Mtu
    );
    opt_setter!(
        /// Incoming RDMA READs and atomics in flight (responder resources).
        max_dest_rd_atomic: u8
    );
    opt_setter!(
        /// Outgoing RDMA READs and atomics in flight (initiator depth).
        max_rd_atomic: u8
    );
    setter!(
        /// Local ACK timeout exponent (4.096 µs · 2^timeout; 0 = infinite).
        timeout: u8
    );
    setter!(
        /// Transport retries (0..=7).
        retry_cnt: u8
    );
    setter!(
        /// RNR retries (0..=7; 7 = forever).
        rnr_retry: u8
    );
    setter!(
        /// Minimum RNR NAK timer code (0..=31).
        min_rnr_timer: u8
    );
    setter!(
        /// P_Key index.
        pkey_index: u16
    );
    setter!(
        /// Hop limit of the GRH.
        hop_limit: u8
    );
    setter!(
        /// Traffic class of the GRH.
        traffic_class: u8
    );
    setter!(
        /// Service level.
        sl: u8
    );

    fn qp_access(&self, qp_type: QpType, dev_atomics: bool) -> AccessFlags {
        let mut a = match qp_type {
            QpType::Rc => {
                let mut a = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
                if dev_atomics {
                    a |= AccessFlags::REMOTE_ATOMIC;
                }
                a
            }
            _ => AccessFlags::REMOTE_WRITE,
        };
        if let Some(mr) = self.mr_access {
            a &= mr;
        }
        self.access.unwrap_or(a)
    }

    /// RESET→INIT only (to post receives before the peer's endpoint is
    /// known): pkey index, `local.port`, access rights (RC/UC) or
    /// `local.qkey` (UD). [`Connect::apply`] continues from INIT.
    ///
    /// # Errors
    ///
    /// Those of [`Qp::modify`]; `ENODEV` after removal.
    pub fn init(&self, ctx: &Context, qp: &Qp, local: &Endpoint) -> Result<()> {
        let dev = ctx.query_device()?;
        let qp_type = qp.qp_type();
        let atomics = dev.atomic_cap.is_some_and(|c| c != AtomicCap::None);
        let attr = QpModify::new()
            .with_state(QpState::Init)
            .with_pkey_index(self.pkey_index)
            .with_port_num(local.port);
        let attr = match qp_type {
            QpType::Ud => attr.with_qkey(local.qkey),
            _ => attr.with_access_flags(self.qp_access(qp_type, atomics)),
        };
        attr.apply(qp)
    }

    /// Takes `qp` from RESET (or INIT) to RTS: INIT as [`Connect::init`],
    /// RTR towards `remote` (RC/UC: its GID, QPN and PSN), RTS with
    /// `local.psn` as the first send PSN. `remote` is required for RC and
    /// UC and ignored for UD (whose destinations are in each work
    /// request).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the QP is neither in RESET nor in INIT, or `remote` is
    /// missing for RC/UC; those of [`Qp::modify`] (the QP is left in the
    /// last state reached).
    pub fn apply(&self, ctx: &Context, qp: &Qp, local: &Endpoint, remote: Option<&Endpoint>) -> Result<()> {
        let qp_type = qp.qp_type();
        match qp.query()?.qp_state {
            QpState::Reset => self.init(ctx, qp, local)?,
            QpState::Init => {}
            s => {
                return Err(verr!(
                    ModifyQp,
                    InvalidArgument,
                    "connect takes a QP in RESET or INIT, this one is in {s}"
                ))
            }
        }
        let rtr = QpModify::new().with_state(QpState::Rtr);
        let rts = QpModify::new().with_state(QpState::Rts).with_sq_psn(local.psn);
        if qp_type == QpType::Ud {
            rtr.apply(qp)?;
            return rts.apply(qp);
        }
        let remote = remote.ok_or_else(|| {
            verr!(
                ModifyQp,
                InvalidArgument,
                "a {qp_type} QP needs the remote endpoint to connect to"
            )
        })?;
        let mut av = remote.ah_attr(local.gid_index, local.port);
        av.grh.hop_limit = self.hop_limit;
        av.grh.traffic_class = self.traffic_class;
        av.sl = self.sl;
        let mtu = self.mtu.unwrap_or_else(|| {
            if remote.mtu.bytes() < local.mtu.bytes() {
                remote.mtu
            } else {
                local.mtu
            }
        });
        let rtr = rtr
            .with_ah_attr(av)
            .with_path_mtu(mtu)
            .with_dest_qp_num(remote.qpn)
            .with_rq_psn(remote.psn);
        if qp_type == QpType::Uc {
            rtr.apply(qp)?;
            return rts.apply(qp);
        }
        let dev = ctx.query_device()?;
        let clamp = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
        rtr.with_max_dest_rd_atomic(self.max_dest_rd_atomic.unwrap_or(clamp(dev.max_qp_rd_atom)))
            .with_min_rnr_timer(self.min_rnr_timer)
            .apply(qp)?;
        rts.with_timeout(self.timeout)
            .with_retry_cnt(self.retry_cnt)
            .with_rnr_retry(self.rnr_retry)
            .with_max_rd_atomic(self.max_rd_atomic.unwrap_or(clamp(dev.max_qp_init_rd_atom)))
            .apply(qp)
    }
}

impl Qp {
    /// Takes this QP from RESET (or INIT) to RTS towards `remote` with
    /// [`Connect`]'s defaults (`Connect::new().apply(ctx, self, local,
    /// Some(remote))`); `ctx` is the QP's device, whose limits set the
    /// READ/atomic depths. For other values use [`Connect`].
    ///
    /// # Errors
    ///
    /// As [`Connect::apply`].
    pub fn connect(&self, ctx: &Context, local: &Endpoint, remote: &Endpoint) -> Result<()> {
        Connect::new().apply(ctx, self, local, Some(remote))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(buffer: bool) -> Endpoint {
        Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            gid_index: 3,
            port: 1,
            lid: 7,
            mtu: Mtu::Mtu2048,
            qkey: 0x1111_1111,
            buffer: buffer.then_some(RemoteBuffer {
                addr: 0x7f00_dead_b000,
                rkey: 0x1234_5678,
                len: 1 << 20,
            }),
        }
    }

    #[test]
    fn bytes_round_trip_and_layout_is_stable() {
        for b in [false, true] {
            let e = sample(b);
            assert_eq!(Endpoint::decode(&e.encode()).unwrap(), e);
        }
        let enc = sample(true).encode();
        assert_eq!(&enc[0..8], b"SVEP\x01\x01\x01\x04");
        assert_eq!(&enc[8..12], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&enc[24..40], &Gid::from_ip("127.0.0.1".parse().unwrap()).0);
        assert_eq!(&enc[48..52], &[0x12, 0x34, 0x56, 0x78]);
    }

    #[test]
    fn bad_bytes_are_refused() {
        let good = sample(true).encode();
        assert!(Endpoint::decode(&good[..59]).is_err());
        for (i, v) in [(0, b'X'), (4, 2), (5, 3), (7, 0), (7, 6), (8, 1), (12, 1), (19, 1)] {
            let mut b = good;
            b[i] = v;
            assert!(Endpoint::decode(&b).is_err(), "byte {i} = {v}");
        }
        let mut b = sample(false).encode();
        b[50] = 1;
        assert!(Endpoint::decode(&b).is_err(), "buffer bytes without the flag");
    }

    #[test]
    fn text_round_trips_and_refuses_junk() {
        for b in [false, true] {
            let e = sample(b);
            let t = e.to_string();
            assert_eq!(t.parse::<Endpoint>().unwrap(), e, "{t}");
        }
        let t = sample(true).to_string();
        for junk in [
            t.replace("mtu=2048", "mtu=3000"),
            t.replace("qpn=", "qpx="),
            t.replace(" len=1048576", ""),
            format!("{t} qpn=1"),
            t.replace("qpn=0x123456", "qpn=0x1234567"),
            t.replace("gid=127.0.0.1", "gid=nowhere"),
            String::new(),
        ] {
            assert!(junk.parse::<Endpoint>().is_err(), "{junk}");
        }
    }

    #[test]
    fn the_documented_text_parses() {
        let t = "qpn=0x000011 psn=0x2a3b4c gid=127.0.0.1 gid_index=0 port=1 lid=0 mtu=1024 qkey=0x11111111 addr=0x7f0000001000 rkey=0x00000102 len=4096";
        let e: Endpoint = t.parse().unwrap();
        assert_eq!(
            (e.qpn, e.psn, e.mtu, e.buffer.unwrap().len),
            (0x11, 0x2a_3b4c, Mtu::Mtu1024, 4096)
        );
        assert_eq!(e.to_string(), t);
        let mapped = t.replace("gid=127.0.0.1", "gid=0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(mapped.parse::<Endpoint>().unwrap(), e);
    }

    #[test]
    fn access_defaults_follow_the_mr_and_the_device() {
        let c = Connect::new();
        assert_eq!(c.qp_access(QpType::Rc, true), AccessFlags::REMOTE);
        assert_eq!(
            c.qp_access(QpType::Rc, false),
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
        );
        assert_eq!(c.qp_access(QpType::Uc, true), AccessFlags::REMOTE_WRITE);
        let c = Connect {
            mr_access: Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
            ..Connect::new()
        };
        assert_eq!(c.qp_access(QpType::Rc, true), AccessFlags::REMOTE_READ);
        assert_eq!(
            c.access(AccessFlags::empty()).qp_access(QpType::Rc, true),
            AccessFlags::empty()
        );
    }

    #[test]
    fn psns_are_24_bits_and_vary() {
        let v: Vec<u32> = (0..16).map(|_| random_psn()).collect();
        assert!(v.iter().all(|&p| p <= 0xff_ffff));
        assert!(v.windows(2).any(|w| w[0] != w[1]));
    }
}
