//! IBTA CM MADs (InfiniBand Architecture vol. 1, ch. 12.6) and rdma_cm's
//! private-data header, encoded and decoded without I/O.
//!
//! Every CM MAD is 256 bytes: the 24-byte common MAD header (base version
//! 1, management class 0x07, class version 2, method SEND, the transaction
//! ID and the attribute ID that names the message) and 232 bytes of
//! message. Field offsets below are from the start of the message (byte 24
//! of the MAD); multi-byte fields are big-endian.
//!
//! rdma_cm puts a 36-byte header ([`CmaHdr`]) at the start of the REQ's and
//! SIDR_REQ's private data: version, IP version, the source port and both
//! IP addresses; the destination port is in the service ID.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::soft::proto::gsi::MAD_LEN;
use crate::verbs::Gid;

/// MAD base version.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version.
pub const CM_CLASS_VERSION: u8 = 2;
/// The SEND method (every CM message uses it).
pub const METHOD_SEND: u8 = 0x03;
/// Length of the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Length of a CM message after the MAD header.
pub const MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// Length of rdma_cm's private-data header.
pub const CMA_HDR_LEN: usize = 36;

/// Private data a REQ carries (92 bytes, of which rdma_cm's header takes 36).
pub const REQ_PRIVATE: usize = 92;
/// Private data a REP carries.
pub const REP_PRIVATE: usize = 196;
/// Private data a REJ carries.
pub const REJ_PRIVATE: usize = 148;
/// Private data an RTU carries.
pub const RTU_PRIVATE: usize = 224;
/// Private data a DREQ carries.
pub const DREQ_PRIVATE: usize = 220;
/// Private data a DREP carries.
pub const DREP_PRIVATE: usize = 224;
/// Private data an MRA carries.
pub const MRA_PRIVATE: usize = 222;
/// Private data a SIDR_REQ carries (216 bytes, of which rdma_cm's header
/// takes 36).
pub const SIDR_REQ_PRIVATE: usize = 216;
/// Private data a SIDR_REP carries.
pub const SIDR_REP_PRIVATE: usize = 136;

/// Offsets of the private data in each message.
const REQ_PD: usize = 140;
const REP_PD: usize = 36;
const REJ_PD: usize = 84;
const RTU_PD: usize = 8;
const DREQ_PD: usize = 12;
const DREP_PD: usize = 8;
const MRA_PD: usize = 10;
const SIDR_REQ_PD: usize = 16;
const SIDR_REP_PD: usize = 96;

/// The service ID prefix of rdma_cm's IP port spaces.
pub const IP_PS_PREFIX: u64 = 0x0000_0000_0100_0000;

/// The service ID rdma_cm uses for `port` in port space `ps` (0x0106 TCP,
/// 0x0111 UDP): `ps << 16 | port`, inside [`IP_PS_PREFIX`].
pub fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The port space and port of an rdma_cm service ID; `None` for a service
/// ID outside rdma_cm's IP port spaces.
pub fn split_service_id(sid: u64) -> Option<(u16, u16)> {
    if sid & 0xFFFF_FFFF_FF00_0000 != IP_PS_PREFIX {
        return None;
    }
    Some(((sid >> 16) as u16, sid as u16))
}

/// CM attribute IDs.
pub mod attr {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Connection reject.
    pub const REJ: u16 = 0x0012;
    /// Connection reply.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
}

/// REJ reasons used here (IBTA table 112).
pub mod rej {
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid service ID (nobody listens).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Consumer reject.
    pub const CONSUMER_REJECT: u16 = 28;
}

/// SIDR_REP statuses used here (IBTA table 119).
pub mod sidr {
    /// The service ID is not supported (nobody listens on it).
    pub const UNSUPPORTED: u8 = 1;
}

/// What a REJ or an MRA refers to (the `message_rejected` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgRef {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// Something else.
    Other,
}

