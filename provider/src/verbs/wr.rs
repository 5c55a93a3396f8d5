//! Work requests and work completions.
//!
//! A work request borrows what it names for the duration of the post call
//! only: scatter/gather entries ([`Sge`]) are checked views of registered
//! memory, inline data is copied before `post_send` returns, and nothing in
//! a [`SendWr`] needs to outlive the call.

use std::marker::PhantomData;

use super::handle::{Ah, Mr, Mw};
use super::types::*;

/// A scatter/gather entry: a range of registered memory and its local key
/// (`struct ibv_sge`).
///
/// Safe code makes one with [`Mr::sge`], which checks the range against the
/// MR and ties the entry's lifetime to the MR handle, or with
/// [`Sge::inline`] for data that a send copies at post time. Raw entries for
/// memory registered with [`Pd::reg_mr_raw`](super::Pd::reg_mr_raw) come from
/// the `unsafe` [`Sge::from_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge<'a> {
    addr: u64,
    length: u32,
    lkey: u32,
    origin: SgeOrigin,
    _memory: PhantomData<&'a [u8]>,
}

/// Where an [`Sge`] came from, which decides how inline data is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgeOrigin {
    /// [`Sge::inline`]: a plain Rust slice, valid for the entry's lifetime.
    Inline,
    /// [`Mr::sge`]: a checked range of an MR, read through the MR.
    Mr,
    /// [`Sge::from_raw`]: the caller vouched for the address.
    Raw,
}

impl<'a> Sge<'a> {
    /// An entry over plain memory that is only valid in a send with
    /// [`SendFlags::INLINE`]: its bytes are copied when the WR is posted. It
    /// carries no key; a WR that uses it without `INLINE` is rejected with
    /// `EINVAL` at post time.
    pub fn inline(data: &'a [u8]) -> Sge<'a> {
        Sge {
            addr: data.as_ptr() as u64,
            length: u32::try_from(data.len()).unwrap_or(u32::MAX),
            lkey: 0,
            origin: SgeOrigin::Inline,
            _memory: PhantomData,
        }
    }

    /// An entry from raw parts, as `struct ibv_sge` has them.
    ///
    /// # Safety
    ///
    /// `addr..addr+length` must lie in memory registered under `lkey` whose
    /// registration the caller keeps alive until every work request using
    /// this entry has completed; if the entry is used as inline data, the
    /// range must be readable for the duration of the post call. The device
    /// reads or writes this memory concurrently with the program, so the
    /// program must not hold Rust references into it while WRs are in flight.
    pub unsafe fn from_raw(addr: u64, length: u32, lkey: u32) -> Sge<'static> {
        Sge {
            addr,
            length,
            lkey,
            origin: SgeOrigin::Raw,
            _memory: PhantomData,
        }
    }

    /// Crate-internal constructor for entries already checked against an MR.
    pub(crate) fn checked(addr: u64, length: u32, lkey: u32) -> Sge<'a> {
        Sge {
            addr,
            length,
            lkey,
            origin: SgeOrigin::Mr,
            _memory: PhantomData,
        }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.length
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Whether this entry came from [`Sge::inline`] and so is only valid
    /// with [`SendFlags::INLINE`].
    pub fn is_inline_only(&self) -> bool {
        self.origin == SgeOrigin::Inline
    }

    /// Where the entry came from.
    pub fn origin(&self) -> SgeOrigin {
        self.origin
    }

    /// Appends the entry's bytes to `dst` by reading its address directly,
    /// for inline sends. Returns `false` (appending nothing) for an entry
    /// made by [`Mr::sge`], whose bytes a backend reads through the MR.
    pub fn append_direct(&self, dst: &mut Vec<u8>) -> bool {
        match self.origin {
            SgeOrigin::Mr => false,
            SgeOrigin::Inline | SgeOrigin::Raw => {
                // SAFETY: an Inline entry was made from a `&'a [u8]` that is
                // still borrowed (the entry's lifetime); a Raw entry's
                // creator promised, in `Sge::from_raw`, that the range is
                // readable while it is posted as inline data.
                unsafe { super::memory::append_from_ptr(self.addr as *const u8, self.length as usize, dst) };
                true
            }
        }
    }
}