impl MsgRef {
    fn to_bits(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
        }
    }
    fn from_bits(b: u8) -> MsgRef {
        match b & 3 {
            0 => MsgRef::Req,
            1 => MsgRef::Rep,
            _ => MsgRef::Other,
        }
    }
}

/// A connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service (rdma_cm: port space and destination port).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (0 for RC).
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// RDMA READ/atomic responder resources offered.
    pub responder_resources: u8,
    /// RDMA READ/atomic initiator depth wanted.
    pub initiator_depth: u8,
    /// Remote CM response timeout (4.096 µs × 2^n).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (0 RC, 1 UC).
    pub transport: u8,
    /// The sender's first send PSN.
    pub starting_psn: u32,
    /// The sender's own CM response timeout.
    pub local_cm_response_timeout: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// Path MTU (verbs encoding, 1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Most REQ retries the sender makes.
    pub max_cm_retries: u8,
    /// Whether the sender's QP has an SRQ.
    pub srq: bool,
    /// The sender's GID (primary path's local port GID).
    pub local_gid: Gid,
    /// The receiver's GID.
    pub remote_gid: Gid,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Local ACK timeout of the path.
    pub local_ack_timeout: u8,
    /// Private data (up to [`REQ_PRIVATE`] bytes; the rest is zero).
    pub private_data: Vec<u8>,
}

/// A connection reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key.
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// The sender's first send PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay.
    pub target_ack_delay: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Whether the sender's QP has an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (up to [`REP_PRIVATE`] bytes).
    pub private_data: Vec<u8>,
}

/// A reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID (0 if it has none).
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MsgRef,
    /// The reason ([`rej`]).
    pub reason: u16,
    /// Private data (up to [`REJ_PRIVATE`] bytes).
    pub private_data: Vec<u8>,
}

/// A message receipt acknowledgement (asks the peer to wait longer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MsgRef,
    /// How long the sender needs (4.096 µs × 2^n).
    pub service_timeout: u8,
}

/// RTU, DREQ or DREP: two communication IDs, private data, and (DREQ) the
/// receiver's QPN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// DREQ only: the receiver's QP number.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// A service ID resolution request (UD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// The request's ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service.
    pub service_id: u64,
    /// Private data (up to [`SIDR_REQ_PRIVATE`] bytes).
    pub private_data: Vec<u8>,
}

/// A service ID resolution reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// 0 success, 1 service ID not supported, 2 rejected, 3 no QP.
    pub status: u8,
    /// The service's QP.
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Private data (up to [`SIDR_REP_PRIVATE`] bytes).
    pub private_data: Vec<u8>,
}

impl Req {
    /// The REJ of this request for `reason`, from a side that keeps no
    /// connection for it (its own communication ID is 0).
    pub fn rej(&self, reason: u16) -> CmMsg {
        CmMsg::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: self.local_comm_id,
            message_rejected: MsgRef::Req,
            reason,
            private_data: Vec::new(),
        })
    }
}

impl SidrReq {
    /// The SIDR_REP refusing this request with `status` ([`sidr`]).
    pub fn refusal(&self, status: u8) -> CmMsg {
        CmMsg::SidrRep(SidrRep {
            request_id: self.request_id,
            status,
            qpn: 0,
            service_id: self.service_id,
            qkey: 0,
            private_data: Vec::new(),
        })
    }
}

impl Ids {
    /// The DREP answering this DREQ, from the side whose communication ID
    /// is `local`.
    pub fn drep(&self, local: u32) -> CmMsg {
        CmMsg::Drep(Ids {
            local_comm_id: local,
            remote_comm_id: self.local_comm_id,
            remote_qpn: 0,
            private_data: Vec::new(),
        })
    }
}

/// A decoded CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Ids),
    /// DREQ.
    Dreq(Ids),
    /// DREP.
    Drep(Ids),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

/// Why a MAD was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadError {
    /// Not base version 1, class CM, class version 2, method SEND.
    NotCm,
    /// An attribute ID this CM does not handle (LAP, APR, ClassPortInfo…).
    UnknownAttr(u16),
}

impl std::fmt::Display for MadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MadError::NotCm => write!(f, "not a CM MAD"),
            MadError::UnknownAttr(a) => write!(f, "unhandled CM attribute {a:#06x}"),
        }
    }
}

impl std::error::Error for MadError {}

fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}
fn get16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn get32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn get64(b: &[u8], o: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(a)
}
/// A 24-bit field followed by an 8-bit one.
fn put24_8(b: &mut [u8], o: usize, v24: u32, v8: u8) {
    put32(b, o, (v24 << 8) | u32::from(v8));
}
fn get24(b: &[u8], o: usize) -> u32 {
    get32(b, o) >> 8
}
fn put_pd(m: &mut [u8], o: usize, max: usize, pd: &[u8]) {
    let n = pd.len().min(max);
    m[o..o + n].copy_from_slice(&pd[..n]);
}

impl CmMsg {
    /// The message's attribute ID.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Encodes the message as a MAD with transaction ID `tid`. Private
    /// data longer than the message allows is cut (callers check sizes
    /// first).
    pub fn encode(&self, tid: u64) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[0] = BASE_VERSION;
        mad[1] = MGMT_CLASS_CM;
        mad[2] = CM_CLASS_VERSION;
        mad[3] = METHOD_SEND;
        put64(&mut mad, 8, tid);
        put16(&mut mad, 16, self.attr_id());
        let m = &mut mad[MAD_HDR_LEN..];
        match self {
            CmMsg::Req(r) => {
                put32(m, 0, r.local_comm_id);
                put64(m, 8, r.service_id);
                put64(m, 16, r.local_ca_guid);
                put32(m, 28, r.local_qkey);
                put24_8(m, 32, r.local_qpn, r.responder_resources);
                put24_8(m, 36, 0, r.initiator_depth);
                // remote EECN (0), remote CM response timeout (5 bits),
                // transport service type (2), end-to-end flow control (1).
                m[43] = (r.remote_cm_response_timeout & 0x1f) << 3 | (r.transport & 3) << 1 | 1;
                put24_8(
                    m,
                    44,
                    r.starting_psn & 0xff_ffff,
                    (r.local_cm_response_timeout & 0x1f) << 3 | (r.retry_count & 7),
                );
                put16(m, 48, 0xffff);
                m[50] = (r.mtu & 0xf) << 4 | (r.rnr_retry_count & 7);
                m[51] = (r.max_cm_retries & 0xf) << 4 | u8::from(r.srq) << 3;
                // Primary path: LIDs are the permissive LID 0xFFFF on RoCE.
                put16(m, 52, 0xffff);
                put16(m, 54, 0xffff);
                m[56..72].copy_from_slice(&r.local_gid.0);
                m[72..88].copy_from_slice(&r.remote_gid.0);
                // flow label 0, packet rate 3 (2.5 Gb/s: "any" on RoCE).
                put32(m, 88, 3);
                m[92] = 0; // traffic class
                m[93] = r.hop_limit;
                m[94] = 0; // SL 0, subnet local 0 (RoCEv2 is routed)
                m[95] = (r.local_ack_timeout & 0x1f) << 3;
                put_pd(m, REQ_PD, REQ_PRIVATE, &r.private_data);
            }
            CmMsg::Mra(r) => {
                put32(m, 0, r.local_comm_id);
                put32(m, 4, r.remote_comm_id);
                m[8] = r.message_mraed.to_bits() << 6;
                m[9] = (r.service_timeout & 0x1f) << 3;
                let _ = MRA_PD;
            }
            CmMsg::Rej(r) => {
                put32(m, 0, r.local_comm_id);
                put32(m, 4, r.remote_comm_id);
                m[8] = r.message_rejected.to_bits() << 6;
                put16(m, 10, r.reason);
                put_pd(m, REJ_PD, REJ_PRIVATE, &r.private_data);
            }
            CmMsg::Rep(r) => {
                put32(m, 0, r.local_comm_id);
                put32(m, 4, r.remote_comm_id);
                put32(m, 8, r.local_qkey);
                put24_8(m, 12, r.local_qpn, 0);
                put24_8(m, 20, r.starting_psn & 0xff_ffff, 0);
                m[24] = r.responder_resources;
                m[25] = r.initiator_depth;
                m[26] = (r.target_ack_delay & 0x1f) << 3 | 1; // end-to-end flow control
                m[27] = (r.rnr_retry_count & 7) << 5 | u8::from(r.srq) << 4;
                put64(m, 28, r.local_ca_guid);
                put_pd(m, REP_PD, REP_PRIVATE, &r.private_data);
            }
            CmMsg::Rtu(r) | CmMsg::Drep(r) => {
                put32(m, 0, r.local_comm_id);
                put32(m, 4, r.remote_comm_id);
                put_pd(m, RTU_PD.max(DREP_PD), RTU_PRIVATE.min(DREP_PRIVATE), &r.private_data);
            }
            CmMsg::Dreq(r) => {
                put32(m, 0, r.local_comm_id);
                put32(m, 4, r.remote_comm_id);
                put24_8(m, 8, r.remote_qpn, 0);
                put_pd(m, DREQ_PD, DREQ_PRIVATE, &r.private_data);
            }
            CmMsg::SidrReq(r) => {
                put32(m, 0, r.request_id);
                put16(m, 4, r.pkey);
                put64(m, 8, r.service_id);
                put_pd(m, SIDR_REQ_PD, SIDR_REQ_PRIVATE, &r.private_data);
            }
            CmMsg::SidrRep(r) => {
                put32(m, 0, r.request_id);
                m[4] = r.status;
                put24_8(m, 8, r.qpn, 0);
                put64(m, 12, r.service_id);
                put32(m, 20, r.qkey);
                put_pd(m, SIDR_REP_PD, SIDR_REP_PRIVATE, &r.private_data);
            }
        }
        mad
    }

    /// Decodes a MAD: its transaction ID and message.
    ///
    /// # Errors
    ///
    /// [`MadError::NotCm`] for a MAD of another class, version or method;
    /// [`MadError::UnknownAttr`] for a CM attribute not handled here.
    pub fn decode(mad: &[u8; MAD_LEN]) -> Result<(u64, CmMsg), MadError> {
        if mad[0] != BASE_VERSION || mad[1] != MGMT_CLASS_CM || mad[2] != CM_CLASS_VERSION || mad[3] != METHOD_SEND {
            return Err(MadError::NotCm);
        }
        let tid = get64(mad, 8);
        let m = &mad[MAD_HDR_LEN..];
        let pd = |o: usize, n: usize| m[o..o + n].to_vec();
        let msg = match get16(mad, 16) {
            attr::REQ => CmMsg::Req(Req {
                local_comm_id: get32(m, 0),
                service_id: get64(m, 8),
                local_ca_guid: get64(m, 16),
                local_qkey: get32(m, 28),
                local_qpn: get24(m, 32),
                responder_resources: m[35],
                initiator_depth: m[39],
                remote_cm_response_timeout: m[43] >> 3,
                transport: (m[43] >> 1) & 3,
                starting_psn: get24(m, 44),
                local_cm_response_timeout: m[47] >> 3,
                retry_count: m[47] & 7,
                mtu: m[50] >> 4,
                rnr_retry_count: m[50] & 7,
                max_cm_retries: m[51] >> 4,
                srq: m[51] & 0x08 != 0,
                local_gid: Gid(m[56..72].try_into().unwrap_or([0; 16])),
                remote_gid: Gid(m[72..88].try_into().unwrap_or([0; 16])),
                hop_limit: m[93],
                local_ack_timeout: m[95] >> 3,
                private_data: pd(REQ_PD, REQ_PRIVATE),
            }),
            attr::MRA => CmMsg::Mra(Mra {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                message_mraed: MsgRef::from_bits(m[8] >> 6),
                service_timeout: m[9] >> 3,
            }),
            attr::REJ => CmMsg::Rej(Rej {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                message_rejected: MsgRef::from_bits(m[8] >> 6),
                reason: get16(m, 10),
                private_data: pd(REJ_PD, REJ_PRIVATE),
            }),
            attr::REP => CmMsg::Rep(Rep {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                local_qkey: get32(m, 8),
                local_qpn: get24(m, 12),
                starting_psn: get24(m, 20),
                responder_resources: m[24],
                initiator_depth: m[25],
                target_ack_delay: m[26] >> 3,
                rnr_retry_count: m[27] >> 5,
                srq: m[27] & 0x10 != 0,
                local_ca_guid: get64(m, 28),
                private_data: pd(REP_PD, REP_PRIVATE),
            }),
            attr::RTU => CmMsg::Rtu(Ids {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                remote_qpn: 0,
                private_data: pd(RTU_PD, RTU_PRIVATE),
            }),
            attr::DREQ => CmMsg::Dreq(Ids {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                remote_qpn: get24(m, 8),
                private_data: pd(DREQ_PD, DREQ_PRIVATE),
            }),
            attr::DREP => CmMsg::Drep(Ids {
                local_comm_id: get32(m, 0),
                remote_comm_id: get32(m, 4),
                remote_qpn: 0,
                private_data: pd(DREP_PD, DREP_PRIVATE),
            }),
            attr::SIDR_REQ => CmMsg::SidrReq(SidrReq {
                request_id: get32(m, 0),
                pkey: get16(m, 4),
                service_id: get64(m, 8),
                private_data: pd(SIDR_REQ_PD, SIDR_REQ_PRIVATE),
            }),
            attr::SIDR_REP => CmMsg::SidrRep(SidrRep {
                request_id: get32(m, 0),
                status: m[4],
                qpn: get24(m, 8),
                service_id: get64(m, 12),
                qkey: get32(m, 20),
                private_data: pd(SIDR_REP_PD, SIDR_REP_PRIVATE),
            }),
            other => return Err(MadError::UnknownAttr(other)),
        };
        Ok((tid, msg))
    }

    /// What a device's CM answers to `mad` when no connection manager
    /// runs over the device (no agent owns its QP1), as a host's kernel CM
    /// answers for a service nobody listens on: a REQ gets a REJ (invalid
    /// service ID), a SIDR_REQ a SIDR_REP (service ID not supported), a
    /// DREQ a DREP (so that the peer's disconnect finishes). Anything else,
    /// or a MAD that is not a CM message, gets nothing.
    pub(crate) fn answer_unattended(mad: &[u8; MAD_LEN]) -> Option<[u8; MAD_LEN]> {
        let (tid, msg) = CmMsg::decode(mad).ok()?;
        let reply = match msg {
            CmMsg::Req(r) => r.rej(rej::INVALID_SERVICE_ID),
            CmMsg::SidrReq(r) => r.refusal(sidr::UNSUPPORTED),
            // No connection: answered as from the ID the DREQ names.
            CmMsg::Dreq(r) => r.drep(r.remote_comm_id),
            _ => return None,
        };
        Some(reply.encode(tid))
    }
}