/// Sum of the lengths of a scatter/gather list, or `None` on overflow of
/// the 32-bit message length.
pub fn sgl_len(sgl: &[Sge<'_>]) -> Option<u32> {
    sgl.iter().try_fold(0u32, |acc, s| acc.checked_add(s.length))
}

/// A remote memory target: virtual address and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Remote virtual address (or offset, for zero-based MRs).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// What a memory-window bind grants (`struct ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy)]
pub struct MwBindInfo<'a> {
    /// The MR the window is bound onto (needs [`AccessFlags::MW_BIND`]).
    pub mr: &'a Mr,
    /// Start of the window.
    pub addr: u64,
    /// Length of the window; 0 unbinds a type 1 window.
    pub length: u64,
    /// Remote rights the window grants.
    pub access: AccessFlags,
}

/// The operation of a send-queue work request and its operation-specific
/// fields (`enum ibv_wr_opcode` with the `wr` union).
#[derive(Debug, Clone, Copy)]
pub enum SendOp<'a> {
    /// Send.
    Send,
    /// Send with immediate data (host-order value; big-endian on the wire).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// Send that invalidates `rkey` at the responder.
    SendWithInv {
        /// The remote key to invalidate.
        rkey: u32,
    },
    /// RDMA write.
    Write {
        /// Where to write.
        remote: RemoteAddr,
    },
    /// RDMA write with immediate data; consumes a receive at the responder.
    WriteWithImm {
        /// Where to write.
        remote: RemoteAddr,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA read into the local scatter list.
    Read {
        /// Where to read from.
        remote: RemoteAddr,
    },
    /// 64-bit atomic compare and swap; the original value lands in the single
    /// 8-byte local SGE.
    CompareSwap {
        /// 8-byte aligned remote target.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// Value stored if equal.
        swap: u64,
    },
    /// 64-bit atomic fetch and add; the original value lands in the single
    /// 8-byte local SGE.
    FetchAdd {
        /// 8-byte aligned remote target.
        remote: RemoteAddr,
        /// Value added.
        add: u64,
    },
    /// Invalidate a local MR or memory window key (always fenced).
    LocalInv {
        /// The lkey/rkey to invalidate.
        key: u32,
    },
    /// Fast registration: make a fast-registration MR valid with a new key
    /// byte and access (kernel `IB_WR_REG_MR`).
    RegMr {
        /// The MR, previously mapped with [`Mr::map_pages`].
        mr: &'a Mr,
        /// The new key (only the low 8 bits may differ from the MR's).
        key: u32,
        /// The access the registration grants.
        access: AccessFlags,
    },
    /// Bind a type 2 memory window.
    BindMw {
        /// The window.
        mw: &'a Mw,
        /// The new rkey (only the low 8 bits may differ from the window's).
        rkey: u32,
        /// What to bind.
        bind: MwBindInfo<'a>,
    },
}

impl SendOp<'_> {
    /// The completion opcode a successful WR of this kind reports.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::RegMr { .. } => WcOpcode::RegMr,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }

    /// Whether the opcode is legal on a QP of type `ty` (IBTA C10-?: UD
    /// carries sends only; UC has no reads or atomics).
    pub fn is_valid_for(&self, ty: QpType) -> bool {
        match ty {
            QpType::Rc => true,
            QpType::Uc => !matches!(
                self,
                SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
            ),
            QpType::Ud => matches!(self, SendOp::Send | SendOp::SendWithImm { .. }),
        }
    }

    /// Whether the operation is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Whether the operation is a local memory operation (no wire traffic).
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            SendOp::LocalInv { .. } | SendOp::RegMr { .. } | SendOp::BindMw { .. }
        )
    }
}

/// Destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle.
    pub ah: &'a Ah,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (if its high bit is set, the QP's own Q_Key is used).
    pub remote_qkey: u32,
}