/// rdma_cm's private-data header (`struct cma_hdr`): version 0, the IP
/// version in the high nibble of byte 1, the source port, and the source
/// and destination addresses (IPv4 in the last 4 bytes of each 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// Source address.
    pub src: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination address.
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Writes the header followed by `user` into a private-data buffer.
    pub fn prepend(&self, user: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; CMA_HDR_LEN];
        b[0] = 0; // cma_version
        b[1] = if self.src.is_ipv4() { 4 << 4 } else { 6 << 4 };
        put16(&mut b, 2, self.src_port);
        put_ip(&mut b[4..20], self.src);
        put_ip(&mut b[20..36], self.dst);
        b.extend_from_slice(user);
        b
    }

    /// Splits private data into the header and the user's part; `None` if
    /// it does not start with a version-0 header of IP version 4 or 6.
    pub fn parse(pd: &[u8]) -> Option<(CmaHdr, &[u8])> {
        if pd.len() < CMA_HDR_LEN || pd[0] != 0 {
            return None;
        }
        let v6 = match pd[1] >> 4 {
            4 => false,
            6 => true,
            _ => return None,
        };
        let hdr = CmaHdr {
            src_port: get16(pd, 2),
            src: get_ip(&pd[4..20], v6),
            dst: get_ip(&pd[20..36], v6),
        };
        Some((hdr, &pd[CMA_HDR_LEN..]))
    }
}

fn put_ip(b: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => b[12..16].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
    }
}

fn get_ip(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        let mut a = [0; 16];
        a.copy_from_slice(b);
        IpAddr::V6(Ipv6Addr::from(a))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Req {
        Req {
            local_comm_id: 0x1234_5678,
            service_id: service_id(0x0106, 7471),
            local_ca_guid: 0x0102_0304_0506_0708,
            local_qkey: 0,
            local_qpn: 0xab_cdef,
            responder_resources: 4,
            initiator_depth: 3,
            remote_cm_response_timeout: 20,
            transport: 0,
            starting_psn: 0x12_3456,
            local_cm_response_timeout: 20,
            retry_count: 7,
            mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            local_gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            remote_gid: Gid::from_ip("10.0.0.2".parse().unwrap()),
            hop_limit: 64,
            local_ack_timeout: 14,
            private_data: {
                let mut v = vec![0u8; REQ_PRIVATE];
                v[0] = 9;
                v[91] = 7;
                v
            },
        }
    }

    #[test]
    fn req_round_trips_and_lays_out_the_header() {
        let m = CmMsg::Req(req());
        let mad = m.encode(0x99);
        assert_eq!(&mad[..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&mad[16..18], &[0x00, 0x10]);
        // Service ID at message offset 8 (MAD byte 32).
        assert_eq!(&mad[32..40], &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f]);
        // Private data ends at the MAD's last byte.
        assert_eq!(mad[255], 7);
        assert_eq!(mad[24 + 140], 9);
        assert_eq!(CmMsg::decode(&mad), Ok((0x99, m)));
    }

    #[test]
    fn a_device_without_a_cm_refuses_requests_and_ends_disconnects() {
        let answer = |m: &CmMsg| CmMsg::decode(&CmMsg::answer_unattended(&m.encode(0x77)).unwrap()).unwrap();
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id: 0x1234_5678,
            message_rejected: MsgRef::Req,
            reason: rej::INVALID_SERVICE_ID,
            private_data: vec![0; REJ_PRIVATE],
        };
        assert_eq!(answer(&CmMsg::Req(req())), (0x77, CmMsg::Rej(rej)));
        let sidr = SidrReq {
            request_id: 41,
            pkey: 0xffff,
            service_id: service_id(0x0111, 7),
            private_data: vec![0; SIDR_REQ_PRIVATE],
        };
        let (_, rep) = answer(&CmMsg::SidrReq(sidr));
        assert!(
            matches!(rep, CmMsg::SidrRep(SidrRep { request_id: 41, status: 1, qpn: 0, service_id, .. }) if service_id == 0x0111_0007)
        );
        let dreq = Ids {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: 0x99,
            private_data: vec![0; DREQ_PRIVATE],
        };
        let (_, drep) = answer(&CmMsg::Dreq(dreq));
        assert!(matches!(
            drep,
            CmMsg::Drep(Ids {
                local_comm_id: 6,
                remote_comm_id: 5,
                ..
            })
        ));
        // Replies, and what is not a CM message, get no answer.
        let rtu = Ids {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: 0,
            private_data: vec![0; RTU_PRIVATE],
        };
        assert_eq!(CmMsg::answer_unattended(&CmMsg::Rtu(rtu).encode(1)), None);
        assert_eq!(CmMsg::answer_unattended(&CmMsg::Rej(rej_of_nothing()).encode(1)), None);
        assert_eq!(CmMsg::answer_unattended(&[0; MAD_LEN]), None);
    }

    fn rej_of_nothing() -> Rej {
        Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: MsgRef::Rep,
            reason: rej::TIMEOUT,
            private_data: Vec::new(),
        }
    }

    #[test]
    fn every_message_round_trips() {
        let full = |n: usize| (0..n).map(|i| i as u8).collect::<Vec<_>>();
        let msgs = [
            CmMsg::Rep(Rep {
                local_comm_id: 1,
                remote_comm_id: 2,
                local_qkey: 3,
                local_qpn: 0x44_5566,
                starting_psn: 0xff_ffff,
                responder_resources: 1,
                initiator_depth: 2,
                target_ack_delay: 3,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: 42,
                private_data: full(REP_PRIVATE),
            }),
            CmMsg::Rej(Rej {
                local_comm_id: 5,
                remote_comm_id: 6,
                message_rejected: MsgRef::Rep,
                reason: rej::CONSUMER_REJECT,
                private_data: full(REJ_PRIVATE),
            }),
            CmMsg::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: MsgRef::Req,
                service_timeout: 21,
            }),
            CmMsg::Rtu(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 0,
                private_data: full(RTU_PRIVATE),
            }),
            CmMsg::Dreq(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 77,
                private_data: full(DREQ_PRIVATE),
            }),
            CmMsg::Drep(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 0,
                private_data: full(DREP_PRIVATE),
            }),
            CmMsg::SidrReq(SidrReq {
                request_id: 9,
                pkey: 0xffff,
                service_id: service_id(0x0111, 1),
                private_data: full(SIDR_REQ_PRIVATE),
            }),
            CmMsg::SidrRep(SidrRep {
                request_id: 9,
                status: 0,
                qpn: 0x12_3456,
                service_id: service_id(0x0111, 1),
                qkey: 0x0123_4567,
                private_data: full(SIDR_REP_PRIVATE),
            }),
        ];
        for m in msgs {
            let mad = m.encode(7);
            assert_eq!(CmMsg::decode(&mad), Ok((7, m.clone())), "{m:?}");
        }
    }

    #[test]
    fn foreign_mads_are_refused() {
        let mut mad = CmMsg::Req(req()).encode(1);
        mad[1] = 0x04; // performance management
        assert_eq!(CmMsg::decode(&mad), Err(MadError::NotCm));
        let mut mad = CmMsg::Req(req()).encode(1);
        mad[17] = 0x19; // LAP
        assert_eq!(CmMsg::decode(&mad), Err(MadError::UnknownAttr(0x19)));
    }

    #[test]
    fn cma_header_carries_both_addresses_and_the_port() {
        let h = CmaHdr {
            src: "10.1.2.3".parse().unwrap(),
            src_port: 40000,
            dst: "10.9.8.7".parse().unwrap(),
        };
        let pd = h.prepend(b"hello");
        assert_eq!(pd.len(), CMA_HDR_LEN + 5);
        assert_eq!(pd[1], 0x40);
        assert_eq!(&pd[16..20], &[10, 1, 2, 3]);
        assert_eq!(&pd[32..36], &[10, 9, 8, 7]);
        let (back, user) = CmaHdr::parse(&pd).unwrap();
        assert_eq!((back, user), (h, &b"hello"[..]));
        let h6 = CmaHdr {
            src: "fd00::1".parse().unwrap(),
            src_port: 1,
            dst: "fd00::2".parse().unwrap(),
        };
        assert_eq!(CmaHdr::parse(&h6.prepend(&[])).unwrap().0, h6);
        assert!(CmaHdr::parse(&[0; 10]).is_none());
    }

    #[test]
    fn service_ids_are_rdma_cm_s() {
        assert_eq!(service_id(0x0106, 7471), 0x0000_0000_0106_1d2f);
        assert_eq!(split_service_id(0x0000_0000_0106_1d2f), Some((0x0106, 7471)));
        assert_eq!(split_service_id(0x1000_0000_0000_0001), None);
    }
}