/// A send-queue work request (`struct ibv_send_wr`).
///
/// ```
/// # use softverbs::verbs::{SendWr, SendOp, SendFlags, Sge};
/// let data = [1u8, 2, 3];
/// let sgl = [Sge::inline(&data)];
/// let wr = SendWr::new(7, SendOp::Send, &sgl).flags(SendFlags::SIGNALED | SendFlags::INLINE);
/// assert_eq!(wr.wr_id, 7);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// User's id, returned in the completion.
    pub wr_id: u64,
    /// Operation and its fields.
    pub op: SendOp<'a>,
    /// Local scatter/gather list.
    pub sg_list: &'a [Sge<'a>],
    /// Flags.
    pub send_flags: SendFlags,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendWr<'a> {
    /// A work request with no flags.
    pub fn new(wr_id: u64, op: SendOp<'a>, sg_list: &'a [Sge<'a>]) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            send_flags: SendFlags::empty(),
            ud: None,
        }
    }

    /// With these flags.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.send_flags = flags;
        self
    }

    /// With a UD destination.
    pub fn ud(mut self, ah: &'a Ah, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        });
        self
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// User's id, returned in the completion.
    pub wr_id: u64,
    /// Where incoming data is scattered.
    pub sg_list: &'a [Sge<'a>],
}

impl<'a> RecvWr<'a> {
    /// A receive work request.
    pub fn new(wr_id: u64, sg_list: &'a [Sge<'a>]) -> Self {
        RecvWr { wr_id, sg_list }
    }
}

/// A work completion (`struct ibv_wc`).
///
/// For an error status only `wr_id`, `status`, `qp_num` and `vendor_err` are
/// defined (the rest are left as the backend wrote them).
///
/// # `vendor_err` of the soft provider
///
/// Send-queue errors name the check that failed; every other completion
/// (successes, flushes, receive-side errors) has 0. The hardware backend
/// passes the device's own syndrome through (see its vendor's manual).
///
/// | `vendor_err` | statuses | what happened |
/// |-------------:|----------|---------------|
/// | 0 | any | no code: success, a flushed WR (`WrFlushErr`), or an error found on the receive side |
/// | `0x51` (81) | `LocProtErr`, `LocQpOpErr` | a local key check failed: an SGE's lkey, range or rights, or a READ/atomic response that does not fit the local buffer |
/// | `0x53` (83) | `RemAccessErr`, `RemInvReqErr`, `RemOpErr`, `RemInvRdReqErr`, `BadRespErr` | the responder NAKed the request (`RemAccessErr`: its rkey, range or the QP's or MR's remote rights refused it; connect with remote access, e.g. [`Connect`](super::Connect)'s defaults), or its response was malformed or of the wrong size |
/// | `0x54` (84) | `RetryExcErr` | no ACK after `retry_cnt` retransmissions (the peer is gone or unreachable) |
/// | `0x55` (85) | `RnrRetryExcErr` | the responder had no receive posted through `rnr_retry` RNR NAKs |
/// | `0x56` (86) | `MwBindErr`, `LocQpOpErr` | a memory operation (REG_MR, LOCAL_INV, BIND_MW) failed its checks |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (defined for successful completions).
    pub opcode: WcOpcode,
    /// Vendor syndrome (backend specific; the soft provider's codes are in
    /// the table above).
    pub vendor_err: u32,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data (host-order value) if `wc_flags` has `WITH_IMM`, or
    /// the invalidated rkey if it has `WITH_INV`.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD/GSI).
    pub pkey_index: u16,
    /// Source LID (unused on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

impl Default for WorkCompletion {
    /// An empty slot to poll into: status [`WcStatus::GeneralErr`], so an
    /// entry that no poll filled never reads as a success.
    fn default() -> Self {
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::GeneralErr,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
}

impl WorkCompletion {
    /// Immediate data, if the completion carries some.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags.contains(WcFlags::WITH_IMM).then_some(self.imm_data)
    }

    /// The rkey a send-with-invalidate invalidated, if any.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.wc_flags.contains(WcFlags::WITH_INV).then_some(self.imm_data)
    }

    /// Whether the status is success.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfilled_completion_is_not_a_success() {
        let wc = WorkCompletion::default();
        assert!(!wc.is_success());
        assert_eq!(wc.status, WcStatus::GeneralErr);
    }
}
